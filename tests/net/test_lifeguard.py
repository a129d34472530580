"""Lifeguard's suspicion timeout in the SWIM core: long for a suspicion nobody confirms, down to the
minimum as independent suspecters confirm it; confirmations counted once each, gossiped on, bounded."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from frenzyd.net import wire
from frenzyd.net.membership import ALIVE, DEAD, SUSPECT, Membership, Params, suspicion_bounds
from frenzyd.net.messages import MemberEntry, SwimPing
from tests.net.swim_sim import address, node_id

PARAMS = Params(period_s=0.5, ack_timeout_s=0.2, suspicion_min_s=2.0, suspicion_mult=3.0,
                suspicion_max_mult=6.0, suspicion_k=3)


def entry(i: int, state: int = ALIVE, incarnation: int = 1, by: int | None = None) -> MemberEntry:
    return MemberEntry(node_id(i), f"m{i}", address(i), 0, incarnation, state, 0, None,
                       None if by is None else node_id(by))


def core(n: int, params: Params = PARAMS) -> Membership:
    """Member 0's core, every other of the ``n`` members merged alive at time 0."""
    c = Membership(entry(0), params, rng=random.Random(1))
    for i in range(1, n):
        c.merge(entry(i), 0.0, gossip=False)
    return c


@pytest.mark.parametrize(("n", "k"), [
    (1000, 3),  # min = 3 x log10(1001) x 0.5 = 4.5 s, above the 2 s floor
    (40, 3),  # 2.4 s
    (8, 3),
    (6, 2),  # at most half of the n - 2 who could confirm
    (4, 1),
    (3, 0),  # the minimum at once
    (2, 0),
])
def test_bounds_scale_with_log_n_and_k_with_who_can_confirm(n: int, k: int) -> None:
    got_lo, got_hi, got_k = suspicion_bounds(PARAMS, n)
    want_lo = max(2.0, 3.0 * math.log10(n + 1) * 0.5)
    assert got_lo == pytest.approx(want_lo)
    assert got_hi == pytest.approx(6.0 * want_lo)
    assert got_k == k
    lows = [suspicion_bounds(PARAMS, m)[0] for m in (1000, 40, 4)]
    assert lows == sorted(lows, reverse=True)


def test_the_timeout_falls_from_max_to_min_as_confirmations_arrive() -> None:
    c = core(1000)
    lo, hi, _ = suspicion_bounds(PARAMS, 1000)
    steps = [c.suspicion_timeout(i) for i in range(5)]
    assert steps[0] == pytest.approx(hi)
    assert steps[0] > steps[1] > steps[2] > steps[3]
    assert steps[3] == pytest.approx(lo)
    assert steps[4] == pytest.approx(lo)
    # Lifeguard's formula: max - (max - min) * log(C + 1) / log(k + 1)
    assert steps[1] == pytest.approx(hi - (hi - lo) * math.log(2) / math.log(4))


def test_a_lone_suspicion_lasts_the_long_timeout() -> None:
    c = core(10)
    lo, hi, _ = suspicion_bounds(PARAMS, 10)
    c.merge(entry(4, SUSPECT, by=7), 0.0)
    assert c.suspicion_deadline(node_id(4)) == pytest.approx(hi)
    c.merge(entry(4, SUSPECT, by=7), 0.5)  # the same suspecter again: not a confirmation
    assert c.suspicion_deadline(node_id(4)) == pytest.approx(hi)
    c.tick(0.0)
    c.tick(lo + 0.1)
    e = c.get(node_id(4))
    assert e is not None
    assert e.state == SUSPECT  # the minimum alone would have declared it dead
    c.tick(hi + 0.01)
    e = c.get(node_id(4))
    assert e is not None
    assert e.state == DEAD


def test_independent_confirmations_bring_the_declaration_down_to_the_minimum() -> None:
    c = core(10)
    lo, _hi, _ = suspicion_bounds(PARAMS, 10)
    c.merge(entry(4, SUSPECT, by=7), 0.0)
    deadlines = [c.suspicion_deadline(node_id(4))]
    for by in (8, 9, 5):
        assert c.merge(entry(4, SUSPECT, by=by), 0.2)
        deadlines.append(c.suspicion_deadline(node_id(4)))
    assert deadlines == sorted(deadlines, reverse=True)
    assert deadlines[-1] == pytest.approx(lo)
    assert c.suspecters(node_id(4)) == {node_id(i) for i in (7, 8, 9, 5)}
    assert not c.merge(entry(4, SUSPECT, by=6), 0.3)  # k reached: neither counted nor gossiped on
    assert c.counters["confirmations"] == 3
    c.tick(0.0)
    c.tick(lo + 0.01)
    e = c.get(node_id(4))
    assert e is not None
    assert e.state == DEAD


def test_a_new_confirmation_is_gossiped_on_with_its_suspecter_and_a_repeat_is_not() -> None:
    c = core(10)
    c.merge(entry(4, SUSPECT, by=7), 0.0)
    c._queue.clear()  # what this test looks at: whether a confirmation re-enters the queue
    assert not c.merge(entry(4, SUSPECT, by=7), 0.1)
    assert c._piggyback() == ()
    assert c.merge(entry(4, SUSPECT, by=8), 0.1)
    (carried,) = c._piggyback()
    assert (carried.node_id, carried.state, carried.by) == (node_id(4), SUSPECT, node_id(8))


def test_a_refutation_ends_the_suspicion_and_a_later_one_starts_long_again() -> None:
    c = core(10)
    _, hi, _ = suspicion_bounds(PARAMS, 10)
    for by in (7, 8, 9, 5):
        c.merge(entry(4, SUSPECT, by=by), 0.0)
    c.merge(entry(4, ALIVE, incarnation=2), 1.0)
    assert c.suspicion_deadline(node_id(4)) is None
    c.merge(entry(4, SUSPECT, incarnation=2, by=7), 2.0)
    assert c.suspicion_deadline(node_id(4)) == pytest.approx(2.0 + hi)


def test_unreachable_suspects_a_live_member_and_confirms_a_suspect_one() -> None:
    c = core(10)
    out = c.unreachable(node_id(3), 0.0)
    assert len(out) == 1
    assert isinstance(out[0].message, SwimPing)
    told = out[0].message.updates
    assert [(u.node_id, u.state, u.by) for u in told] == [(node_id(3), SUSPECT, node_id(0))]
    assert c.suspecters(node_id(3)) == {node_id(0)}
    c.merge(entry(5, SUSPECT, by=7), 0.0)
    assert c.unreachable(node_id(5), 0.1)  # this node's own evidence confirms 7's suspicion
    assert c.suspecters(node_id(5)) == {node_id(7), node_id(0)}
    assert c.unreachable(node_id(5), 0.2) == []  # counted once
    assert c.unreachable("f" * 32, 0.2) == []  # not a member


def test_an_own_failed_probe_of_a_suspect_member_is_a_confirmation() -> None:
    c = core(4)  # 0..3: member 2 suspects 1; member 0 then probes 1 and gets no answer
    c.merge(entry(1, SUSPECT, by=2), 0.0)
    t = 0.0
    for _ in range(60):  # the three others get probed within a few periods; 1 never acks
        c.tick(t)
        t += 0.05
        if node_id(0) in c.suspecters(node_id(1)):
            break
    assert c.suspecters(node_id(1)) == {node_id(2), node_id(0)}
    lo, _, k = suspicion_bounds(PARAMS, 4)
    assert k == 1
    assert c.suspicion_deadline(node_id(1)) == pytest.approx(0.0 + lo)


def test_the_suspecter_travels_on_the_wire_and_old_entries_still_decode() -> None:
    e = entry(4, SUSPECT, by=7)
    assert e.to_wire()[8] == node_id(7)
    back = wire.parse(wire.decode(wire.encode_message(SwimPing(3, entry(1), (e,))), max_bytes=1 << 16))
    assert isinstance(back, SwimPing)
    assert back.updates[0].by == node_id(7)
    assert back.updates[0] == replace(e, by=None)  # who suspected is not part of the state
    assert len(entry(4).to_wire()) == 8  # entries without a suspecter are what older members send
    assert MemberEntry.from_wire(entry(4).to_wire()).by is None
    with pytest.raises(wire.FrameRejected):
        MemberEntry.from_wire([*entry(4).to_wire(), 17])


def test_bad_lifeguard_params_are_refused() -> None:
    with pytest.raises(ValueError, match="suspicion_max_mult"):
        Params(suspicion_max_mult=0.5)
    with pytest.raises(ValueError, match="suspicion_k"):
        Params(suspicion_k=-1)
