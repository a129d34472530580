"""Sia on small hand-made cases: how ties in its ILP are broken, and that they do not starve a job."""

from __future__ import annotations

import random
import time

from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, JobView, RunningJob, Snapshot
from frenzyd.has.sia import SiaPolicy
from frenzyd.has.speed import JobSpeed
from frenzyd.marp.spec import Plan
from frenzyd.sim.model import SimJob
from frenzyd.sim.simulator import simulate

GIB = 1 << 30
# 124 M parameters: a (re)start costs 31-33 s, about half a 60 s round; 5.5e14 FLOP a step is ~40 s
# on a T4, more than what is left of the round after the restart, so a job that loses its GPU at
# every round after its restart never finishes a step (the step in flight is lost at each stop).
SPEED = JobSpeed(124_000_000, 5.5e14)
T4 = GpuTypeSpec("T4", 16 * GIB, 0.35)
ONE_T4 = Cluster(types=(T4,), gpus=(Gpu("p", 0, "T4"),))


def _plan() -> Plan:
    step = SPEED.step_time_s(Plan("T4", 1, 1, 1, 1, 0, 1, 32, 4 * GIB, 16 * GIB, 0.0), T4.speed, 1)
    return Plan("T4", 1, 1, 1, 1, 0, 1, 32, 4 * GIB, 16 * GIB, step)


def _view(jid: str, arrival: float, requested: int) -> JobView:
    return JobView(jid, arrival, requested, (_plan(),), SPEED, 20.0, 20.0)


def _holder(snap: Snapshot) -> str:
    d = SiaPolicy().decide(snap, random.Random(0))
    keep = {r.job.job_id for r in snap.running} - set(d.preemptions)
    placed = {p.job_id for p in d.placements}
    assert len(keep | placed) == 1, (d, snap)
    return (keep | placed).pop()


# Three jobs whose one configuration is one T4: they cost Sia the same, running or queued.
TIED = (_view("a", 0.0, 2), _view("b", 100.0, 1), _view("c", 200.0, 4))
NOW = 10_000.0  # long past any restart (checkpoint-restore)


def test_a_tie_leaves_the_gpu_with_the_job_that_holds_it() -> None:
    """Moving the GPU to an equal job gains Sia's objective nothing and costs a restart.  HiGHS
    gives a tie to the last of three or more rows: with running jobs listed first, the GPU went to
    the newest queued job, then back, every round."""
    for on in TIED:
        run = RunningJob(on, on.plans[0], ONE_T4.gpus, NOW - 600.0, on.plans[0].step_time_s)
        waiting = tuple(j for j in TIED if j is not on)
        assert _holder(Snapshot(NOW, "round", ONE_T4, (), waiting, (run,))) == on.job_id


def test_a_free_gpu_goes_to_the_oldest_of_equal_jobs() -> None:
    assert _holder(Snapshot(NOW, "round", ONE_T4, ONE_T4.gpus, TIED, ())) == "a"


def test_jobs_that_fit_one_gpu_all_finish() -> None:
    """The property test's failing case (seed 91749) in small: on one T4, four jobs whose only plan
    is one T4 all cost Sia the same.  The ILP's rows used to be the running job first, then the
    queue, and HiGHS gives a tie among three or more rows to the last: when ``a`` finished, from the
    first round after the restart the GPU went from ``d`` to ``c`` and back every round, neither
    finishing a step, and ``b`` waited behind them."""
    runs = (("a", 0.0, 1, 10.0), ("b", 1.0, 2, 20.0), ("c", 2.0, 4, 20.0), ("d", 3.0, 1, 20.0))
    jobs = [
        SimJob(
            job_id=jid,
            arrival_s=arrival,
            requested_gpus=requested,
            model="synthetic",
            seq_len=1024,
            global_batch=32,
            total_steps=steps,
            speed=SPEED,
            plans=(_plan(),),
            user_fits=frozenset({("T4", 1)}),
        )
        for jid, arrival, requested, steps in runs
    ]
    # Each needs < 1 min to start and < 15 min of steps: 2 h is twice what all four need.
    res = simulate(SiaPolicy(), jobs, ONE_T4, seed=0, clock=time.perf_counter, max_time_s=2 * 3600.0)
    assert {o.job_id: o.state for o in res.outcomes} == dict.fromkeys("abcd", "completed")


def test_a_job_whose_smallest_plan_is_no_configuration_starts_at_the_next_one() -> None:
    """Sia's configurations on 8-GPU nodes are 1, 2, 4, 8, 16, ... GPUs: a job whose plans are 14
    and 16 GPUs starts on 16 (it used to be offered nothing, its minimum being 14, and waited
    forever: seven jobs of the alibaba-256 gputime bench cell)."""
    v100 = GpuTypeSpec("V100", 32 * GIB, 1.0)
    two_nodes = Cluster(types=(v100,), gpus=tuple(Gpu(p, i, "V100") for p in ("p", "q") for i in range(8)))
    plans = tuple(Plan("V100", n, n, 1, 1, 3, 1, 1, 20 * GIB, 32 * GIB, 10.0 / n) for n in (14, 16))
    job = JobView("big", 0.0, 1, plans, SPEED, 100.0, 100.0)
    d = SiaPolicy().decide(Snapshot(NOW, "arrival", two_nodes, two_nodes.gpus, (job,), ()), random.Random(0))
    assert [(p.job_id, p.plan.gpus, len(p.gpus)) for p in d.placements] == [("big", 16, 16)]
