"""Gavel (Narayanan et al., OSDI 2020) as a baseline: throughput-normalised max-min fairness LP, 360 s rounds.

Faithful to the paper and ``stanford-futuredata/gavel`` (ANCHORS.md):

* allocation ``X[m, j]`` = fraction of time job m spends on GPU type j;
  constraints ``X ≥ 0``, ``Σ_j X[m, j] ≤ 1``, ``Σ_m X[m, j]·s[m, j] ≤ #GPUs of j``;
* policy ``max_min_fairness`` with performance: maximise ``min_m Σ_j
  T[m, j]·X[m, j] / T_eq[m]``, with ``T_eq[m]`` the job's throughput when
  every type is time-shared in proportion to its size (Gavel's proportional
  share), followed by a water-filling pass that keeps the max-min level and
  maximises the total normalised throughput (so no GPU idles that a job
  could use: the stronger variant of the policy);
* Gavel's jobs are rigid: ``s[m, j]`` is the GPU count the user asked for,
  raised to the smallest count with a MARP-feasible plan on type j (else the
  largest feasible count below it; the same feasibility information every
  policy gets), ``T[m, j]`` that plan's
  throughput from the speed model; types with no such plan get ``X = 0``;
* round-based mechanism, 360 s rounds: (job, type) pairs are granted GPUs in
  order of priority ``X[m, j] / (fraction of time received on j so far)``,
  one type per job per round; a job granted the type it holds keeps its
  GPUs (no restart).  Between rounds (arrivals, completions) only free GPUs
  are granted, in the same priority order, without preemption.
* LPs solved by HiGHS (``scipy.optimize.linprog``).
"""

from __future__ import annotations

import random

import numpy as np

from frenzyd.has.interface import Decision, Gpu, JobView, Placement, Snapshot, pick_packed
from frenzyd.marp.spec import Plan

ROUND_S = 360.0


def rigid_plan(job: JobView, gpu_type: str, capacity: int) -> Plan | None:
    """The user's GPU count on ``gpu_type``, raised to the smallest count with a feasible plan.

    When no feasible plan is that large (the ask exceeds what the type has, or
    MARP's plans stop below it), the largest feasible plan below the ask.
    """
    want = min(job.requested_gpus, capacity)
    up: Plan | None = None
    down: Plan | None = None
    for p in job.plans:
        if p.gpu_type != gpu_type:
            continue
        if p.gpus >= want and (up is None or p.gpus < up.gpus):
            up = p
        if p.gpus < want and (down is None or p.gpus > down.gpus):
            down = p
    return up if up is not None else down


def max_min_allocation(thr: np.ndarray, scale: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Gavel's max-min fairness LP (+ water-filling) for throughputs ``thr`` [M×J] (0 = not allowed).

    Returns X [M×J].  ``scale`` [M×J] GPUs per (job, type), ``cap`` [J] GPUs per type.
    """
    # Imported here: SciPy pulls in threading and socket, which the pure core must not at import.
    from scipy.optimize import linprog
    from scipy.sparse import csr_array

    m, nj = thr.shape
    total = cap.sum()
    t_eq = (thr * cap[None, :]).sum(axis=1) / max(total, 1)
    t_eq[t_eq <= 0] = 1.0
    norm = thr / t_eq[:, None]
    allowed = thr > 0
    idx = np.argwhere(allowed)
    nv = len(idx)
    if nv == 0:
        return np.zeros_like(thr)
    # variables: x_k for allowed pairs, then t (max-min level)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    b: list[float] = []
    for k, (i, _) in enumerate(idx):  # Σ_j x[i, j] ≤ 1
        rows.append(int(i))
        cols.append(k)
        vals.append(1.0)
    r = int(m)
    b.extend([1.0] * m)
    for k, (i, j) in enumerate(idx):  # Σ_i x[i, j]·s ≤ cap_j
        rows.append(r + int(j))
        cols.append(k)
        vals.append(float(scale[i, j]))
    b.extend(float(c) for c in cap)
    r += nj
    jobs_with = sorted({int(i) for i, _ in idx})
    for q, i in enumerate(jobs_with):  # t − Σ_j norm·x ≤ 0
        for kk in np.nonzero(idx[:, 0] == i)[0]:
            rows.append(r + q)
            cols.append(int(kk))
            vals.append(-float(norm[i, idx[kk, 1]]))
        rows.append(r + q)
        cols.append(nv)
        vals.append(1.0)
    b.extend([0.0] * len(jobs_with))
    a = csr_array((vals, (rows, cols)), shape=(r + len(jobs_with), nv + 1))
    c = np.zeros(nv + 1)
    c[nv] = -1.0
    bounds = [(0.0, 1.0)] * nv + [(0.0, None)]
    res = linprog(c, A_ub=a, b_ub=np.array(b), bounds=bounds, method="highs")
    if res.status != 0:
        return np.zeros_like(thr)
    level = float(res.x[nv])
    # water-filling: keep every job at ≥ level, maximise total normalised throughput
    c2 = np.zeros(nv + 1)
    c2[:nv] = -np.array([norm[i, j] for i, j in idx])
    bounds2 = [(0.0, 1.0)] * nv + [(level * (1 - 1e-6), None)]
    res2 = linprog(c2, A_ub=a, b_ub=np.array(b), bounds=bounds2, method="highs")
    x = res2.x if res2.status == 0 else res.x
    out = np.zeros_like(thr)
    for k, (i, j) in enumerate(idx):
        out[i, j] = max(0.0, float(x[k]))
    return out


class GavelPolicy:
    """Gavel's max-min fairness with its round-based mechanism (see module docstring)."""

    name = "gavel"
    round_s: float | None = ROUND_S

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        cluster = snapshot.cluster
        types = sorted({g.gpu_type for g in cluster.gpus})
        cap = np.array([sum(1 for g in cluster.gpus if g.gpu_type == t) for t in types], dtype=float)
        speeds = {t.name: t.speed for t in cluster.types}
        per_peer = cluster.max_per_peer()
        running = {r.job.job_id: r for r in snapshot.running}
        jobs = [r.job for r in snapshot.running] + list(snapshot.queued)
        if not jobs:
            return Decision()
        m, nj = len(jobs), len(types)
        thr = np.zeros((m, nj))
        scale = np.zeros((m, nj))
        plans: dict[tuple[int, int], Plan] = {}
        for i, job in enumerate(jobs):
            for j, t in enumerate(types):
                p = rigid_plan(job, t, int(cap[j]))
                if p is None:
                    continue
                peers = max(1, -(-p.gpus // per_peer[t]))
                thr[i, j] = 1.0 / job.speed.step_time_s(p, speeds[t], peers)
                scale[i, j] = p.gpus
                plans[(i, j)] = p
        x = max_min_allocation(thr, scale, cap)
        now = snapshot.now_s
        prio: list[tuple[float, str, int, int]] = []
        for (i, j), _ in plans.items():
            if x[i, j] <= 1e-9:
                continue
            job = jobs[i]
            elapsed = max(now - job.arrival_s, 1e-9)
            got = dict(job.service_s).get(types[j], 0.0) / max(scale[i, j], 1.0) / elapsed
            pr = float(x[i, j] / got) if got > 0 else float("inf")
            prio.append((-pr, job.job_id, i, j))
        prio.sort()
        full_round = snapshot.reason == "round"
        free: dict[str, dict[str, list[Gpu]]] = {}
        for g in snapshot.free:
            free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
        granted: set[int] = set()
        keep: set[str] = set()
        placements: list[Placement] = []
        if full_round:
            # Every running job is up for renewal: give its GPUs back to the pool for this round.
            for r in snapshot.running:
                for g in r.gpus:
                    free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
        else:
            granted.update(i for i, job in enumerate(jobs) if job.job_id in running)
        for _, jid, i, j in prio:
            if i in granted:
                continue
            t = types[j]
            plan = plans[(i, j)]
            run = running.get(jid)
            if (
                run is not None
                and run.plan == plan
                and all(g in free.get(t, {}).get(g.peer, []) for g in run.gpus)
            ):
                for g in run.gpus:
                    free[t][g.peer].remove(g)
                granted.add(i)
                keep.add(jid)
                continue
            gpus = pick_packed(free.get(t, {}), plan.gpus, plan.tp)
            if gpus is None:
                continue
            for g in gpus:
                free[t][g.peer].remove(g)
            granted.add(i)
            placements.append(Placement(jid, plan, tuple(gpus)))
        # Every running job not renewed in place stops first (moved ones restart elsewhere).
        preempt = [jid for jid in running if jid not in keep and full_round]
        return Decision(placements=tuple(placements), preemptions=tuple(sorted(preempt)))
