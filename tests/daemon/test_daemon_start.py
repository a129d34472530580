"""frenzyd's start-up path: taken ports are one clear line (no traceback), the web port is bound before
mDNS announces the node, and the node's GPUs carry the inventory's fields, ``offered`` and ``reason``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml as real
import pytest

from frenzyd.daemon import Daemon
from frenzyd.errors import ConfigError
from frenzyd.net import auth

from .conftest import fast_config
from .test_inventory_nvml import FakeGpu, Proc, fake_nvml

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A port something else is listening on (SO_REUSEADDR off on both sides: the bind must fail)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def write_config(tmp_path: Path, creds: auth.Credentials, *, listen: str, web: str) -> Path:
    path = tmp_path / "frenzyd.toml"
    path.write_text(
        "[node]\n"
        f'name = "{creds.node_name}"\ndata_dir = "{tmp_path / "data"}"\n'
        "[network]\n"
        f'listen = "{listen}"\nmdns = false\n'
        "[pool]\n"
        f'credentials = "{creds.node_cert.parent}"\n'
        "[client]\n"
        f'listen = "unix:{tmp_path / "client.sock"}"\n'
        "[web]\n"
        f'listen = "{web}"\n'
        '[[devices]]\ntype = "T4"\ncount = 1\n'
    )
    tomllib.loads(path.read_text())  # the test's own TOML is valid
    return path


def frenzyd(config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "frenzyd", "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def test_taken_peer_port_is_one_line(tmp_path: Path, pool_creds: dict[str, auth.Credentials]) -> None:
    with taken_port() as port:
        cfg = write_config(tmp_path, pool_creds["n1"], listen=f"127.0.0.1:{port}", web="127.0.0.1:0")
        res = frenzyd(cfg)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    (line,) = _error_lines(res.stderr)
    assert line.startswith("frenzyd: error: ")
    assert f"127.0.0.1:{port}" in line
    assert "[network] listen" in line


def test_taken_web_port_is_one_line(tmp_path: Path, pool_creds: dict[str, auth.Credentials]) -> None:
    with taken_port() as port:
        cfg = write_config(tmp_path, pool_creds["n1"], listen="127.0.0.1:0", web=f"127.0.0.1:{port}")
        res = frenzyd(cfg)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    (line,) = _error_lines(res.stderr)
    assert f"127.0.0.1:{port}" in line
    assert "[web] listen" in line


class RecordingDiscovery:
    """Stands in for ``frenzyd.net.discovery.Discovery`` (no multicast in unit tests); records starts."""

    started: list[str] = []  # noqa: RUF012 - shared by the instances of one test

    def __init__(self, config: Any, creds: Any, port: int, on_found: Any, *, lonely: Any = None) -> None:
        self.name = creds.node_name

    async def start(self) -> None:
        RecordingDiscovery.started.append(self.name)

    async def stop(self) -> None:
        pass


async def test_web_port_bound_before_mdns_announces(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials], monkeypatch: pytest.MonkeyPatch
) -> None:
    import frenzyd.net.discovery as discovery

    monkeypatch.setattr(discovery, "Discovery", RecordingDiscovery)
    RecordingDiscovery.started = []
    with taken_port() as port:
        cfg = fast_config(tmp_path, pool_creds["n1"], mdns=True)
        cfg = type(cfg)(**{**cfg.__dict__, "web": type(cfg.web)(type(cfg.web.listen)("127.0.0.1", port))})
        with pytest.raises(ConfigError, match=r"\[web\] listen"):
            await asyncio.wait_for(Daemon(cfg).run(asyncio.Event()), 30)
    assert RecordingDiscovery.started == []  # it never announced a node that then died
    # with a free web port it does announce
    cfg = fast_config(tmp_path, pool_creds["n1"], mdns=True)
    cfg = type(cfg)(**{**cfg.__dict__, "web": type(cfg.web)(type(cfg.web.listen)("127.0.0.1", 0))})
    d, stop = Daemon(cfg), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    await asyncio.wait_for(d.ready.wait(), 30)
    assert RecordingDiscovery.started == ["n1"]
    stop.set()
    await asyncio.wait_for(task, 30)


async def test_node_report_carries_inventory_fields_and_reasons(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workstation with a fake NVML: an idle GPU, a desktop-only GPU, a NOT_SUPPORTED one and one the
    owner trains on.  The report (what peers and the status JSON get) says which are offered and why."""
    ns = real.NVML_ERROR_NOT_SUPPORTED
    nv = fake_nvml([
        FakeGpu(uuid="GPU-idle"),
        FakeGpu(uuid="GPU-desk", used=300 << 20, graphics=[Proc(10, 300 << 20)]),
        FakeGpu(uuid="GPU-ns", compute=ns, graphics=ns),
        FakeGpu(uuid="GPU-owner", used=9 << 30, compute=[Proc(11, 9 << 30)]),
    ], names={10: "Xorg", 11: "python"})
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    d, stop = Daemon(fast_config(tmp_path, pool_creds["n2"])), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 30)
        gpus = {g["uuid"]: g for g in d._gpus()}
        assert {u: g["offered"] for u, g in gpus.items()} == {
            "GPU-idle": True, "GPU-desk": True, "GPU-ns": False, "GPU-owner": False}
        assert gpus["GPU-idle"]["reason"] is None
        assert "Not Supported" in gpus["GPU-ns"]["reason"]
        assert "python" in gpus["GPU-owner"]["reason"]
        assert gpus["GPU-desk"]["ignored_processes"] == ["Xorg"]
        for g in gpus.values():
            assert g["compute_capability"] == "8.6"
            assert g["driver_version"] == "550.54.14"
            assert g["cuda_driver_version"] == "12.4"
            assert g["simulated"] is False
        report = d._report()
        assert {g["uuid"]: g["offered"] for g in report["gpus"]} == {
            u: g["offered"] for u, g in gpus.items()}
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def test_an_unusable_data_dir_is_one_line(tmp_path: Path, pool_creds: dict[str, auth.Credentials]) -> None:
    cfg = write_config(tmp_path, pool_creds["n1"], listen="127.0.0.1:0", web="127.0.0.1:0")
    (tmp_path / "data").write_text("a file where the data directory should be\n")
    cfg.write_text(cfg.read_text().replace(f'data_dir = "{tmp_path / "data"}"',
                                           f'data_dir = "{tmp_path / "data" / "sub"}"'))
    res = frenzyd(cfg)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    (line,) = _error_lines(res.stderr)
    assert line.startswith("frenzyd: error: ")
    assert str(tmp_path / "data" / "sub") in line
