"""mDNS discovery with real AsyncZeroconf on 127.0.0.1: peers announce and find each other, malformed
announcements are dropped, and discovery alone builds the mesh (liveness still from heartbeats)."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from frenzyd.net import auth, wire
from frenzyd.net.discovery import SERVICE_TYPE, Discovery, parse_hints, txt_hints
from frenzyd.net.election import ElectionState, Role
from frenzyd.net.network import PeerNetwork

from .conftest import fast_config


def test_txt_hints_are_small_and_parse_back(pool_creds: dict[str, auth.Credentials]) -> None:
    hints = txt_hints(pool_creds["n1"], 7470)
    assert all(len(f"{k}={v}") < 255 for k, v in hints.items())
    raw = {k.encode(): v.encode() for k, v in hints.items()}
    assert parse_hints(raw) == hints
    for bad in (
        {**raw, b"id": b"zz"},
        {**raw, b"pool": b"12"},
        {**raw, b"api": b"99999"},
        {**raw, b"api": None},
        {**raw, b"id": "é".encode()},
    ):
        with pytest.raises(ValueError, match=r"ASCII|node id|pool id|api port"):
            parse_hints(bad)


async def _wait(cond: asyncio.Event, within: float) -> bool:
    try:
        await asyncio.wait_for(cond.wait(), within)
    except TimeoutError:
        return False
    return True


async def test_two_nodes_find_each_other_and_garbage_is_dropped(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1, n2 = pool_creds["n1"], pool_creds["n2"]
    found: dict[str, list[tuple[str, dict[str, str]]]] = {"n1": [], "n2": []}
    events = {"n1": asyncio.Event(), "n2": asyncio.Event()}
    want = {"n1": n2.node_id, "n2": n1.node_id}

    def on_found(who: str):
        def cb(address: str, hints: dict[str, str]) -> None:
            found[who].append((address, hints))
            if hints["id"] == want[who]:
                events[who].set()

        return cb

    d1 = Discovery(fast_config(tmp_path, n1, interfaces=["127.0.0.1"], mdns=True), n1, 7001, on_found("n1"))
    d2 = Discovery(fast_config(tmp_path, n2, interfaces=["127.0.0.1"], mdns=True), n2, 7002, on_found("n2"))
    # A malformed announcement from a third party on the same network.
    junk = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    junk_info = AsyncServiceInfo(
        SERVICE_TYPE,
        f"junk-{time.time_ns()}.{SERVICE_TYPE}",
        port=1,
        properties={"id": "not-hex", "pool": "x"},
        addresses=[socket.inet_aton("127.0.0.1")],
    )
    await junk.async_register_service(junk_info)
    await d1.start()
    await d2.start()
    try:
        assert await _wait(events["n1"], 15.0)
        assert await _wait(events["n2"], 15.0)
        addr, hints = next(f for f in found["n1"] if f[1]["id"] == n2.node_id)
        assert addr == "127.0.0.1:7002"
        proto = str(wire.PROTOCOL_VERSION)
        assert hints == {"id": n2.node_id, "pool": n2.pool_id, "api": "7002", "proto": proto}
        assert all(h["id"] != n1.node_id for _, h in found["n1"])  # never ourselves
        for _ in range(100):  # the junk lookup races the others; wait until it was dropped
            if d1.dropped["bad_txt"] >= 1:
                break
            await asyncio.sleep(0.05)
        assert d1.dropped["bad_txt"] >= 1
    finally:
        await d1.stop()
        await d2.stop()
        await junk.async_unregister_all_services()
        await junk.async_close()


async def test_mdns_alone_builds_the_mesh_and_elects(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    nets: list[PeerNetwork] = []
    discos: list[Discovery] = []
    try:
        for name in ("n1", "n2", "n3"):
            creds = pool_creds[name]
            cfg = fast_config(tmp_path, creds, interfaces=["127.0.0.1"], mdns=True)
            el = ElectionState(creds.node_id, 0, started_at=time.monotonic(), grace_s=1.0)
            net = PeerNetwork(cfg, creds, el)
            await net.start()
            assert net.port is not None
            d = Discovery(cfg, creds, net.port, net.add_address)
            await d.start()
            nets.append(net)
            discos.append(d)

        def meshed() -> bool:
            coords = {(n.election.coordinator, n.election.term) for n in nets}
            return (
                all(len(n.live_peers()) == 2 for n in nets)
                and len(coords) == 1
                and None not in {c for c, _ in coords}
            )

        assert await nets[0].wait_until(meshed, 20.0)
        assert sum(n.election.role is Role.COORDINATOR for n in nets) == 1
    finally:
        for d in discos:
            await d.stop()
        for n in nets:
            await n.stop()
