"""SWIM on the peer network (``membership_net``, the membership parts of ``heartbeats``): joins of
mDNS-found addresses are delayed and dropped when gossip brings the member, heartbeats skip the
addresses of known members, and a heartbeat that finds nothing listening suspects the member."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from frenzyd.config import Config, config_from_dict
from frenzyd.errors import PeerError
from frenzyd.net import auth, wire
from frenzyd.net.election import ElectionState
from frenzyd.net.membership import ALIVE
from frenzyd.net.membership_net import JOIN_DELAY_PERIODS
from frenzyd.net.messages import HeartbeatReport, MemberEntry, PeerSummary, PoolView, SwimSync, pool_page
from frenzyd.net.network import PeerNetwork
from frenzyd.net.transport import Transport

Make = Callable[..., "asyncio.Future[PeerNetwork]"]


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, auth.Credentials]:
    d = tmp_path_factory.mktemp("pool")
    auth.create_pool(d / "lab")
    return {n: auth.load_credentials(auth.add_node(d / "lab", n).out_dir) for n in ("n1", "n2", "n3")}


def swim_config(tmp_path: Path, c: auth.Credentials, priority: int = 0) -> Config:
    return config_from_dict({
        "node": {"name": c.node_name, "data_dir": str(tmp_path / c.node_name), "priority": priority},
        "network": {"listen": "127.0.0.1:0", "mdns": False, "membership": "swim"},
        "pool": {"credentials": str(c.node_cert.parent)},
        "timing": {"heartbeat_s": 0.1, "peer_timeout_s": 0.6, "election_grace_s": 0.4,
                   "request_timeout_s": 2.0},
    }, {}, base=tmp_path)


@pytest.fixture
async def make(tmp_path: Path, creds: dict[str, auth.Credentials]) -> AsyncIterator[Any]:
    nets: list[PeerNetwork] = []

    async def make(name: str, priority: int = 0, *, start: bool = True) -> PeerNetwork:
        cfg = swim_config(tmp_path, creds[name], priority)
        el = ElectionState(creds[name].node_id, priority, started_at=time.monotonic(),
                           grace_s=cfg.timing.election_grace_s)
        net = PeerNetwork(cfg, creds[name], el)
        if start:
            await net.start()
            nets.append(net)
        return net

    yield make
    for net in nets:
        await net.stop()


class _Failing(Transport):
    """The real transport whose every post fails with ``reason`` (as a dead or slow peer makes it)."""

    reason = "unreachable"

    async def post(self, address: str, frame: bytes, timeout_s: float,
                   max_reply: int) -> tuple[str, wire.Message]:
        raise PeerError(self.reason, f"{address}: test")


@pytest.mark.parametrize(("reason", "told"), [("unreachable", True), ("refused", False), ("timeout", False)])
async def test_a_heartbeat_that_finds_nothing_listening_is_told_and_a_timeout_is_not(
    make: Make, creds: dict[str, auth.Credentials], reason: str, told: bool,
) -> None:
    net = await make("n1", start=False)
    failing = _Failing(net.config, net.creds, net.dispatch, net.table)
    failing.reason = reason
    hb = net.heartbeats
    hb.transport = failing
    heard: list[str] = []
    hb.unreachable_listeners.append(heard.append)
    hb.book.succeeded("10.0.0.9:7470", creds["n2"].node_id)  # a known member's address
    hb.book.add("10.0.0.8:7470", "mdns")  # an address no heartbeat has answered
    await hb._beat("10.0.0.9:7470", b"frame")
    await hb._beat("10.0.0.8:7470", b"frame")
    assert heard == ([creds["n2"].node_id] if told else [])


async def test_heartbeats_skip_addresses_where_the_membership_knows_a_member(make: Make) -> None:
    net = await make("n1", start=False)
    hb = net.heartbeats
    assert hb.targets is not None  # swim: heartbeats only where needed
    now = time.monotonic()
    for node, addr in (("a" * 32, "10.0.0.5:7470"), ("b" * 32, "10.0.0.6:7470")):
        net.table.member(node, name=node[:2], address=addr, priority=0, term=0, coordinator=None, live=True,
                         now=now)
        hb.book.add(addr, "mdns")
    hb.book.add("10.0.0.7:7470", "mdns")  # nobody known there yet
    hb.targets = lambda report: {"b" * 32}  # b is, say, the coordinator
    due = hb._due(HeartbeatReport(python="3.11"))
    assert sorted(due) == ["10.0.0.6:7470", "10.0.0.7:7470"]


async def test_a_found_address_is_joined_later_and_not_at_all_when_gossip_brings_its_member(
    make: Make, creds: dict[str, auth.Credentials],
) -> None:
    n1 = await make("n1")
    n2 = await make("n2")
    n2.add_address(n1.address, source="static")  # n2 knows no member yet: joins through n1 at once
    assert n1.members is not None
    assert n1.members.driver is not None
    d1 = n1.members.driver
    assert await n1.wait_until(lambda: d1.core.is_live(creds["n2"].node_id), 10.0)
    synced: list[str] = []
    send = d1._send

    def spy(address: str, node_id: str | None, frame: bytes) -> None:  # n1's joins, then sends them
        msg = wire.parse(wire.decode(frame, max_bytes=1 << 20))
        if isinstance(msg, SwimSync) and msg.reply:  # (a reply answers n2's own syncs)
            synced.append(address)
        send(address, node_id, frame)

    d1._send = spy
    n1.members.found(n2.address, {"id": creds["n2"].node_id})  # already a member: nothing to do
    n1.members.found("127.0.0.1:9", {"id": creds["n3"].node_id})  # n3 not known: joined, but later
    n1.members.found("127.0.0.1:10", {"id": "c" * 32})
    assert synced == []
    # Gossip brings "c" before the delay ends: its address is not joined.
    d1.core.merge(MemberEntry("c" * 32, "c", "127.0.0.1:10", 0, 1, ALIVE, 0), time.monotonic())
    await asyncio.sleep(JOIN_DELAY_PERIODS[1] * n1.members.params.period_s + 0.3)
    assert "127.0.0.1:9" in synced
    assert "127.0.0.1:10" not in synced
    assert n2.address not in synced


def _gpu(uuid: str) -> dict[str, Any]:
    return {"uuid": uuid, "type": "T4", "memory_bytes": 16 << 30, "free_bytes": 15 << 30, "simulated": True,
            "leased_to": None}


async def test_a_member_gets_the_other_members_gpus_from_the_coordinators_view(
    tmp_path: Path, creds: dict[str, auth.Credentials],
) -> None:
    """Under swim a member hears full reports only from the coordinator (and its jobs' peers); its status
    asks the coordinator for the rest, in pages, at most once per ``max_age_s``."""
    nets: dict[str, PeerNetwork] = {}
    try:
        for name, prio in (("n1", 5), ("n2", 0), ("n3", 0)):
            cfg = swim_config(tmp_path, creds[name], prio)
            el = ElectionState(creds[name].node_id, prio, started_at=time.monotonic(),
                               grace_s=cfg.timing.election_grace_s)
            nets[name] = PeerNetwork(cfg, creds[name], el,
                                     report_provider=lambda n=name: {"gpus": [_gpu(f"GPU-{n}")]})
            await nets[name].start()
        for name in ("n2", "n3"):
            nets[name].add_address(nets["n1"].address, source="static")
        n1, n2 = nets["n1"], nets["n2"]
        id1, id3 = creds["n1"].node_id, creds["n3"].node_id
        assert await n2.wait_until(lambda: n2.election.coordinator == id1, 15.0)
        assert await n1.wait_until(lambda: bool((r := n1.table.get(id3)) and r.report.gpus), 15.0)
        assert n2.members is not None
        # swim: n3's heartbeats go to the coordinator only (n2 may have heard one while the election
        # was still open, so wait for what it heard directly to go stale).
        assert await n2.wait_until(lambda: bool((r := n2.table.get(id3)) and r.member and
                                                time.monotonic() - r.last_seen >= n2.table.timeout_s), 10.0)

        await n2.members.refresh_pool_view(max_age_s=60.0, wait_s=5.0)
        got = n2.members.pool_view
        assert creds["n2"].node_id not in got, "the asker is left out"
        assert [g["uuid"] for g in got[id3].report.gpus or ()] == ["GPU-n3"]
        assert got[id3].alive
        assert got[id3].name == "n3"
        asked = n1.counters.received[PoolView.KIND]
        await n2.members.refresh_pool_view(max_age_s=60.0, wait_s=5.0)  # fresh enough: not asked again
        assert n1.counters.received[PoolView.KIND] == asked
    finally:
        for net in nets.values():
            await net.stop()


def test_pool_pages_fill_to_the_budget_and_a_peer_too_large_goes_without_gpus() -> None:
    peers = [PeerSummary.of(f"{i:064x}", f"ws-{i}", f"10.0.0.{i}:7470", True,
                            {"python": "3.11.7", "gpus": [_gpu(f"GPU-{i}-{k}") for k in range(4)],
                             "leases": [{}]})
             for i in range(10)]
    assert "leases" not in peers[0].report.to_dict(), "only what the status shows travels"
    one = wire.packed_size(peers[0].to_wire())
    page = pool_page(peers, 0, budget=3 * one + 1)
    assert (page.offset, page.total, len(page.peers)) == (0, 10, 3)
    rest = pool_page(peers, 9, budget=3 * one + 1)
    assert [p.node_id for p in rest.peers] == [peers[9].node_id]
    small = pool_page(peers, 0, budget=one // 2)
    assert small.peers
    assert all(p.report.gpus is None and p.report.python == "3.11.7" for p in small.peers)
    assert sum(wire.packed_size(p.to_wire()) for p in small.peers) <= one // 2
    # A page survives its own wire: encoded, capped, decoded and checked.
    frame = wire.encode_message(page)
    assert wire.parse(wire.decode(frame, max_bytes=len(frame))) == page


@pytest.mark.parametrize("bad", [
    [["", "n", "a", True, {}]],  # empty node id
    [["a" * 64, "n", "a", "yes", {}]],  # alive not a bool
    [["a" * 64, "n", "a", True, {"gpus": [{"free_bytes": -1}]}]],  # a report the heartbeat would refuse
    [["a" * 64, "n", "a", True]],  # a field short
])
def test_a_malformed_pool_page_is_refused(bad: list[Any]) -> None:
    frame = wire.encode("pool.peers", {"offset": 0, "total": 1, "peers": bad})
    with pytest.raises(wire.FrameRejected) as err:
        wire.parse(wire.decode(frame, max_bytes=len(frame)))
    assert err.value.reason == "schema"
