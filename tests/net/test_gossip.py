"""The membership driver on a real event loop over the in-memory transport: members join through a
seed and learn each other, a crashed one is declared dead by all, and bad frames are dropped."""

from __future__ import annotations

import asyncio
import random

import pytest

from frenzyd.net.gossip import GossipDriver
from frenzyd.net.membership import ALIVE, DEAD, Membership, Params
from frenzyd.net.memnet import MemoryNet
from frenzyd.net.messages import MemberEntry

FAST = Params(period_s=0.1, ack_timeout_s=0.04, suspicion_min_s=0.4, suspicion_mult=1.0)


def _pool(n: int, net: MemoryNet, changed: asyncio.Event) -> list[GossipDriver]:
    loop = asyncio.get_running_loop()
    drivers = []
    for i in range(n):
        me = MemberEntry(f"{i:032x}", f"ws-{i}", f"10.0.0.{i + 1}:7470", 0, 1, ALIVE, 0)
        d = GossipDriver(Membership(me, FAST, rng=random.Random(i)), net.sender(me.node_id),
                         on_changes=lambda _c: changed.set(), clock=loop.time)
        net.attach(me.address, me.node_id, d.deliver_frame)
        drivers.append(d)
    return drivers


async def _until(pred: object, changed: asyncio.Event, within_s: float) -> bool:
    assert callable(pred)
    async with asyncio.timeout(within_s):
        while not pred():
            changed.clear()
            await changed.wait()
    return True


async def test_members_join_through_a_seed_and_a_crash_is_known_by_all() -> None:
    changed = asyncio.Event()
    net = MemoryNet(delay_s=0.002, loss=0.0)
    drivers = _pool(6, net, changed)
    for d in drivers:
        d.start(["10.0.0.1:7470"])

    def formed() -> bool:
        return all(len(d.core.live()) == 5 for d in drivers)

    assert await _until(formed, changed, 10.0)
    assert all(d.sent["swim.ping"] > 0 for d in drivers)
    victim = drivers[3]
    victim.stop(leave=False)
    net.detach(victim.core.me.address)

    def dead_for_all() -> bool:
        return all((e := d.core.get(victim.core.me.node_id)) is not None and e.state >= DEAD
                   for d in drivers if d is not victim)

    assert await _until(dead_for_all, changed, 10.0)
    for d in drivers:
        d.stop()


async def test_a_bad_frame_is_counted_and_dropped() -> None:
    changed = asyncio.Event()
    net = MemoryNet(delay_s=0.0, loss=0.0)
    (d,) = _pool(1, net, changed)
    d.start()
    d.deliver_frame("a" * 32, b"\x00garbage")
    d.deliver_frame("a" * 32, b"")
    assert sum(d.dropped.values()) == 2
    assert d.core.live() == []
    d.stop()


def test_memnet_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="loss"):
        MemoryNet(loss=1.0)
