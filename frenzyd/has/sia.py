"""Sia (Jayaram Subramanya et al., SOSP 2023) as a baseline: the per-round goodput ILP, solved by HiGHS.

Faithful to the paper and its artifact (``siasosp23/artifacts``,
``sia-simulator/sia.py``; ANCHORS.md "Schedulers"):

* configurations per GPU type: powers of two inside one node (1, 2, 4, ... up
  to the type's largest node) plus whole nodes (k × node size, k ≥ 2), so
  ``N + log2 R`` per type;
* goodput matrix ``G[i, j]`` = the job's throughput (steps/s; an LLM job of
  fixed global batch has statistical efficiency 1) on configuration j, from
  the same speed model and MARP feasibility every policy gets (a
  configuration without a feasible plan is not offered: Sia's profiling
  would reveal the out-of-memory error); each row normalised by its smallest
  non-zero entry;
* restart factor ``r_i = max(T_i − N_i·S_i, 0)/(T_i + S_i)`` multiplies the
  goodput of every configuration other than the job's current one
  (``r_i = 1`` while ``T_i < S_i``), T age, N restarts, S restart cost;
* objective with ``p = −0.5``: minimise ``Σ A·round(G^p, 2) + λ·(#jobs − Σ A)``,
  ``λ = 1.1``; constraints: at most one configuration per job, per type GPUs
  used ≤ GPUs in the cluster, jobs in their restart (checkpoint-restore)
  keep their configuration; a job that is not running may only take its
  smallest configuration on a type (one with a feasible plan), a running job
  at most twice its current count;
* ties between equal-objective allocations (common: a job with one
  configuration costs the same running or queued) are broken on purpose, not
  by the solver's row order: a running job keeps its configuration (a move
  would cost a restart for nothing), then the oldest job first; each cost
  moves by less than ``TIE_SPAN / #jobs`` so no tie-break outweighs the 0.01
  step of ``round(G^p, 2)``;
* binary ILP solved by HiGHS (``scipy.optimize.milp``; HiGHS' MIP search is
  single-threaded) with ``mip_rel_gap = 1 %`` (the artifact: CBC at 1 %) and a
  per-solve time limit; a solve that hits the limit is counted
  (``Decision.solver_timeouts``) and its best incumbent used (none: no change);
* 60 s rounds; placement as the artifact's simulator does: unchanged
  allocations keep their GPUs, the rest are placed largest first on whole or
  best-fitting nodes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from frenzyd.has.interface import Cluster, Decision, Gpu, JobView, Placement, Snapshot, pick_packed
from frenzyd.marp.spec import Plan

P_FAIRNESS = -0.5
LAMBDA_NO_ALLOC = 1.1
ROUND_S = 60.0
MIP_REL_GAP = 0.01
DEFAULT_TIME_LIMIT_S = 10.0
ZERO_ALLOC_GAIN = 1e-4
TIE_SPAN = 0.004


@dataclass(frozen=True, slots=True)
class Config:
    """A Sia configuration: ``gpus`` GPUs of ``gpu_type`` on ``nodes`` nodes."""

    gpu_type: str
    nodes: int
    gpus: int


def configurations(cluster: Cluster) -> list[Config]:
    """Per type: powers of two inside the largest node, then whole nodes (k × node size, k ≥ 2)."""
    per_peer = cluster.max_per_peer()
    totals: dict[str, int] = {}
    for g in cluster.gpus:
        totals[g.gpu_type] = totals.get(g.gpu_type, 0) + 1
    out: list[Config] = []
    for t in sorted(per_peer):
        r = per_peer[t]
        n = 1
        while n <= r:
            out.append(Config(t, 1, n))
            n *= 2
        if out[-1].gpus != r:
            out.append(Config(t, 1, r))
        for k in range(2, totals[t] // r + 1):
            out.append(Config(t, k, k * r))
    return out


def _same_config(a: Plan, b: Plan) -> bool:
    """Sia's configuration: GPU type and count (the plan inside it may differ)."""
    return (a.gpu_type, a.gpus) == (b.gpu_type, b.gpus)


class SiaPolicy:
    """Sia's ILP policy (see module docstring); ``time_limit_s`` caps each HiGHS solve."""

    name = "sia"
    round_s: float | None = ROUND_S

    def __init__(self, time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> None:
        self.time_limit_s = time_limit_s
        self._configs: tuple[Cluster, list[Config]] | None = None

    def _cfgs(self, cluster: Cluster) -> list[Config]:
        if self._configs is None or self._configs[0] is not cluster:
            self._configs = (cluster, configurations(cluster))
        return self._configs[1]

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        cluster = snapshot.cluster
        configs = self._cfgs(cluster)
        speeds = {t.name: t.speed for t in cluster.types}
        running = {r.job.job_id: r for r in snapshot.running}
        # Rows in arrival order (the artifact's job list is in submission order) for the tie-break.
        jobs: list[JobView] = sorted(
            [r.job for r in snapshot.running] + list(snapshot.queued), key=lambda j: (j.arrival_s, j.job_id)
        )
        if not jobs:
            return Decision()
        totals: dict[str, int] = {}
        for g in cluster.gpus:
            totals[g.gpu_type] = totals.get(g.gpu_type, 0) + 1
        cols: list[tuple[int, int, Plan]] = []  # (job index, config index, plan)
        cost: list[float] = []
        fixed: list[int] = []
        now = snapshot.now_s
        # Equal-objective allocations are common (a job with one configuration costs the same running
        # or queued) and HiGHS settles them by row position (the last of three or more rows): running
        # jobs listed first once handed their GPUs to the last queued job and back every round, each
        # restart losing the round's progress.  So the tie-break is explicit: the current
        # configuration of a running job, then older jobs.  Any two allocations' tie terms differ by
        # less than 2 * TIE_SPAN < 0.01, the step of the rounded costs.
        tie = TIE_SPAN / len(jobs)
        for i, job in enumerate(jobs):
            plan_of = {(p.gpu_type, p.gpus): p for p in job.plans}
            # The smallest configuration with a plan, not the smallest plan: a job whose smallest plan
            # is no configuration (14 GPUs of a type with 8-GPU nodes) starts at the next (16).
            min_on: dict[str, int] = {}
            for c in configs:
                if (c.gpu_type, c.gpus) in plan_of:
                    min_on[c.gpu_type] = min(min_on.get(c.gpu_type, c.gpus), c.gpus)
            run = running.get(job.job_id)
            current = (run.plan.gpu_type, run.plan.gpus) if run else None
            good: list[tuple[int, Plan, float]] = []
            for c_idx, c in enumerate(configs):
                plan = plan_of.get((c.gpu_type, c.gpus))
                if plan is None:
                    continue
                if run is None:
                    if c.gpus != min_on[c.gpu_type]:
                        continue
                elif c.gpus > max(min_on[c.gpu_type], 2 * run.plan.gpus) and (c.gpu_type, c.gpus) != current:
                    continue
                gp = 1.0 / job.speed.step_time_s(plan, speeds[c.gpu_type], c.nodes)
                good.append((c_idx, plan, gp))
            if not good:
                continue
            g_min = min(gp for _, _, gp in good)
            age = now - job.arrival_s
            s_cost = job.restart_cost_s
            realloc = 1.0 if age < s_cost else max(age - job.restarts * s_cost, 0.0) / (age + s_cost)
            restoring = run is not None and now < run.started_s + s_cost
            for c_idx, plan, gp in good:
                c = configs[c_idx]
                is_current = current == (c.gpu_type, c.gpus)
                if restoring and not is_current:
                    continue
                norm = gp / g_min
                if run is not None and not is_current:
                    norm *= realloc
                a = round(max(norm, ZERO_ALLOC_GAIN) ** P_FAIRNESS, 2)
                if restoring:
                    fixed.append(len(cols))
                cols.append((i, c_idx, plan))
                cost.append(a - LAMBDA_NO_ALLOC + (-tie if is_current else tie * (i + 1) / len(jobs)))
        if not cols:
            return Decision()
        chosen, timed_out = self._solve(
            cols, cost, fixed=fixed, configs=configs, n_jobs=len(jobs), totals=totals
        )
        if chosen is None:
            return Decision(solver_timeouts=int(timed_out))
        return self._place(snapshot, jobs, chosen, configs, int(timed_out))

    def _solve(
        self,
        cols: list[tuple[int, int, Plan]],
        cost: list[float],
        *,
        fixed: list[int],
        configs: list[Config],
        n_jobs: int,
        totals: dict[str, int],
    ) -> tuple[dict[int, tuple[int, Plan]] | None, bool]:
        # SciPy is imported here, not at module import: it pulls in threading and socket, which the
        # pure core must not (tests/test_core_purity.py); the solver itself is single-threaded.
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_array

        n = len(cols)
        types = sorted(totals)
        t_index = {t: k for k, t in enumerate(types)}
        rows = np.array([i for i, _, _ in cols] + [n_jobs + t_index[configs[c].gpu_type] for _, c, _ in cols])
        colidx = np.concatenate([np.arange(n), np.arange(n)])
        vals = np.array([1.0] * n + [float(configs[c].gpus) for _, c, _ in cols])
        a = csr_array((vals, (rows, colidx)), shape=(n_jobs + len(types), n))
        ub = np.array([1.0] * n_jobs + [float(totals[t]) for t in types])
        lb_x = np.zeros(n)
        lb_x[fixed] = 1.0
        res = milp(
            c=np.array(cost),
            integrality=np.ones(n),
            bounds=Bounds(lb_x, np.ones(n)),
            constraints=LinearConstraint(a, -np.inf, ub),
            options={"mip_rel_gap": MIP_REL_GAP, "time_limit": self.time_limit_s, "presolve": True},
        )
        timed_out = res.status == 1
        if res.x is None:
            return None, timed_out
        chosen: dict[int, tuple[int, Plan]] = {}
        for k, x in enumerate(res.x):
            if x > 0.5:
                i, c_idx, plan = cols[k]
                chosen[i] = (c_idx, plan)
        return chosen, timed_out

    def _place(
        self,
        snapshot: Snapshot,
        jobs: list[JobView],
        chosen: dict[int, tuple[int, Plan]],
        configs: list[Config],
        timeouts: int,
    ) -> Decision:
        running = {r.job.job_id: r for r in snapshot.running}
        free: dict[str, dict[str, list[Gpu]]] = {}
        for g in snapshot.free:
            free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
        preempt: list[str] = []
        keep: set[str] = set()
        todo: list[tuple[int, JobView, Plan]] = []
        for i, job in enumerate(jobs):
            run = running.get(job.job_id)
            pick = chosen.get(i)
            if run is not None and pick is not None and _same_config(pick[1], run.plan):
                keep.add(job.job_id)
                continue
            if run is not None:
                preempt.append(job.job_id)
                for g in run.gpus:
                    free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
            if pick is not None:
                todo.append((configs[pick[0]].gpus, job, pick[1]))
        placements: list[Placement] = []
        for _, job, plan in sorted(todo, key=lambda x: (-x[0], x[1].job_id)):
            gpus = pick_packed(free.get(plan.gpu_type, {}), plan.gpus, plan.tp)
            if gpus is None:
                continue
            for g in gpus:
                free[plan.gpu_type][g.peer].remove(g)
            placements.append(Placement(job.job_id, plan, tuple(gpus)))
        # A running job whose new configuration could not be placed waits (its GPUs went to others).
        return Decision(placements=tuple(placements), preemptions=tuple(preempt), solver_timeouts=timeouts)
