"""Builders shared by the HAS and simulator tests: random clusters and jobs with hand-made plans.

Plans here are plain values with a stated ``bytes_per_gpu`` (what MARP would
have said); they let the policy and simulator tests run without MARP's
enumeration and vary clusters and queues freely.
"""

from __future__ import annotations

import random

from frenzyd.gpu_types import GPU_TYPES
from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, JobView, RunningJob, Snapshot
from frenzyd.has.speed import JobSpeed, flops_per_step
from frenzyd.marp.spec import Plan
from frenzyd.sim.jobs import reduce_plans
from frenzyd.sim.model import SimJob

TYPES = ("T4", "RTX-3090", "RTX-A6000", "A100-40GB", "A100-80GB")


def make_cluster(rng: random.Random, peers: int = 4, max_per_peer: int = 4) -> Cluster:
    """``peers`` peers, each with 1, 2 or 4 (≤ max_per_peer) GPUs of one random type.

    Power-of-two node sizes, as real servers have: Sia's configuration set
    (powers of two inside a node plus whole nodes) assumes them.
    """
    used: dict[str, GpuTypeSpec] = {}
    gpus: list[Gpu] = []
    for k in range(peers):
        t = rng.choice(TYPES)
        info = GPU_TYPES[t]
        used[t] = GpuTypeSpec(t, info.memory_bytes, info.speed)
        for i in range(rng.choice([n for n in (1, 2, 4) if n <= max_per_peer])):
            gpus.append(Gpu(f"peer-{k:02d}", i, t))
    return Cluster(types=tuple(used[t] for t in sorted(used)), gpus=tuple(sorted(gpus)))


def job_plans(cluster: Cluster, need_bytes: float, global_batch: int) -> list[Plan]:
    """ZeRO-3 dp plans (and 2-way tp inside a peer) whose per-GPU share ``need_bytes / n`` fits."""
    counts: dict[str, int] = {}
    for g in cluster.gpus:
        counts[g.gpu_type] = counts.get(g.gpu_type, 0) + 1
    out = []
    for t in cluster.types:
        n = 1
        while n <= counts[t.name]:
            per = int(need_bytes / n)
            if per <= t.memory_bytes:
                out.append(
                    Plan(
                        t.name,
                        n,
                        n,
                        1,
                        1,
                        3 if n > 1 else 0,
                        1,
                        max(1, global_batch // n),
                        per,
                        t.memory_bytes,
                        1.0,
                    )
                )
                if n >= 2:
                    out.append(
                        Plan(
                            t.name,
                            n,
                            n // 2,
                            2,
                            1,
                            0,
                            1,
                            max(1, global_batch // (n // 2)),
                            per,
                            t.memory_bytes,
                            1.0,
                        )
                    )
            n *= 2
    return out


def make_jobs(rng: random.Random, cluster: Cluster, n: int, *, span_s: float = 3600.0) -> list[SimJob]:
    """``n`` jobs that each fit somewhere on ``cluster`` (memory 4..200 GB, 50..2000 steps)."""
    jobs = []
    for i in range(n):
        params = rng.choice((124_000_000, 774_000_000, 1_500_000_000, 7_000_000_000))
        need = rng.uniform(4e9, 2e11)
        gb = rng.choice((16, 32, 64))
        speed = JobSpeed(params, flops_per_step(params, 24, 2048, 1024, gb))
        plans = reduce_plans(job_plans(cluster, need, gb), speed, cluster)
        if not plans:
            need = 4e9
            plans = reduce_plans(job_plans(cluster, need, gb), speed, cluster)
        user = frozenset((p.gpu_type, p.gpus) for p in plans if p.tp == 1)
        jobs.append(
            SimJob(
                job_id=f"j{i:03d}",
                arrival_s=rng.uniform(0, span_s),
                requested_gpus=rng.choice((1, 1, 2, 4)),
                model="synthetic",
                seq_len=1024,
                global_batch=gb,
                total_steps=float(rng.randint(50, 2000)),
                speed=speed,
                plans=plans,
                user_fits=user,
            )
        )
    return jobs


def view(job: SimJob, remaining: float | None = None) -> JobView:
    return JobView(
        job_id=job.job_id,
        arrival_s=job.arrival_s,
        requested_gpus=job.requested_gpus,
        plans=job.plans,
        speed=job.speed,
        total_steps=job.total_steps,
        remaining_steps=job.total_steps if remaining is None else remaining,
        global_batch=job.global_batch,
    )


def random_snapshot(rng: random.Random, cluster: Cluster, jobs: list[SimJob]) -> Snapshot:
    """Some jobs running on packed GPUs (placed greedily), the rest queued."""
    free = set(cluster.gpus)
    running: list[RunningJob] = []
    queued: list[JobView] = []
    now = max(j.arrival_s for j in jobs) + 1.0
    for j in sorted(jobs, key=lambda x: x.arrival_s):
        if rng.random() < 0.4:
            for p in j.plans:
                gs = sorted(g for g in free if g.gpu_type == p.gpu_type)
                if len(gs) >= p.gpus and p.tp == 1:
                    take = tuple(gs[: p.gpus])
                    free.difference_update(take)
                    running.append(RunningJob(view(j, j.total_steps / 2), p, take, j.arrival_s))
                    break
            else:
                queued.append(view(j))
        else:
            queued.append(view(j))
    return Snapshot(now, "arrival", cluster, tuple(sorted(free)), tuple(queued), tuple(running))
