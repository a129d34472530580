"""FIFO first-fit, as users run clusters without a memory predictor (DESIGN.md §4 ``fifo``).

Each queued job, in arrival order, asks for the GPU count the user gave
(the trace's, doubled by the simulator after each out-of-memory failure,
capped at the largest type's size), takes the first GPU type (in cluster
order) that has that many GPUs free, and the first free GPUs of that type in
(peer, index) order, with the plan a user would write without a predictor:
plain ZeRO-3 (FSDP) data parallelism, micro-batch 1 (the safest choice),
gradient accumulation up to the global batch.  A job that does not fit in
memory fails after its restart cost and is resubmitted with twice the GPUs,
at most three times (the simulator enforces the memory).  Jobs that do not
fit now are skipped, so later ones may start (first fit, no head-of-line
blocking).  O(Q·T + G) per round for Q queued jobs, T types, G free GPUs.
"""

from __future__ import annotations

import random

from frenzyd.has.interface import Decision, Gpu, JobView, Placement, Snapshot
from frenzyd.marp.spec import Plan


def user_plan(job: JobView, gpu_type: str, gpus: int, *, memory_bytes: int, speed: float, peers: int) -> Plan:
    """The predictor-less user's plan: ZeRO-3 dp over ``gpus`` GPUs, micro-batch 1."""
    accum = max(1, job.global_batch // gpus)
    draft = Plan(gpu_type, gpus, gpus, 1, 1, 3, 1, accum, 0, memory_bytes, 0.0)
    step = job.speed.step_time_s(draft, speed, peers)
    return Plan(gpu_type, gpus, gpus, 1, 1, 3, 1, accum, 0, memory_bytes, step)


class FifoPolicy:
    """First-fit in arrival order, trace GPU count, any type, ZeRO-3 (see module docstring)."""

    name = "fifo"
    round_s: float | None = None

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        cluster = snapshot.cluster
        order: list[str] = []
        total: dict[str, int] = {}
        for g in cluster.gpus:
            if g.gpu_type not in total:
                order.append(g.gpu_type)
            total[g.gpu_type] = total.get(g.gpu_type, 0) + 1
        largest = max(total.values(), default=0)
        free: dict[str, list[Gpu]] = {t: [] for t in order}
        for g in sorted(snapshot.free):
            free[g.gpu_type].append(g)
        placements: list[Placement] = []
        for job in snapshot.queued:
            n = min(job.requested_gpus, largest)
            for t in order:
                if len(free[t]) >= n:
                    gpus = tuple(free[t][:n])
                    del free[t][:n]
                    spec = cluster.type_spec(t)
                    peers = len({g.peer for g in gpus})
                    plan = user_plan(job, t, n, memory_bytes=spec.memory_bytes, speed=spec.speed, peers=peers)
                    placements.append(Placement(job.job_id, plan, gpus))
                    break
        return Decision(placements=tuple(placements))
