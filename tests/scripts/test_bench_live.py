"""scripts/bench_live.py's pure parts and the simulator's calibrated preemption mode it relies on.

The replay itself starts real daemons for minutes: CI runs it as ``scripts/bench_live.py --tiny`` in
``.ci/run``'s loop over the benchmarks, not here.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_live as bl  # noqa: E402

from frenzyd.has.interface import Cluster, Decision, Gpu, GpuTypeSpec, Placement, Snapshot  # noqa: E402
from frenzyd.has.speed import JobSpeed  # noqa: E402
from frenzyd.marp.spec import Plan  # noqa: E402
from frenzyd.sim.model import SimJob  # noqa: E402
from frenzyd.sim.preemption import LOOPBACK_STAND_IN, PreemptionModel  # noqa: E402
from frenzyd.sim.simulator import simulate  # noqa: E402


def _plan(gpu_type: str, gpus: int, step: float, zero: int = 0) -> Plan:
    return Plan(gpu_type, gpus, gpus, 1, 1, zero, 1, 1, 1 << 30, 80 << 30, step)


def _job(job_id: str, arrival: float, steps: float, plans: tuple[Plan, ...]) -> SimJob:
    return SimJob(job_id=job_id, arrival_s=arrival, requested_gpus=1, model="gpt2", seq_len=1024,
                  global_batch=16, total_steps=steps, speed=JobSpeed(10**8, 1e12), plans=plans)


class _MakeRoomForB:
    """Places queued jobs on free GPUs; when job B is queued and A runs, stops A and gives B its GPU."""

    name = "make-room"
    round_s: float | None = None

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        queued = {j.job_id: j for j in snapshot.queued}
        running = {r.job.job_id: r for r in snapshot.running}
        if "B" in queued and "A" in running:
            a = running["A"]
            return Decision(preemptions=("A",), placements=(Placement("B", queued["B"].plans[0], a.gpus),))
        free = list(snapshot.free)
        out = []
        for j in snapshot.queued:
            if free:
                out.append(Placement(j.job_id, j.plans[0], (free.pop(0),)))
        return Decision(placements=tuple(out))


def test_a_calibrated_stop_finishes_its_step_and_the_freed_gpu_waits_for_the_handover() -> None:
    """The live trainer's stop: the step in flight finishes (1 s left of a 2 s step), the checkpoint
    and exit take ``handover_s``; the job placed on that GPU starts after both, every placement costs
    ``start_s``, a resumed one ``load_s`` more, and a job is done ``finish_s`` after its last step."""
    cluster = Cluster((GpuTypeSpec("A100-80GB", 80 << 30, 2.55),), (Gpu("n0", 0, "A100-80GB"),))
    plan = _plan("A100-80GB", 1, 2.0)
    jobs = [_job("A", 0.0, 100.0, (plan,)), _job("B", 10.0, 5.0, (plan,))]
    model = PreemptionModel(start_s=3.0, load_s=1.0, finish_s=0.25, handover_s=0.5, finish_step=True)
    r = simulate(_MakeRoomForB(), jobs, cluster, seed=0, clock=time.perf_counter, preemption=model,
                 step_time=lambda job, p, peers: p.step_time_s)
    end = {o.job_id: o.end_s for o in r.outcomes}
    # A: ready at 3; at 10 it is 3.5 steps in, finishes step 4 at 11, hands over by 11.5 (96 steps left).
    # B: starts at 11.5, ready 14.5, 5 steps, done 24.75.  A again at 24.75: ready 28.75, 192 s, +0.25.
    assert end["B"] == pytest.approx(24.75)
    assert end["A"] == pytest.approx(221.0)
    assert {o.job_id: o.restarts for o in r.outcomes} == {"A": 1, "B": 0}
    assert all(o.lost_s == 0.0 for o in r.outcomes)  # nothing is lost: the step in flight finished


def test_the_step_time_hook_sets_the_pace_but_not_what_policies_see() -> None:
    cluster = Cluster((GpuTypeSpec("A100-80GB", 80 << 30, 2.55),), (Gpu("n0", 0, "A100-80GB"),))
    plan = _plan("A100-80GB", 1, 0.1)
    model = PreemptionModel(start_s=0.0, finish_step=True)
    r = simulate(_MakeRoomForB(), [_job("A", 0.0, 10.0, (plan,))], cluster, seed=0, clock=time.perf_counter,
                 preemption=model, step_time=lambda job, p, peers: bl.pace_s(p))
    assert r.outcomes[0].end_s == pytest.approx(10 * bl.PACE_MIN_S)  # 0.1 s steps paced to 0.5 s


def test_calibration_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="start_s"):
        PreemptionModel(start_s=-1.0)
    with pytest.raises(ValueError, match="handover_s"):
        PreemptionModel(handover_s=-0.1)
    with pytest.raises(ValueError, match="finish_step"):
        PreemptionModel(save_on_stop=False, finish_step=True)
    assert PreemptionModel().restart_s(42.0, resumed=True) == 42.0  # uncalibrated: has.speed's figure
    m = PreemptionModel(start_s=5.0, load_s=2.0)
    assert (m.restart_s(42.0, resumed=False), m.restart_s(42.0, resumed=True)) == (5.0, 7.0)
    assert LOOPBACK_STAND_IN.finish_step
    assert LOOPBACK_STAND_IN.start_s is not None
    assert LOOPBACK_STAND_IN.start_s > 0  # measured, not a placeholder


def _snapshot(queued: list[SimJob], free: list[Gpu], cluster: Cluster) -> Snapshot:
    from frenzyd.has.interface import JobView

    views = tuple(JobView(job_id=j.job_id, arrival_s=j.arrival_s, requested_gpus=1, plans=j.plans,
                          speed=j.speed, total_steps=j.total_steps, remaining_steps=j.total_steps)
                  for j in queued)
    return Snapshot(now_s=0.0, reason="arrival", cluster=cluster, free=tuple(sorted(free)), queued=views,
                    running=())


def test_live_fifo_is_first_fit_in_arrival_order_on_the_smallest_marp_shape() -> None:
    gpus = [Gpu("a", i, "A100-80GB") for i in range(2)] + [Gpu("v", i, "V100-32GB") for i in range(2)]
    cluster = Cluster((GpuTypeSpec("A100-80GB", 80 << 30, 2.55), GpuTypeSpec("V100-32GB", 32 << 30, 1.0)),
                      tuple(sorted(gpus)))
    big = _job("big", 0.0, 10, (_plan("A100-80GB", 2, 1.0), _plan("A100-80GB", 2, 0.9, zero=1)))
    small = _job("small", 1.0, 10, (_plan("A100-80GB", 1, 0.5), _plan("V100-32GB", 1, 1.0),
                                     _plan("A100-80GB", 2, 0.3)))
    late = _job("late", 2.0, 10, (_plan("V100-32GB", 1, 1.0),))
    d = bl.LiveFifo().decide(_snapshot([big, small, late], gpus, cluster), random.Random(0))
    got = {p.job_id: (p.plan.gpu_type, p.plan.gpus, p.plan.zero, tuple(g.peer for g in p.gpus))
           for p in d.placements}
    # big takes both A100s (its fastest 2-GPU plan); small falls to a V100 (1 GPU, the smallest shape);
    # late takes the other V100.
    assert got == {"big": ("A100-80GB", 2, 1, ("a", "a")), "small": ("V100-32GB", 1, 0, ("v",)),
                   "late": ("V100-32GB", 1, 0, ("v",))}
    assert not d.preemptions


def _out(attempt: int, data: str, t: float) -> dict[str, object]:
    return {"type": "output", "rank": 0, "stream": "stdout", "attempt": attempt, "data": data, "t": t}


def test_step_lines_join_lines_split_across_chunks_and_skip_other_output() -> None:
    s1 = json.dumps({"step": 1, "loss": 5.0})
    s2 = json.dumps({"step": 2, "loss": 4.0})
    events = [{"type": "state", "job": {}}, _out(1, s1 + "\n" + s2[:5], 1.0),
              _out(1, s2[5:] + "\nhello\n", 2.0),
              {**_out(1, json.dumps({"step": 9, "loss": 1.0}) + "\n", 3.0), "rank": 1}]
    assert bl.step_lines(events) == [(1, 1, 1.0), (1, 2, 2.0)]


def test_late_steps_count_gaps_over_one_and_a_half_paces_within_an_attempt() -> None:
    lines = [(1, 1, 10.0), (1, 2, 10.5), (1, 3, 11.3), (1, 4, 11.7),  # one gap of 0.8 > 0.75
             (2, 5, 100.0), (2, 6, 101.0),  # a new attempt: its first step is not timed against attempt 1
             (3, 7, 200.0), (3, 8, 200.5)]  # attempt 3's plan is unknown
    assert bl.late_steps(lines, {1: 0.5, 2: 1.0}) == (4, 1, 1)


@pytest.mark.timeout(120)
def test_the_slice_is_scaled_to_the_offered_load_with_every_job_at_least_min_steps() -> None:
    raw = bl.candidates(2, 24)
    assert raw is not None
    assert len(raw) == 24
    jobs = bl.scale(raw, 900.0)
    assert jobs is not None
    assert bl.offered_load(jobs) == pytest.approx(bl.LOAD, rel=0.02)
    assert min(j.steps for j in jobs) >= bl.MIN_STEPS
    assert max(j.arrival_s for j in jobs) == pytest.approx(300.0)
    assert all(j.steps * bl.fastest(j)[0] <= 300.0 + bl.fastest(j)[0] for j in jobs)  # the per-job cap


def test_the_tracker_keeps_a_terminal_state_and_the_first_plan_of_each_attempt() -> None:
    t = bl.Tracker()
    t.see([{"id": "j", "state": "running", "attempt": 1, "plan": {"step_time_s": 1.0}}])
    t.see([{"id": "j", "state": "succeeded", "attempt": 1, "plan": {"step_time_s": 2.0}}])
    t.see([{"id": "j", "state": "running", "attempt": 1}])  # a coordinator's lagging soft view
    assert t.states == {"j": "succeeded"}
    assert t.plans == {("j", 1): {"step_time_s": 1.0}}


def test_both_sides_start_from_the_calibrated_restart_cost() -> None:
    """The live coordinators are seeded with the calibration's resumed start and handover
    (``[jobs] restart_start_s``/``restart_stop_s``), and the simulated policy is told the same:
    each job's restart cost and its stop cost."""
    model = bl.model_from({"start_s": 8.0, "load_s": 2.0, "finish_s": 1.0, "handover_s": 3.0})
    assert bl.restart_told(model) == (10.0, 3.0)
    toml = bl.jobs_toml("frenzy", 20.0, bl.restart_told(model))
    assert "restart_start_s = 10.000\n" in toml
    assert "restart_stop_s = 3.000\n" in toml
    assert "restart_start_s" not in bl.jobs_toml("fifo", 20.0, None)
    job = bl.LiveJob("j", 0.0, "gpt2", 1024, 16, "none", 10, 1, 0.0)
    (sim,) = bl.sim_jobs([job], model)
    assert sim.speed.restart_cost_s == 10.0
    assert bl.sim_jobs([job], PreemptionModel())[0].speed == bl.live_view(job).speed  # uncalibrated
    seen: list[float] = []

    class Watch:
        name = "watch"
        round_s: float | None = None

        def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
            seen.extend(j.stop_cost_s for j in snapshot.queued)
            return Decision()

    simulate(Watch(), [sim], bl.cluster(), seed=0, clock=time.perf_counter, preemption=model, max_time_s=5.0)
    assert seen
    assert set(seen) == {3.0}  # the handover, as the live coordinator's restart_stop_s


def test_the_stop_cost_shown_to_policies_is_what_a_stop_adds() -> None:
    m = PreemptionModel()
    assert m.shown_stop_s(10**8) == m.write_s(10**8) > 0  # save on stop: the write
    assert PreemptionModel(save_on_stop=False).shown_stop_s(10**8) == 0.0  # periodic: nothing more
    assert PreemptionModel(charge=False).shown_stop_s(10**8) == 0.0
    assert LOOPBACK_STAND_IN.shown_stop_s(10**8) == LOOPBACK_STAND_IN.handover_s


class _PlaceAll:
    """Places every queued job on the first free GPUs its first plan needs."""

    name = "place-all"
    round_s: float | None = None

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        free = list(snapshot.free)
        out = []
        for j in snapshot.queued:
            p = j.plans[0]
            if len(free) >= p.gpus:
                out.append(Placement(j.job_id, p, tuple(free[:p.gpus])))
                free = free[p.gpus:]
        return Decision(placements=tuple(out))


def test_starts_share_the_hosts_cores() -> None:
    """With ``host_cores``, a start's ``start_s`` is CPU work of each rank, at most a core a rank:
    a 1-rank job and a 3-rank job starting together on 2 cores share them (4 ranks, half a core
    each), the lone rank's start ends at 2·start_s; without it each start takes start_s."""
    gpus = tuple(Gpu("n0", i, "A100-80GB") for i in range(4))
    cluster = Cluster((GpuTypeSpec("A100-80GB", 80 << 30, 2.55),), gpus)
    jobs = [_job("one", 0.0, 2.0, (_plan("A100-80GB", 1, 1.0),)),
            _job("three", 0.0, 2.0, (_plan("A100-80GB", 3, 1.0),))]

    def ends(cores: int | None) -> dict[str, float]:
        model = PreemptionModel(start_s=4.0, finish_step=True, host_cores=cores)
        r = simulate(_PlaceAll(), jobs, cluster, seed=0, clock=time.perf_counter, preemption=model,
                     step_time=lambda job, p, peers: p.step_time_s)
        return {o.job_id: o.end_s for o in r.outcomes}

    assert ends(None) == {"one": pytest.approx(6.0), "three": pytest.approx(6.0)}
    assert ends(8) == {"one": pytest.approx(6.0), "three": pytest.approx(6.0)}  # a core for each rank
    # 4 ranks on 2 cores: both starts at half speed until 8 s; both done by then; 2 steps each.
    assert ends(2) == {"one": pytest.approx(10.0), "three": pytest.approx(10.0)}
    # 4 ranks on 1 core: a quarter speed each, 16 s.
    assert ends(1) == {"one": pytest.approx(18.0), "three": pytest.approx(18.0)}
    with pytest.raises(ValueError, match="host_cores"):
        PreemptionModel(host_cores=2)  # needs a calibrated start_s
    with pytest.raises(ValueError, match="host_cores"):
        PreemptionModel(start_s=1.0, host_cores=0)


def test_a_start_that_begins_later_shares_the_cores_from_then() -> None:
    """One rank starts at 0 on one core; a second arrives at 2: 2 s of 4 done alone, the other 2 s
    at half speed (4 s), so the first is ready at 6; the second then runs alone for its last 2."""
    gpus = tuple(Gpu("n0", i, "A100-80GB") for i in range(2))
    cluster = Cluster((GpuTypeSpec("A100-80GB", 80 << 30, 2.55),), gpus)
    p = _plan("A100-80GB", 1, 1.0)
    jobs = [_job("first", 0.0, 1.0, (p,)), _job("second", 2.0, 1.0, (p,))]
    model = PreemptionModel(start_s=4.0, finish_step=True, host_cores=1)
    r = simulate(_PlaceAll(), jobs, cluster, seed=0, clock=time.perf_counter, preemption=model,
                 step_time=lambda job, pl, peers: pl.step_time_s)
    end = {o.job_id: o.end_s for o in r.outcomes}
    # second: 2 s of work done by 6 (half speed from 2), 2 s alone: ready at 8, one step: 9.
    assert end == {"first": pytest.approx(7.0), "second": pytest.approx(9.0)}


def test_the_policy_is_told_what_the_simulator_measures_as_the_coordinator_is() -> None:
    """``restart_costs``: each simulated start (GPUs free to first step) and stop (order to handover)
    is fed to the learner, and the policy sees its (start, stop) for the job's model."""
    from frenzyd.jobs.placement import RestartCosts

    cluster = Cluster((GpuTypeSpec("A100-80GB", 80 << 30, 2.55),), (Gpu("n0", 0, "A100-80GB"),))
    plan = _plan("A100-80GB", 1, 2.0)
    jobs = [replace_speed(_job("A", 0.0, 100.0, (plan,))), replace_speed(_job("B", 10.0, 5.0, (plan,)))]
    model = PreemptionModel(start_s=3.0, load_s=1.0, finish_s=0.25, handover_s=0.5, finish_step=True)
    learner = RestartCosts(start_s=60.0, stop_s=30.0, weight=1.0)  # weight 1: the last measurement
    told: list[float] = []

    class Watching(_MakeRoomForB):
        def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
            told.extend(j.restart_cost_s for j in snapshot.queued)
            return super().decide(snapshot, rng)

    simulate(Watching(), jobs, cluster, seed=0, clock=time.perf_counter, preemption=model,
             step_time=lambda job, p, peers: p.step_time_s, restart_costs=learner)
    assert told[0] == 90.0  # before any measurement: the seeds
    # A's stop: its step's last second and the handover (1.5 s); B's start 3 s; A's resumed start 4 s.
    assert (learner.stops, learner.stop_s) == (1, pytest.approx(1.5))
    assert (learner.starts, learner.start_s) == (3, pytest.approx(4.0))
    assert told[-1] == pytest.approx(3.0 + 1.5)  # A requeued, told B's start and its own stop


def replace_speed(job: SimJob) -> SimJob:
    """The job with a speed model that carries its restart cost (as the live pool's ``PoolSpeed``)."""
    from dataclasses import replace

    from frenzyd.jobs.placement import PoolSpeed

    return replace(job, speed=PoolSpeed(params=job.speed.params, flops_per_step=job.speed.flops_per_step))


def test_the_core_calibration_fits_the_simulators_host_model() -> None:
    """``ps_ready`` is the simulator's host model (the case of ``test_starts_share_the_hosts_cores``),
    and ``fit_cores`` recovers the cores that made a set of starts."""
    assert bl.ps_ready([0.0, 0.0], [1, 3], 4.0, 2.0) == [pytest.approx(8.0), pytest.approx(8.0)]
    assert bl.ps_ready([0.0, 2.0], [1, 1], 4.0, 1.0) == [pytest.approx(6.0), pytest.approx(8.0)]
    begins, ranks = [0.0, 0.3, 0.5, 4.0], [1, 1, 2, 1]
    made = bl.ps_ready(begins, ranks, 5.0, 1.3)
    assert bl.fit_cores(begins, ranks, made, 5.0, nominal=2) == pytest.approx(1.3)
    alone = bl.ps_ready([0.0], [1], 5.0, 2.0)  # one rank alone: any core count from 1 up fits; the most
    assert bl.fit_cores([0.0], [1], alone, 5.0, nominal=2) == 2.0
