"""Frenzy's starvation reservation, on a hand-built snapshot where it decides the outcome."""

from __future__ import annotations

import random

from frenzyd.gpu_types import GPU_TYPES
from frenzyd.has import frenzy
from frenzyd.has.frenzy import FrenzyPolicy
from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, JobView, RunningJob, Snapshot
from frenzyd.marp.spec import Plan
from frenzyd.sim.speed import JobSpeed

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
    busy = job("busy", 0.0, (plan(2, 1.0),), remaining=1500.0)  # < 4x head's time left: no donor
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
