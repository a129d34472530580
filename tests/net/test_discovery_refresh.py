"""mDNS discovery when a node is alone: it announces itself again and browses afresh, so a service
whose announcement it missed (or that missed its own) is reported again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from frenzyd.config import Config, config_from_dict
from frenzyd.net import auth
from frenzyd.net.discovery import Discovery


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, auth.Credentials]:
    d = tmp_path_factory.mktemp("pool")
    auth.create_pool(d / "lab")
    return {n: auth.load_credentials(auth.add_node(d / "lab", n).out_dir) for n in ("n1", "n2")}


def mdns_config(tmp_path: Path, c: auth.Credentials) -> Config:
    return config_from_dict({
        "node": {"name": c.node_name, "data_dir": str(tmp_path / c.node_name)},
        "network": {"listen": "127.0.0.1:0", "mdns": True, "interfaces": ["127.0.0.1"]},
        "pool": {"credentials": str(c.node_cert.parent)},
    }, {}, base=tmp_path)


async def _until(pred: object, within: float) -> bool:
    assert callable(pred)
    for _ in range(int(within / 0.05)):
        if pred():
            return True
        await asyncio.sleep(0.05)
    return bool(pred())


async def test_a_refresh_reports_a_service_again(tmp_path: Path, creds: dict[str, auth.Credentials]) -> None:
    found: list[str] = []
    d1 = Discovery(mdns_config(tmp_path, creds["n1"]), creds["n1"], 7101,
                   lambda addr, hints: found.append(hints["id"]), lonely=lambda: True)
    d2 = Discovery(mdns_config(tmp_path, creds["n2"]), creds["n2"], 7102, lambda addr, hints: None)
    await d1.start()
    await d2.start()
    try:
        n2 = creds["n2"].node_id
        assert await _until(lambda: n2 in found, 15.0)
        await asyncio.sleep(0.5)  # later announcements of n2 are the same service: not reported again
        seen = found.count(n2)
        await d1.refresh()
        assert d1.refreshes == 1
        assert await _until(lambda: found.count(n2) > seen, 15.0)  # the fresh browse found it again
    finally:
        await d1.stop()
        await d2.stop()
