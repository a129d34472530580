"""Tiresias (2D-LAS) and the size-aware SRTF reference on small hand-made cases."""

from __future__ import annotations

import random

from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, JobView, RunningJob, Snapshot
from frenzyd.has.speed import JobSpeed
from frenzyd.has.srtf import SrtfPolicy, budget_plan
from frenzyd.has.tiresias import QUEUE_LIMITS_GPU_S, TiresiasPolicy, queue_of
from frenzyd.marp.spec import Plan

GIB = 1 << 30
SPEED = JobSpeed(10**9, 1e15)  # restart cost 30 + 12 = 42 s


def _cluster(v100: int = 2, t4: int = 2) -> Cluster:
    gpus = [Gpu("v", i, "V100") for i in range(v100)] + [Gpu("t", i, "T4") for i in range(t4)]
    return Cluster(
        types=(GpuTypeSpec("T4", 16 * GIB, 0.35), GpuTypeSpec("V100", 16 * GIB, 1.0)),
        gpus=tuple(sorted(gpus)),
    )


def _plan(t: str, n: int, step: float) -> Plan:
    return Plan(t, n, n, 1, 1, 0, 1, 1, GIB, 16 * GIB, step)


def _job(jid: str, steps: float, *, served: float = 0.0, gpus: int = 1, arrival: float = 0.0) -> JobView:
    plans = tuple([_plan("V100", n, 1.0 / n) for n in (1, 2)] + [_plan("T4", n, 3.0 / n) for n in (1, 2)])
    return JobView(jid, arrival, gpus, plans, SPEED, steps, steps, service_s=(("V100", served),))


def _running(job: JobView, gpus: tuple[Gpu, ...]) -> RunningJob:
    plan = next(p for p in job.plans if p.gpu_type == gpus[0].gpu_type and p.gpus == len(gpus))
    return RunningJob(job, plan, gpus, 0.0, plan.step_time_s)


def _snap(cluster: Cluster, queued: tuple[JobView, ...], running: tuple[RunningJob, ...]) -> Snapshot:
    busy = {g for r in running for g in r.gpus}
    free = tuple(g for g in cluster.gpus if g not in busy)
    return Snapshot(100.0, "arrival", cluster, free, queued, running)


def test_budget_plan_is_the_fastest_within_the_ask_else_the_smallest_above() -> None:
    job = _job("a", 10.0, gpus=2)
    assert budget_plan(job, "V100") == _plan("V100", 2, 0.5)
    one = _job("b", 10.0, gpus=1)
    assert budget_plan(one, "T4") == _plan("T4", 1, 3.0)
    big_only = JobView("c", 0.0, 1, (_plan("V100", 4, 0.2),), SPEED, 1.0, 1.0)
    assert budget_plan(big_only, "V100") == _plan("V100", 4, 0.2)
    assert budget_plan(big_only, "T4") is None


def test_tiresias_queues_follow_attained_gpu_seconds() -> None:
    lo, hi = QUEUE_LIMITS_GPU_S
    assert [queue_of(_job("j", 1.0, served=s)) for s in (0.0, lo - 1, lo, hi - 1, hi, 1e9)] == [
        0,
        0,
        1,
        1,
        2,
        2,
    ]


def test_tiresias_stops_a_demoted_job_for_a_new_one_whatever_their_sizes() -> None:
    cluster = _cluster(v100=1, t4=0)
    old = _running(_job("old", 10.0, served=QUEUE_LIMITS_GPU_S[0]), (Gpu("v", 0, "V100"),))
    new = _job("new", 1e6, arrival=50.0)  # far longer: Tiresias does not know
    d = TiresiasPolicy().decide(_snap(cluster, (new,), (old,)), random.Random(0))
    assert d.preemptions == ("old",)
    assert [(p.job_id, p.gpus) for p in d.placements] == [("new", (Gpu("v", 0, "V100"),))]


def test_tiresias_never_stops_a_running_job_for_one_of_its_own_queue() -> None:
    cluster = _cluster(v100=1, t4=0)
    old = _running(_job("old", 1e6, arrival=10.0), (Gpu("v", 0, "V100"),))
    d = TiresiasPolicy().decide(_snap(cluster, (_job("new", 1.0, arrival=0.0),), (old,)), random.Random(0))
    assert d.preemptions == ()
    assert d.placements == ()


def test_tiresias_starts_a_job_on_its_fastest_type_with_room() -> None:
    d = TiresiasPolicy().decide(_snap(_cluster(), (_job("a", 10.0),), ()), random.Random(0))
    assert [p.plan.gpu_type for p in d.placements] == ["V100"]


def test_srtf_starts_the_shortest_first_and_backfills() -> None:
    cluster = _cluster(v100=1, t4=1)
    long_, short = _job("long", 1e5, arrival=0.0), _job("short", 10.0, arrival=5.0)
    d = SrtfPolicy().decide(_snap(cluster, (long_, short), ()), random.Random(0))
    # shortest first takes the V100; the long job backfills the T4 instead of waiting
    assert {p.job_id: p.plan.gpu_type for p in d.placements} == {"short": "V100", "long": "T4"}
    assert d.preemptions == ()


def test_srtf_stops_a_longer_job_only_when_the_newcomer_gains_more_than_the_restart() -> None:
    cluster = _cluster(v100=1, t4=0)
    gpu = (Gpu("v", 0, "V100"),)
    d = SrtfPolicy().decide(
        _snap(cluster, (_job("new", 10.0),), (_running(_job("old", 1e4), gpu),)), random.Random(0)
    )
    assert d.preemptions == ("old",)
    assert [p.job_id for p in d.placements] == ["new"]
    # old has 60 s left: less than new's 10 s plus old's 42 s restart? No: 60 > 52, it still goes.
    # 50 s left is less than 10 + 42: old keeps running.
    d = SrtfPolicy().decide(
        _snap(cluster, (_job("new", 10.0),), (_running(_job("old", 50.0), gpu),)), random.Random(0)
    )
    assert d.preemptions == ()
    assert d.placements == ()
