"""mDNS under a flood of forged announcements (issue 16): a host on the LAN announces hundreds of
services with forged pool ids; the discovery table never tracks them, and a new member announced
after the flood is still found.  Real AsyncZeroconf on 127.0.0.1; the flood is real mDNS packets."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from zeroconf import DNSOutgoing, IPVersion, ServiceInfo
from zeroconf.asyncio import AsyncZeroconf
from zeroconf.const import _FLAGS_AA, _FLAGS_QR_RESPONSE

from frenzyd.net import auth
from frenzyd.net.discovery import SERVICE_TYPE, Discovery

from .conftest import fast_config


def _forged(i: int) -> ServiceInfo:
    return ServiceInfo(
        SERVICE_TYPE,
        f"forged-{i}-{os.getpid()}.{SERVICE_TYPE}",
        port=7000 + i % 1000,
        properties={"id": os.urandom(16).hex(), "pool": os.urandom(32).hex(), "api": "7470", "proto": "2"},
        addresses=[socket.inet_aton("127.0.0.1")],
        server=f"forged-{i}.local.",
    )


async def _flood(zc: AsyncZeroconf, n: int) -> None:
    """Send ``n`` forged services' records (PTR, SRV, TXT, A), a few per packet."""
    for start in range(0, n, 4):
        out = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
        for i in range(start, min(n, start + 4)):
            info = _forged(i)
            for rec in (info.dns_pointer(), info.dns_service(), info.dns_text(), *info.dns_addresses()):
                out.add_answer_at_time(rec, 0)
        zc.zeroconf.async_send(out)
        await asyncio.sleep(0.005)  # paced: loopback multicast drops packets sent back to back


@pytest.mark.timeout(120)
async def test_a_flood_of_forged_pool_ids_does_not_hide_a_new_member(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1, n2 = pool_creds["n1"], pool_creds["n2"]
    found: list[tuple[str, dict[str, str]]] = []
    seen_n2 = asyncio.Event()

    def on_found(address: str, hints: dict[str, str]) -> None:
        found.append((address, hints))
        if hints["id"] == n2.node_id:
            seen_n2.set()

    cfg1 = fast_config(tmp_path, n1, interfaces=["127.0.0.1"], mdns=True, mdns_max_entries=64)
    d1 = Discovery(cfg1, n1, 7001, on_found)
    await d1.start()
    flooder = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    cfg2 = fast_config(tmp_path, n2, interfaces=["127.0.0.1"], mdns=True)
    d2 = Discovery(cfg2, n2, 7002, lambda a, h: None)
    try:
        await _flood(flooder, 800)  # more than the 512 entries the table used to hold, forever

        async def settle() -> None:  # most announcements handled (loopback multicast loses a few)
            while sum(d1.dropped.values()) + len(found) < 700:  # noqa: ASYNC110 (counters: no event)
                await asyncio.sleep(0.05)

        await asyncio.wait_for(settle(), 60)
        await d2.start()  # a new member announces itself after the flood
        await asyncio.wait_for(seen_n2.wait(), 30)
        assert [h["id"] for _, h in found] == [n2.node_id]  # forged pools were never passed on
        assert d1.tracked == 1  # ...nor remembered
        assert d1.dropped["other_pool"] >= 700
    finally:
        await d2.stop()
        await d1.stop()
        await flooder.async_close()


def test_the_table_keeps_only_this_pool_is_capped_and_expires(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = pool_creds["n1"]
    now = [1000.0]
    calls: list[str] = []
    cfg = fast_config(tmp_path, n1, mdns_max_entries=8, mdns_entry_ttl_s=60.0)
    d = Discovery(cfg, n1, 7001, lambda address, hints: calls.append(hints["id"]), clock=lambda: now[0])

    def member(i: int) -> ServiceInfo:
        return ServiceInfo(SERVICE_TYPE, f"m{i}.{SERVICE_TYPE}", port=7100 + i,
                           addresses=[socket.inet_aton("127.0.0.1")],
                           properties={"id": f"{i:032x}", "pool": n1.pool_id, "api": str(7100 + i)})

    for i in range(2000):
        d._take(f"f{i}.{SERVICE_TYPE}", _forged(i))
    assert d.tracked == 0
    assert d.dropped["other_pool"] == 2000
    for i in range(10):
        d._take(f"m{i}.{SERVICE_TYPE}", member(i))
    assert d.tracked == 8
    assert d.dropped["evicted"] == 2
    assert len(calls) == 10
    d._take(f"m9.{SERVICE_TYPE}", member(9))  # a repeat announcement: nothing new
    assert len(calls) == 10
    now[0] += 61.0
    d._take(f"m9.{SERVICE_TYPE}", member(9))  # the old entries expired; this one is news again
    assert d.tracked == 1
    assert len(calls) == 11
