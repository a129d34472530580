"""Frenzy's heterogeneity-aware scheduler (HAS): memory-aware, speed- and work-aware greedy placement.

Algorithm, per scheduling round (an arrival, a completion, a failure):

1. **Order** the queue by aged shortest-remaining-time: ``key = R − a·W``
   with ``R`` the job's remaining steps times its fastest plan's step time,
   ``W`` its time in the queue and ``a`` = :data:`AGING` (a job that waits
   long enough comes first: no starvation by ordering).
2. **Choose a plan** for each job in that order from MARP's feasible plans
   only (so nothing is placed that does not fit in memory).  Plans are ranked
   once per job (cached) by ``cost = step_time × gpus^γ``: a doubling of the
   GPU count must buy a speed-up of at least ``2^γ`` (:data:`GAMMA` = 0.678:
   1.6x, efficiency 80 %; :data:`GAMMA_ALONE` when no other job waits), so a
   job never spreads thin while others queue.  The first plan (cheapest) whose
   GPUs are free now wins (its cost re-evaluated with the speed model when
   the free GPUs force it across peers), except that among plans within
   :data:`MEMORY_SLACK` of the best cost the one on the **smallest-memory**
   type is taken, so large-memory GPUs stay free for jobs only they can hold.
3. **Pack**: the GPUs come from one peer when one peer has them (best fit:
   the peer with the fewest free GPUs that suffices), else from the fullest
   peers, tensor-parallel groups never across peers.
4. **Reserve against starvation**: when the head job has waited longer than
   :data:`STARVATION_S` and still cannot start, the GPU type of its cheapest
   plan that the cluster can hold is reserved for it: no later job takes GPUs
   of that type in this round, so it starts as soon as enough of them free up.

Invariants: only MARP-feasible plans; no GPU given twice (a placement removes
its GPUs from the free index); tp inside one peer; deterministic (sorting
keys end with the job id; no randomness used).  Cost per round:
O(Q log Q + Q·K + G) for Q queued jobs, K plans per job (cached ranking,
early exit when no GPU is free) and G free GPUs; no solver, no preemption.
"""

from __future__ import annotations

import random

from frenzyd.has.interface import Decision, Gpu, JobView, Placement, Snapshot, pick_packed
from frenzyd.marp.spec import Plan

AGING = 0.5
"""Seconds of priority gained per second of waiting."""
GAMMA = 0.678
"""Cost exponent on the GPU count while other jobs wait: doubling must buy ≥ 1.6x."""
GAMMA_ALONE = 0.25
"""Cost exponent when the job is the last one waiting: doubling must buy ≥ 1.19x."""
MEMORY_SLACK = 0.15
"""A smaller-memory type is preferred when its plan costs at most this much more."""
STARVATION_S = 2 * 3600.0
"""Queue time after which the head job gets its GPU type reserved."""


class FrenzyPolicy:
    """Frenzy HAS (see module docstring for the algorithm, invariants and complexity)."""

    name = "frenzy"
    round_s: float | None = None

    def __init__(self) -> None:
        self._ranked: dict[tuple[str, float], tuple[tuple[float, Plan], ...]] = {}
        self._fastest: dict[str, float] = {}

    def _ranking(self, job: JobView, gamma: float) -> tuple[tuple[float, Plan], ...]:
        key = (job.job_id, gamma)
        ranked = self._ranked.get(key)
        if ranked is None:
            ranked = tuple(
                sorted(
                    ((p.step_time_s * p.gpus**gamma, p) for p in job.plans),
                    key=lambda cp: (cp[0], cp[1].gpu_type, cp[1].gpus, cp[1].tp, cp[1].pp, cp[1].zero),
                )
            )
            if len(self._ranked) > 100_000:
                self._ranked.clear()
            self._ranked[key] = ranked
        return ranked

    def _remaining_s(self, job: JobView) -> float:
        fastest = self._fastest.get(job.job_id)
        if fastest is None:
            fastest = min((p.step_time_s for p in job.plans), default=float("inf"))
            if len(self._fastest) > 100_000:
                self._fastest.clear()
            self._fastest[job.job_id] = fastest
        return job.remaining_steps * fastest

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        cluster = snapshot.cluster
        memory = {t.name: t.memory_bytes for t in cluster.types}
        speeds = {t.name: t.speed for t in cluster.types}
        total: dict[str, int] = {}
        for g in cluster.gpus:
            total[g.gpu_type] = total.get(g.gpu_type, 0) + 1
        free: dict[str, dict[str, list[Gpu]]] = {}
        free_n: dict[str, int] = {}
        for g in snapshot.free:
            free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
            free_n[g.gpu_type] = free_n.get(g.gpu_type, 0) + 1
        if not free_n or not snapshot.queued:
            return Decision()
        now = snapshot.now_s
        order = sorted(
            snapshot.queued,
            key=lambda j: (self._remaining_s(j) - AGING * (now - j.arrival_s), j.arrival_s, j.job_id),
        )
        reserved: set[str] = set()
        placements: list[Placement] = []
        left = len(order)
        for i, job in enumerate(order):
            left -= 1
            if not any(n > 0 for t, n in free_n.items() if t not in reserved):
                break
            gamma = GAMMA if left > 0 else GAMMA_ALONE
            ranked = self._ranking(job, gamma)
            candidates: list[tuple[float, Plan, list[Gpu]]] = []
            best = float("inf")
            for packed_cost, plan in ranked:
                if packed_cost > best * (1.0 + MEMORY_SLACK):
                    break  # the packed cost is a lower bound of the real one
                t = plan.gpu_type
                if t in reserved or free_n.get(t, 0) < plan.gpus:
                    continue
                gpus = pick_packed(free[t], plan.gpus, plan.tp)
                if gpus is None:
                    continue
                cost = packed_cost
                n_peers = len({g.peer for g in gpus})
                if n_peers > 1:
                    step = job.speed.step_time_s(plan, speeds[t], n_peers)
                    cost = step * plan.gpus**gamma
                candidates.append((cost, plan, gpus))
                best = min(best, cost)
            if candidates:
                _, choice, gpus = min(
                    (c for c in candidates if c[0] <= best * (1.0 + MEMORY_SLACK)),
                    key=lambda c: (memory[c[1].gpu_type], c[0], c[1].gpu_type, c[1].gpus),
                )
                for g in gpus:
                    free[choice.gpu_type][g.peer].remove(g)
                free_n[choice.gpu_type] -= len(gpus)
                placements.append(Placement(job.job_id, choice, tuple(gpus)))
                continue
            if i == 0 and now - job.arrival_s > STARVATION_S:
                for _, plan in ranked:
                    if plan.gpus <= total.get(plan.gpu_type, 0):
                        reserved.add(plan.gpu_type)
                        break
        return Decision(placements=tuple(placements))
