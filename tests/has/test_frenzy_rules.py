"""Frenzy's rules on hand-built snapshots: through the whole policy, then each rule function on its own."""

from __future__ import annotations

import random
from dataclasses import replace

from frenzyd.gpu_types import GPU_TYPES
from frenzyd.has import frenzy
from frenzyd.has.free_gpus import FreeGpus, fullest_first
from frenzyd.has.frenzy import FrenzyPolicy
from frenzyd.has.frenzy_rules import (
    Round,
    cheapest_plan,
    grow,
    order_queue,
    place,
    relieve_starvation,
    shrink_blocked,
    upgrade,
    yield_gpus,
)
from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, JobView, RunningJob, Snapshot
from frenzyd.has.plan_shape import Shapes
from frenzyd.has.speed import JobSpeed
from frenzyd.marp.spec import Plan

TYPE = "A100-80GB"
MEM = GPU_TYPES[TYPE].memory_bytes
SPEED = JobSpeed(params=124_000_000, flops_per_step=1e15)


def plan(gpus: int, step_s: float) -> Plan:
    return Plan(TYPE, gpus, gpus, 1, 1, 3, 1, 1, MEM // 2, MEM, step_s)


def job(job_id: str, arrival_s: float, plans: tuple[Plan, ...], remaining: float) -> JobView:
    return JobView(job_id, arrival_s, plans[0].gpus, plans, SPEED, remaining, remaining)


def snapshot(head_waited_s: float) -> Snapshot:
    """One peer of 4 GPUs, 2 busy for a while yet; a 4-GPU job waiting ``head_waited_s``; a 1-GPU job."""
    gpus = tuple(Gpu("peer-a", i, TYPE) for i in range(4))
    cluster = Cluster((GpuTypeSpec(TYPE, MEM, GPU_TYPES[TYPE].speed),), gpus)
    now = 10 * 3600.0
    head = job("head", now - head_waited_s, (plan(4, 1.0),), remaining=500.0)  # only 4 GPUs hold it
    small = job("small", now - 60.0, (plan(1, 4.0), plan(2, 2.0)), remaining=1000.0)
    busy = job("busy", 0.0, (plan(2, 1.0),), remaining=400.0)  # less time left than head: no donor
    running = (RunningJob(busy, busy.plans[0], gpus[:2], now - 600.0, step_time_s=1.0),)
    return Snapshot(now, "arrival", cluster, gpus[2:], (small, head), running)


def test_a_starving_head_job_gets_its_type_reserved() -> None:
    # Waited past STARVATION_S: the aged key puts the 4-GPU job first, it cannot start (2 of 4 GPUs
    # free, no donor), so its type is reserved and the 1-GPU job must not take the free GPUs.
    starving = snapshot(frenzy.STARVATION_S + 600.0)
    assert FrenzyPolicy().decide(starving, random.Random(0)).placements == ()
    # Control: the same queue before the threshold lets the small job use the free GPUs.
    waiting = snapshot(frenzy.STARVATION_S - 600.0)
    placed = FrenzyPolicy().decide(waiting, random.Random(0)).placements
    assert [p.job_id for p in placed] == ["small"]


def modelled(gpus: int) -> Plan:
    """A plan whose packed step time is the speed model's (as MARP's plans carry in the simulator)."""
    draft = plan(gpus, 1.0)
    return plan(gpus, SPEED.step_time_s(draft, GPU_TYPES[TYPE].speed, 1))


def one_peer() -> tuple[Cluster, tuple[Gpu, ...]]:
    gpus = tuple(Gpu("peer-a", i, TYPE) for i in range(4))
    return Cluster((GpuTypeSpec(TYPE, MEM, GPU_TYPES[TYPE].speed),), gpus), gpus


def shrink_case(long_left_steps: float) -> Snapshot:
    """All 4 GPUs held by ``long``; a short job arrives whose cheapest plan needs 2."""
    cluster, gpus = one_peer()
    now = 3600.0
    long = job("long", 0.0, (plan(4, 1.0), plan(2, 1.8)), remaining=long_left_steps)
    short = job("short", now - 5.0, (plan(1, 4.0), plan(2, 2.0)), remaining=1000.0)
    running = (RunningJob(long, long.plans[0], gpus, now - 600.0, step_time_s=1.0),)
    return Snapshot(now, "arrival", cluster, (), (short,), running)


def test_a_much_longer_job_shrinks_for_a_short_one() -> None:
    # 100,000 s left against the short job's 2,000 s on its 2-GPU plan (> that + its restart): the long
    # job keeps 2 of its GPUs under its 2-GPU plan and the short job takes the other two.
    d = FrenzyPolicy().decide(shrink_case(100_000.0), random.Random(0))
    assert d.preemptions == ()
    moves = {p.job_id: p for p in d.placements}
    assert set(moves) == {"long", "short"}
    assert moves["long"].plan.gpus == 2
    assert moves["short"].plan.gpus == 2
    assert not set(moves["long"].gpus) & set(moves["short"].gpus)
    # Less time left than the short job's 2,000 s: nobody is disturbed, the short job waits.
    assert FrenzyPolicy().decide(shrink_case(1_900.0), random.Random(0)).placements == ()
    # Just more than 2,000 s, but not more than 2,000 s plus its own restart (31.5 s): still nobody.
    assert FrenzyPolicy().decide(shrink_case(2_020.0), random.Random(0)).placements == ()


def grow_case(remaining_steps: float) -> Snapshot:
    cluster, gpus = one_peer()
    solo = job("solo", 0.0, (modelled(1), modelled(4)), remaining=remaining_steps)
    running = (RunningJob(solo, solo.plans[0], gpus[:1], 0.0, step_time_s=solo.plans[0].step_time_s),)
    return Snapshot(3600.0, "completion", cluster, gpus[1:], (), running)


def test_a_running_job_grows_onto_idle_gpus_when_it_pays_for_its_restart() -> None:
    d = FrenzyPolicy().decide(grow_case(1000.0), random.Random(0))
    assert [(p.job_id, p.plan.gpus, len(p.gpus)) for p in d.placements] == [("solo", 4, 4)]
    # A few steps left: the restart would cost more than the speed-up buys.
    assert FrenzyPolicy().decide(grow_case(3.0), random.Random(0)).placements == ()


SLOW = "RTX-A6000"
SMEM = GPU_TYPES[SLOW].memory_bytes


def fast_and_slow() -> tuple[Cluster, tuple[Gpu, ...], tuple[Gpu, ...]]:
    """4 GPUs of TYPE on peer-a, 4 slower ones (SLOW) on peer-b."""
    fast = tuple(Gpu("peer-a", i, TYPE) for i in range(4))
    slow = tuple(Gpu("peer-b", i, SLOW) for i in range(4))
    types = (GpuTypeSpec(TYPE, MEM, GPU_TYPES[TYPE].speed), GpuTypeSpec(SLOW, SMEM, GPU_TYPES[SLOW].speed))
    return Cluster(types, fast + slow), fast, slow


def on_slow(gpus: int, step_s: float) -> Plan:
    return Plan(SLOW, gpus, gpus, 1, 1, 3, 1, 1, SMEM // 2, SMEM, step_s)


def two_types_case(long_left_steps: float) -> Snapshot:
    """4 fast GPUs held by a job about as long as the newcomer, 4 slower ones by ``long``.

    The short job's four cheapest plans are all on the fast type (1–4 GPUs), its
    plan on the slower type costs more: only a per-type look finds ``long``.
    """
    cluster, fast, slow = fast_and_slow()
    now = 3600.0

    fast_plans = (plan(1, 2.0), plan(2, 1.0), plan(3, 0.7), plan(4, 0.55))
    short = job("short", now - 5.0, (*fast_plans, on_slow(2, 3.0)), remaining=1000.0)
    peer = job("peer", 0.0, (plan(4, 1.0),), remaining=500.0)  # less left than short (550 s): no donor
    long = job("long", 0.0, (on_slow(4, 1.0), on_slow(2, 1.8)), remaining=long_left_steps)
    running = (
        RunningJob(peer, peer.plans[0], fast, now - 600.0, step_time_s=1.0),
        RunningJob(long, long.plans[0], slow, now - 600.0, step_time_s=1.0),
    )
    return Snapshot(now, "arrival", cluster, (), (short,), running)


def test_a_much_longer_job_on_another_type_shrinks_for_a_short_one() -> None:
    d = FrenzyPolicy().decide(two_types_case(100_000.0), random.Random(0))
    moves = {p.job_id: p for p in d.placements}
    assert set(moves) == {"long", "short"}
    assert (moves["long"].plan.gpu_type, moves["long"].plan.gpus) == (SLOW, 2)
    assert (moves["short"].plan.gpu_type, moves["short"].plan.gpus) == (SLOW, 2)
    assert not set(moves["long"].gpus) & set(moves["short"].gpus)
    assert "peer" not in moves
    # Control: ``long`` has less time left than the short job's 3,000 s on the slow plan: nobody is
    # disturbed.
    assert FrenzyPolicy().decide(two_types_case(2_500.0), random.Random(0)).placements == ()


def quiet_case(slow_step_s: float, long_left_steps: float) -> Snapshot:
    """The fast GPUs held by ``long``, the slower ones free; a short job arrives (a quiet window)."""
    cluster, fast, slow = fast_and_slow()
    now = 3600.0
    # 1,000 s on the fast pair, 1,000 x slow_step_s on the slow one.
    short = job("short", now - 5.0, (plan(2, 1.0), on_slow(2, slow_step_s)), remaining=1000.0)
    long = job("long", 0.0, (plan(4, 1.0), plan(2, 1.8)), remaining=long_left_steps)
    running = (RunningJob(long, long.plans[0], fast, now - 600.0, step_time_s=1.0),)
    return Snapshot(now, "arrival", cluster, slow, (short,), running)


def test_a_much_longer_job_yields_fast_gpus_when_the_free_ones_are_much_slower() -> None:
    # 3,000 s on the free slow pair > 2 x 1,000 s + long's restart (31.5 s): long keeps 2 fast GPUs.
    d = FrenzyPolicy().decide(quiet_case(3.0, 100_000.0), random.Random(0))
    moves = {p.job_id: (p.plan.gpu_type, p.plan.gpus) for p in d.placements}
    assert moves == {"long": (TYPE, 2), "short": (TYPE, 2)}
    # Control: 1,900 s on the slow pair is less than the delay the yield would cost long: start there.
    d = FrenzyPolicy().decide(quiet_case(1.9, 100_000.0), random.Random(0))
    assert [(p.job_id, p.plan.gpu_type) for p in d.placements] == [("short", SLOW)]
    # Control: long has less time left than the short job's 1,000 s there: nobody yields.
    d = FrenzyPolicy().decide(quiet_case(3.0, 900.0), random.Random(0))
    assert [(p.job_id, p.plan.gpu_type) for p in d.placements] == [("short", SLOW)]


def starving_case(waited_s: float, slow_speed: float) -> Snapshot:
    """``holder`` runs on all 4 fast GPUs; the slower ones (speed ``slow_speed``) are free.

    ``head`` has waited ``waited_s`` and fits only the fast GPUs (one 4-GPU plan);
    ``holder`` has as much time left as ``head`` and could also run on the slower type.
    """
    fast = tuple(Gpu("peer-a", i, TYPE) for i in range(4))
    slow = tuple(Gpu("peer-b", i, SLOW) for i in range(4))
    types = (GpuTypeSpec(TYPE, MEM, GPU_TYPES[TYPE].speed), GpuTypeSpec(SLOW, SMEM, slow_speed))
    cluster = Cluster(types, fast + slow)
    now = 10 * 3600.0
    # As much time left as holder where it runs: holder is no donor, only the move can help.
    head = job("head", now - waited_s, (plan(4, 1.0),), remaining=20_000.0 * modelled(4).step_time_s)
    there = on_slow(4, SPEED.step_time_s(on_slow(4, 1.0), slow_speed, 1))
    holder = job("holder", 0.0, (modelled(4), there), remaining=20_000.0)
    step = holder.plans[0].step_time_s
    running = (RunningJob(holder, holder.plans[0], fast, now - 3600.0, step_time_s=step),)
    return Snapshot(now, "completion", cluster, slow, (head,), running)


def test_a_starving_job_gets_its_type_when_a_holder_can_move_to_idle_gpus() -> None:
    fast_speed = GPU_TYPES[TYPE].speed
    holder_s = 20_000.0 * modelled(4).step_time_s  # its time left where it runs
    holder_slow_s = 20_000.0 * SPEED.step_time_s(on_slow(4, 1.0), fast_speed / 1.5, 1)
    assert SPEED.restart_cost_s + holder_slow_s < 2 * holder_s  # the exchange test holds
    d = FrenzyPolicy().decide(starving_case(frenzy.STARVATION_S + 600.0, fast_speed / 1.5), random.Random(0))
    moves = {p.job_id: (p.plan.gpu_type, len(p.gpus)) for p in d.placements}
    assert moves == {"holder": (SLOW, 4), "head": (TYPE, 4)}
    assert d.preemptions == ()
    # Control: on GPUs 3x slower the holder would end later than head waits for it: nobody moves.
    d = FrenzyPolicy().decide(starving_case(frenzy.STARVATION_S + 600.0, fast_speed / 3.0), random.Random(0))
    assert d.placements == ()
    # Control: not starving yet: the holder keeps its GPUs.
    d = FrenzyPolicy().decide(starving_case(frenzy.STARVATION_S - 600.0, fast_speed / 1.5), random.Random(0))
    assert d.placements == ()


def upgrade_case(slow_speed: float, waiting_steps: float) -> Snapshot:
    """``mover`` runs on the 4 slower GPUs (speed ``slow_speed``); the 4 fast ones have just come free.

    ``waiting`` (``waiting_steps`` at 1 s on the 4 fast GPUs) fits only the fast type.
    """
    fast = tuple(Gpu("peer-a", i, TYPE) for i in range(4))
    slow = tuple(Gpu("peer-b", i, SLOW) for i in range(4))
    types = (GpuTypeSpec(TYPE, MEM, GPU_TYPES[TYPE].speed), GpuTypeSpec(SLOW, SMEM, slow_speed))
    cluster = Cluster(types, fast + slow)
    now = 10 * 3600.0
    waiting = job("waiting", now - 5.0, (plan(4, 1.0),), remaining=waiting_steps)
    there = on_slow(4, SPEED.step_time_s(on_slow(4, 1.0), slow_speed, 1))
    mover = job("mover", 0.0, (modelled(4), there), remaining=20_000.0)
    running = (RunningJob(mover, there, slow, now - 3600.0, step_time_s=there.step_time_s),)
    return Snapshot(now, "completion", cluster, fast, (waiting,), running)


def test_a_job_on_slow_gpus_moves_to_freed_fast_ones_when_the_sum_of_completions_drops() -> None:
    fast_speed = GPU_TYPES[TYPE].speed
    m_fast = 20_000.0 * modelled(4).step_time_s
    m_slow = 20_000.0 * SPEED.step_time_s(on_slow(4, 1.0), fast_speed / 3.0, 1)
    assert 2 * (m_fast + SPEED.restart_cost_s) < m_slow  # the exchange test holds on 3x slower GPUs
    assert m_fast < 1_000_000.0  # ... and the mover is the shorter job on the fast type
    d = FrenzyPolicy().decide(upgrade_case(fast_speed / 3.0, 1_000_000.0), random.Random(0))
    moves = {p.job_id: (p.plan.gpu_type, len(p.gpus)) for p in d.placements}
    assert moves == {"mover": (TYPE, 4)}  # ``waiting`` fits only the fast type: it waits
    assert d.preemptions == ()
    # Control: on GPUs only 1.5x slower the mover gains less than it would delay the waiting job.
    d = FrenzyPolicy().decide(upgrade_case(fast_speed / 1.5, 1_000_000.0), random.Random(0))
    assert [(p.job_id, p.plan.gpu_type) for p in d.placements] == [("waiting", TYPE)]
    # Control: the waiting job is the shorter one on the fast type (shortest remaining time first).
    d = FrenzyPolicy().decide(upgrade_case(fast_speed / 3.0, 100.0), random.Random(0))
    assert [(p.job_id, p.plan.gpu_type) for p in d.placements] == [("waiting", TYPE)]


# ----------------------------------------------------------------------------- each rule on its own
# The rules of frenzy_rules, called one at a time on a Round built from a hand-made snapshot.


def rules_round(snap: Snapshot) -> Round:
    def no_step(run: RunningJob, speeds: dict[str, float]) -> float:
        raise AssertionError("every running job here carries its step time")

    return Round(snap, Shapes(), min_run_s=frenzy.SHRINK_MIN_RUN_S, step_of=no_step)


def test_free_gpu_index_counts_and_picks_as_pick_packed() -> None:
    a = tuple(Gpu("peer-a", i, TYPE) for i in range(3))
    b = tuple(Gpu("peer-b", i, TYPE) for i in range(2))
    s = (Gpu("peer-c", 0, SLOW),)
    free = FreeGpus(a + b + s)
    assert free.count == {TYPE: 5, SLOW: 1}
    assert free.fullest(TYPE) == [(-3, "peer-a"), (-2, "peer-b")]
    assert free.peers_for(TYPE, 2, 1) == 1
    assert free.peers_for(TYPE, 5, 1) == 2
    assert free.peers_for(TYPE, 6, 1) == 0
    assert free.peers_for(TYPE, 4, 2) == 2  # two whole tp pairs: one from each peer
    got = free.place(plan(2, 1.0))  # best fit: peer-b holds 2 with nothing to spare
    assert got == list(b)
    assert free.count[TYPE] == 3
    assert "peer-b" not in free.by_type[TYPE]
    assert free.fullest(TYPE) == fullest_first(free.by_type[TYPE])
    free.give(b[:1])
    assert free.count[TYPE] == 4
    assert free.fullest(TYPE) == [(-3, "peer-a"), (-1, "peer-b")]
    # hand_over: the released GPUs join the free ones only when together they hold the plan.
    assert free.hand_over([], plan(5, 1.0)) is None
    assert free.count[TYPE] == 4
    taken = free.hand_over([b[1]], plan(5, 1.0))
    assert taken is not None
    assert set(taken) == set(a + b)
    assert free.count[TYPE] == 0
    assert free.any_free()
    assert not free.any_free_outside({SLOW})


def test_order_queue_is_aged_shortest_remaining_time_first() -> None:
    cluster, gpus = one_peer()
    now = 100_000.0
    short = job("short", now - 10.0, (plan(1, 1.0),), remaining=1000.0)  # key 1000 − 10·AGING
    old = job("old", now - 2000.0 / frenzy.AGING, (plan(1, 1.0),), remaining=2500.0)  # key 2500 − 2000
    young = job("young", now - 10.0, (plan(1, 1.0),), remaining=2500.0)  # key 2500 − 10·AGING
    rnd = rules_round(Snapshot(now, "arrival", cluster, gpus, (young, short, old), ()))
    assert [j.job_id for j in order_queue(rnd, (young, short, old))] == ["old", "short", "young"]
    assert set(rnd.shapes) == {"young", "short", "old"}


def test_upgrade_alone_moves_the_slow_job_and_frees_its_gpus() -> None:
    snap = upgrade_case(GPU_TYPES[TYPE].speed / 3.0, 1_000_000.0)
    rnd = rules_round(snap)
    upgrade(rnd, order_queue(rnd, snap.queued))
    assert [(p.job_id, p.plan.gpu_type) for p in rnd.placements] == [("mover", TYPE)]
    assert rnd.moved == {"mover"}
    assert rnd.free.count == {TYPE: 0, SLOW: 4}  # the fast GPUs taken, the slow ones given back
    # Control: the waiting job is shorter on the fast type: nothing moves, nothing changes.
    snap = upgrade_case(GPU_TYPES[TYPE].speed / 3.0, 100.0)
    rnd = rules_round(snap)
    upgrade(rnd, order_queue(rnd, snap.queued))
    assert rnd.placements == []
    assert rnd.free.count == {TYPE: 4}


def test_cheapest_plan_prefers_the_smaller_memory_type_within_the_slack() -> None:
    cluster, fast, slow = fast_and_slow()
    now = 100.0
    close = frenzy.MEMORY_SLACK / 2  # the slow type's plan costs 7.5 % more
    pick = job("pick", now, (plan(2, 1.0), on_slow(2, 1.0 + close)), remaining=100.0)
    rnd = rules_round(Snapshot(now, "arrival", cluster, fast + slow, (pick,), ()))
    order_queue(rnd, (pick,))
    choice = cheapest_plan(rnd, pick, rnd.shapes["pick"], frenzy.GAMMA)
    assert choice is not None
    assert choice[2].gpu_type == SLOW
    far = job("far", now, (plan(2, 1.0), on_slow(2, 1.0 + 2 * frenzy.MEMORY_SLACK)), remaining=100.0)
    order_queue(rnd, (far,))
    choice = cheapest_plan(rnd, far, rnd.shapes["far"], frenzy.GAMMA)
    assert choice is not None
    assert choice[2].gpu_type == TYPE
    # No type with room (both reserved): None, and the plan set is marked stuck for the round.
    rnd.reserved |= {TYPE, SLOW}
    assert cheapest_plan(rnd, far, rnd.shapes["far"], frenzy.GAMMA) is None
    assert id(rnd.shapes["far"]) in rnd.stuck


def test_cheapest_plan_weighs_gpus_by_gamma() -> None:
    cluster, gpus = one_peer()
    # 4 GPUs at 0.6 of the 1-GPU step: 0.6 x 4**0.678 = 1.52 > 1 while others wait, 0.85 alone.
    solo = job("solo", 0.0, (plan(1, 1.0), plan(4, 0.6)), remaining=100.0)
    rnd = rules_round(Snapshot(100.0, "arrival", cluster, gpus, (solo,), ()))
    order_queue(rnd, (solo,))
    shape = rnd.shapes["solo"]
    assert cheapest_plan(rnd, solo, shape, frenzy.GAMMA) == (1.0, 1, solo.plans[0])
    got = cheapest_plan(rnd, solo, shape, frenzy.GAMMA_ALONE)
    assert got is not None
    assert got[2] == solo.plans[1]


def test_place_takes_the_best_fitting_peer() -> None:
    a = tuple(Gpu("peer-a", i, TYPE) for i in range(4))
    b = tuple(Gpu("peer-b", i, TYPE) for i in range(2))
    cluster = Cluster((GpuTypeSpec(TYPE, MEM, GPU_TYPES[TYPE].speed),), a + b)
    two = job("two", 0.0, (plan(2, 1.0),), remaining=10.0)
    rnd = rules_round(Snapshot(10.0, "arrival", cluster, a + b, (two,), ()))
    rnd.room = rnd.free.any_free_outside(rnd.reserved)  # as decide sets it before the queue pass
    place(rnd, two, two.plans[0])
    assert [p.gpus for p in rnd.placements] == [b]  # peer-b holds 2 with none to spare
    assert rnd.free.count[TYPE] == 4
    assert rnd.room
    place(rnd, two, plan(4, 1.0))
    assert rnd.free.count[TYPE] == 0
    assert not rnd.room


def test_yield_gpus_alone_gives_the_fast_gpus_to_the_short_job() -> None:
    snap = quiet_case(3.0, 100_000.0)
    rnd = rules_round(snap)
    order_queue(rnd, snap.queued)
    short = snap.queued[0]
    shape = rnd.shapes["short"]
    choice = cheapest_plan(rnd, short, shape, frenzy.GAMMA_ALONE)
    assert choice is not None
    assert choice[2].gpu_type == SLOW
    assert yield_gpus(rnd, short, shape, frenzy.GAMMA_ALONE, choice)
    assert {p.job_id: (p.plan.gpu_type, p.plan.gpus) for p in rnd.placements} == {
        "long": (TYPE, 2),
        "short": (TYPE, 2),
    }
    assert rnd.shrink_tries == frenzy.SHRINK_TRIES - 1
    assert rnd.moved == {"long"}
    # With no tries left the rule does nothing.
    rnd = rules_round(snap)
    order_queue(rnd, snap.queued)
    rnd.shrink_tries = 0
    assert not yield_gpus(rnd, short, shape, frenzy.GAMMA_ALONE, choice)
    assert rnd.placements == []


def test_shrink_blocked_alone_shrinks_or_stops_the_longer_job() -> None:
    snap = shrink_case(100_000.0)
    rnd = rules_round(snap)
    order_queue(rnd, snap.queued)
    short = snap.queued[0]
    assert shrink_blocked(rnd, short, rnd.shapes["short"], frenzy.GAMMA_ALONE)
    assert sorted((p.job_id, p.plan.gpus) for p in rnd.placements) == [("long", 2), ("short", 2)]
    assert rnd.preemptions == []
    # A donor with no smaller plan that frees enough is stopped (requeued with its progress).
    cluster, gpus = one_peer()
    long = job("long", 0.0, (plan(4, 1.0),), remaining=100_000.0)
    running = (RunningJob(long, long.plans[0], gpus, 3000.0, step_time_s=1.0),)
    snap = Snapshot(3600.0, "arrival", cluster, (), snap.queued, running)
    rnd = rules_round(snap)
    order_queue(rnd, snap.queued)
    assert shrink_blocked(rnd, short, rnd.shapes["short"], frenzy.GAMMA_ALONE)
    assert rnd.preemptions == ["long"]
    assert [p.job_id for p in rnd.placements] == ["short"]
    # Control: the donor started less than min_run_s ago.
    running = (RunningJob(long, long.plans[0], gpus, 3600.0 - 60.0, step_time_s=1.0),)
    rnd = rules_round(Snapshot(3600.0, "arrival", cluster, (), snap.queued, running))
    order_queue(rnd, snap.queued)
    assert not shrink_blocked(rnd, short, rnd.shapes["short"], frenzy.GAMMA_ALONE)


def test_relieve_starvation_alone_moves_a_holder_or_reserves_the_type() -> None:
    fast_speed = GPU_TYPES[TYPE].speed
    for slow_speed, expected in ((fast_speed / 1.5, "move"), (fast_speed / 3.0, "reserve")):
        snap = starving_case(frenzy.STARVATION_S + 600.0, slow_speed)
        rnd = rules_round(snap)
        order_queue(rnd, snap.queued)
        head = snap.queued[0]
        relieve_starvation(rnd, head, rnd.shapes["head"], frenzy.GAMMA_ALONE, {TYPE: 4, SLOW: 4})
        if expected == "move":
            assert {p.job_id: p.plan.gpu_type for p in rnd.placements} == {"holder": SLOW, "head": TYPE}
            assert rnd.reserved == set()
        else:
            assert rnd.placements == []
            assert rnd.reserved == {TYPE}
    # Not starving yet: nothing.
    snap = starving_case(frenzy.STARVATION_S - 600.0, fast_speed / 3.0)
    rnd = rules_round(snap)
    order_queue(rnd, snap.queued)
    relieve_starvation(rnd, snap.queued[0], rnd.shapes["head"], frenzy.GAMMA_ALONE, {TYPE: 4, SLOW: 4})
    assert rnd.placements == []
    assert rnd.reserved == set()


def test_grow_alone_uses_only_the_idle_gpus_it_is_given() -> None:
    snap = grow_case(1000.0)
    rnd = rules_round(snap)
    moves = grow(rnd, dict(rnd.free.count))
    assert [(p.job_id, len(p.gpus)) for p in moves] == [("solo", 4)]
    assert rnd.free.count[TYPE] == 0
    # The same GPUs withheld (a waiting job wants the type): no growth.
    rnd = rules_round(snap)
    assert grow(rnd, {TYPE: 0}) == []
    # A job changed earlier in the round is skipped.
    rnd = rules_round(snap)
    assert grow(rnd, dict(rnd.free.count), skip={"solo"}) == []


def test_a_job_still_starting_is_neither_grown_nor_a_donor() -> None:
    # Placed 3,000 s ago but its first step has not come (ready_s inf: a live start): growth leaves it.
    snap = grow_case(1000.0)
    started = replace(snap.running[0], ready_s=float("inf"))
    rnd = rules_round(replace(snap, running=(started,)))
    assert grow(rnd, dict(rnd.free.count)) == []
    # Its first step came just now: it may grow (growth needs no time run, only a gain).
    rnd = rules_round(replace(snap, running=(replace(started, ready_s=snap.now_s),)))
    assert [p.job_id for p in grow(rnd, dict(rnd.free.count))] == ["solo"]
    # A shrink donor needs min_run_s of progress since its first step, not since its placement.
    cluster, gpus = one_peer()
    short = shrink_case(100_000.0).queued[0]
    long = job("long", 0.0, (plan(4, 1.0),), remaining=100_000.0)
    for ready, donor in ((float("inf"), False), (3600.0 - 60.0, False), (3600.0 - 200.0, True)):
        running = (RunningJob(long, long.plans[0], gpus, 3000.0, step_time_s=1.0, ready_s=ready),)
        rnd = rules_round(Snapshot(3600.0, "arrival", cluster, (), (short,), running))
        order_queue(rnd, (short,))
        assert shrink_blocked(rnd, short, rnd.shapes["short"], frenzy.GAMMA_ALONE) is donor, ready


def test_ran_s_counts_progress_from_the_first_step() -> None:
    _, gpus = one_peer()
    long = job("long", 0.0, (plan(4, 1.0),), remaining=10.0)
    run = RunningJob(long, long.plans[0], gpus, 100.0)
    assert run.ran_s(160.0) == 60.0  # not known: from its placement
    assert replace(run, ready_s=130.0).ran_s(160.0) == 30.0
    assert replace(run, ready_s=float("inf")).ran_s(160.0) < 0  # still starting
