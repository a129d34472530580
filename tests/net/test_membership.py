"""The SWIM membership core on a deterministic simulated pool (virtual time, the real wire codec):
joining, failure detection, refutation, the election view spreading, bounded fan-out and piggyback,
and the edge checks on what peers send."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from frenzyd.net import wire
from frenzyd.net.membership import ALIVE, DEAD, LEFT, SUSPECT, Membership, Params
from frenzyd.net.messages import MemberEntry, SwimAck, SwimPing, SwimSync
from tests.net.swim_sim import Sim, address, node_id


def formed(n: int, **kw: object) -> Sim:
    sim = Sim(n, **kw)  # type: ignore[arg-type]
    sim.start()
    sim.run_until(10.0)
    assert sim.knows_all_alive()
    return sim


def test_members_joining_through_one_seed_all_learn_each_other() -> None:
    sim = Sim(40, seeds=1)
    sim.start()
    sim.run_until(10.0)
    assert sim.knows_all_alive()
    assert sim.false_suspicions() == 0


def test_a_dead_member_is_known_dead_by_every_other_without_false_suspicions_at_one_percent_loss() -> None:
    sim = formed(60, loss=0.01, seeds=3, seed=4)
    sim.kill(17)
    t0 = sim.now
    sim.run_until(t0 + 20.0)
    assert sim.all_know_dead(17)
    known = sim.first_dead[node_id(17)]
    assert len(known) == 59
    assert max(known.values()) - t0 < 15.0
    assert sim.false_suspicions() == 0


def test_a_suspected_member_that_is_alive_refutes_with_a_higher_incarnation() -> None:
    sim = formed(10)
    target = sim.nodes[3].core
    before = target.me.incarnation
    # Member 5 wrongly suspects member 3 and gossips it.
    sim.nodes[5].core.merge(replace(target.me, state=SUSPECT), sim.now)
    sim.run_until(sim.now + 10.0)
    assert target.me.incarnation > before
    assert target.counters["refuted"] >= 1
    for x in sim.nodes:
        if x.index != 3:
            e = x.core.get(node_id(3))
            assert e is not None
            assert e.state == ALIVE


def test_a_restarted_member_with_a_higher_incarnation_is_alive_again() -> None:
    sim = formed(12)
    sim.kill(4)
    sim.run_until(sim.now + 20.0)
    assert sim.all_know_dead(4)
    sim.add(4, incarnation=50)
    sim.start([4])
    sim.run_until(sim.now + 10.0)
    assert sim.knows_all_alive()


def test_a_member_whose_probes_go_unanswered_slows_its_own_probes_then_recovers() -> None:
    sim = formed(8)
    node = sim.nodes[2]
    sim.deaf.add(2)  # it still sends, but hears nothing: its own probes all fail
    sent = node.sent
    sim.run_until(sim.now + 6.0)
    assert node.core.health >= 3  # Lifeguard: timeouts and period stretched by 1 + health
    assert node.sent - sent < 6.0 / node.core.params.period_s * 2  # fewer probes than a healthy member
    sim.deaf.clear()
    sim.run_until(sim.now + 40.0)
    assert node.core.health == 0
    assert sim.knows_all_alive()  # it refuted the death others declared


def test_a_graceful_leave_reaches_every_member() -> None:
    sim = formed(20)
    node = sim.nodes[6]
    sim._send(node, node.core.leave())
    sim.run_until(sim.now + 0.5)
    sim.kill(6)
    sim.run_until(sim.now + 5.0)
    for x in sim.nodes:
        if x.index != 6:
            e = x.core.get(node_id(6))
            assert e is not None
            assert e.state == LEFT


def test_the_election_view_spreads_to_every_member() -> None:
    sim = formed(30)
    assert sim.nodes[2].core.set_view(term=7, coordinator=node_id(2))
    assert not sim.nodes[2].core.set_view(term=7, coordinator=node_id(2))
    sim.run_until(sim.now + 6.0)
    for x in sim.nodes:
        e = x.core.get(node_id(2))
        assert e is not None
        assert (e.term, e.coordinator) == (7, node_id(2))


def test_per_member_messages_do_not_grow_with_the_pool_and_piggyback_is_bounded() -> None:
    rates = {}
    for n in (10, 80):
        sim = formed(n, seed=n)
        sent0 = sum(x.sent for x in sim.nodes)
        t0 = sim.now
        sim.run_until(t0 + 20.0)
        rates[n] = (sum(x.sent for x in sim.nodes) - sent0) / n / 20.0
        assert max(x.max_updates for x in sim.nodes) <= sim.params.max_piggyback
    # One probe per period each (a ping and its ack), plus rare ping-reqs and syncs.
    assert rates[80] < 1.5 * rates[10]
    assert rates[10] < 3 / Params().period_s


def test_a_message_whose_source_is_not_its_sender_is_dropped() -> None:
    a = Membership(MemberEntry(node_id(1), "a", address(1), 0, 1, ALIVE, 0), rng=random.Random(1))
    b = MemberEntry(node_id(2), "b", address(2), 0, 1, ALIVE, 0)
    assert a.receive(node_id(3), SwimPing(1, b), 0.0) == []
    assert a.dropped["identity_mismatch"] == 1
    assert a.get(node_id(2)) is None
    out = a.receive(node_id(2), SwimPing(1, b), 0.0)
    assert [type(o.message) for o in out] == [SwimAck]
    assert a.is_live(node_id(2))


def test_stale_news_never_overrides_newer_and_unknown_dead_are_not_stored() -> None:
    a = Membership(MemberEntry(node_id(1), "a", address(1), 0, 1, ALIVE, 0), rng=random.Random(1))
    b = MemberEntry(node_id(2), "b", address(2), 0, 5, ALIVE, 0)
    assert not a.merge(replace(b, state=DEAD), 0.0)
    assert a.merge(b, 0.0)
    assert not a.merge(replace(b, incarnation=4, state=DEAD), 0.0)
    assert a.merge(replace(b, state=SUSPECT), 0.0)
    assert not a.merge(b, 0.0)  # alive at the same incarnation does not clear a suspicion
    assert a.merge(replace(b, incarnation=6), 0.0)
    assert a.get(node_id(2)) == replace(b, incarnation=6)


def test_a_sync_is_answered_with_the_full_list() -> None:
    a = Membership(MemberEntry(node_id(1), "a", address(1), 0, 1, ALIVE, 0), rng=random.Random(1))
    for i in range(3, 8):
        a.merge(MemberEntry(node_id(i), f"n{i}", address(i), 0, 1, ALIVE, 0), 0.0)
    b = MemberEntry(node_id(2), "b", address(2), 0, 1, ALIVE, 0)
    (out,) = a.receive(node_id(2), SwimSync(b, (b,), True), 0.0)
    assert isinstance(out.message, SwimSync)
    assert not out.message.reply
    assert {e.node_id for e in out.message.entries} == {node_id(i) for i in (1, 2, *range(3, 8))}


@pytest.mark.parametrize(
    "entry",
    [
        "x",
        ["a" * 32, "n", "h:1", 0, 1, 9, 0, None],  # state out of range
        ["a" * 32, "n", "h:1", 0, -1, 0, 0, None],  # negative incarnation
        ["", "n", "h:1", 0, 1, 0, 0, None],  # no node id
        ["a" * 32, "n" * 300, "h:1", 0, 1, 0, 0, None],  # name too long
        ["a" * 32, "n", "h:1", True, 1, 0, 0, None],  # a bool is not a priority
        ["a" * 32, "n", "h:1", 0, 1, 0, 0],  # too short
    ],
)
def test_malformed_entries_are_refused_at_the_edge(entry: object) -> None:
    src = MemberEntry(node_id(1), "a", address(1), 0, 1, ALIVE, 0).to_wire()
    frame = wire.encode("swim.ping", {"seq": 1, "src": src, "updates": [entry]})
    with pytest.raises(wire.FrameRejected) as err:
        wire.parse(wire.decode(frame))
    assert err.value.reason == "schema"


def test_too_many_updates_are_refused() -> None:
    src = MemberEntry(node_id(1), "a", address(1), 0, 1, ALIVE, 0).to_wire()
    frame = wire.encode("swim.ping", {"seq": 1, "src": src, "updates": [src] * 65})
    with pytest.raises(wire.FrameRejected):
        wire.parse(wire.decode(frame))


def test_params_are_checked() -> None:
    with pytest.raises(ValueError, match="ack_timeout_s"):
        Params(period_s=0.5, ack_timeout_s=0.6)
