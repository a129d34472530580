"""A size-aware reference: preemptive shortest-remaining-time-first on MARP's plans, best fit, backfilling.

The theoretical anchor when job sizes are known (SRPT minimises mean
response time on one server: Schrage 1968; its multi-server form is the
standard size-aware reference, e.g. Tiresias' "SRTF" oracle baseline, Gu et
al. NSDI 2019): every policy that reads a job's declared work should beat
the plain rule, or its extra rules are not earning their keep.

* **Size**: a queued job's remaining time is its remaining steps × its
  plan's step time (the plan below on its fastest type); a running job's is
  its remaining steps × the step time where it runs
  (``RunningJob.step_time_s``, else the speed model).
* **Plan** (memory-aware, from MARP's plans only): on each GPU type the
  user's GPU budget: the fastest plan with at most the GPU count the user
  asked for (``requested_gpus``), else the smallest feasible plan above it.
  No elastic resizing: the reference isolates the value of knowing sizes.
* **Order**: queued jobs shortest remaining time first (ties: arrival, id).
* **Place** (heterogeneity-aware): the type where the job would end soonest
  among those with enough free GPUs; best fit (one peer with the fewest
  spare GPUs that suffices, else the fullest peers; tp groups inside a peer).
* **Backfill**: a job that does not fit now is skipped and later, shorter
  or smaller ones may start (no reservation).
* **Preempt**: a job that fits nowhere may stop running jobs of one type,
  longest remaining time first, each only when it has more time left than
  the newcomer plus its own restart cost (the newcomer's gain outweighs the
  stopped job's delay: SRPT's exchange argument with a cost per preemption),
  and only if that frees enough GPUs; the type where it then ends soonest
  wins.  Stopped jobs return to the queue (the simulator charges their
  checkpoint costs, as for every policy).

Event-driven (arrivals, completions): SRTF's order only changes then.
O(Q log Q + Q·(K + T·R)) per round for Q queued, R running jobs, K plans, T types.
"""

from __future__ import annotations

import random

from frenzyd.has.interface import Decision, Gpu, JobView, Placement, Snapshot, pick_packed
from frenzyd.marp.spec import Plan


def budget_plan(job: JobView, gpu_type: str) -> Plan | None:
    """The fastest plan of ``gpu_type`` within the user's GPU count, else the smallest feasible above it."""
    want = max(1, job.requested_gpus)
    within: Plan | None = None
    above: Plan | None = None
    for p in job.plans:
        if p.gpu_type != gpu_type:
            continue
        if p.gpus <= want:
            if within is None or (p.step_time_s, p.gpus) < (within.step_time_s, within.gpus):
                within = p
        elif above is None or (p.gpus, p.step_time_s) < (above.gpus, above.step_time_s):
            above = p
    return within if within is not None else above


def budget_plans(job: JobView) -> dict[str, Plan]:
    """:func:`budget_plan` on every type the job has a plan on."""
    out: dict[str, Plan] = {}
    for t in sorted({p.gpu_type for p in job.plans}):
        plan = budget_plan(job, t)
        if plan is not None:
            out[t] = plan
    return out


def free_index(free: tuple[Gpu, ...]) -> dict[str, dict[str, list[Gpu]]]:
    """Free GPUs by type, then peer."""
    out: dict[str, dict[str, list[Gpu]]] = {}
    for g in free:
        out.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
    return out


def take(index: dict[str, dict[str, list[Gpu]]], gpus: list[Gpu]) -> None:
    """Remove ``gpus`` from the free index."""
    for g in gpus:
        peers = index[g.gpu_type]
        peers[g.peer].remove(g)
        if not peers[g.peer]:
            del peers[g.peer]


def give(index: dict[str, dict[str, list[Gpu]]], gpus: tuple[Gpu, ...]) -> None:
    """Return ``gpus`` to the free index."""
    for g in gpus:
        index.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)


class SrtfPolicy:
    """Preemptive SRTF with best fit and backfilling (see module docstring)."""

    name = "srtf"
    round_s: float | None = None

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        speeds = {t.name: t.speed for t in snapshot.cluster.types}
        index = free_index(snapshot.free)
        running: dict[str, tuple[float, float, str, tuple[Gpu, ...]]] = {}
        for r in snapshot.running:
            step = r.step_time_s
            if step is None:
                step = r.job.speed.step_time_s(r.plan, speeds[r.plan.gpu_type], len({g.peer for g in r.gpus}))
            left = r.job.remaining_steps * step
            running[r.job.job_id] = (left, r.job.restart_cost_s, r.plan.gpu_type, r.gpus)
        order = []
        for job in snapshot.queued:
            plans = budget_plans(job)
            if not plans:
                continue
            best = min(p.step_time_s for p in plans.values())
            order.append((job.remaining_steps * best, job.arrival_s, job.job_id, job, plans))
        order.sort(key=lambda e: e[:3])
        placements: list[Placement] = []
        stopped: list[str] = []
        for _, _, _, job, plans in order:
            placed = self._place_free(job, self._free_choices(job, plans), index)
            if placed is None:
                placed = self._place_by_stopping(job, plans, index, running, stopped)
            if placed is not None:
                placements.append(placed)
        return Decision(placements=tuple(placements), preemptions=tuple(stopped))

    def _free_choices(self, job: JobView, plans: dict[str, Plan]) -> list[Plan]:
        """The plans a job may start on free GPUs with: its budget plan on each type."""
        del job
        return list(plans.values())

    @staticmethod
    def _place_free(
        job: JobView, choices: list[Plan], index: dict[str, dict[str, list[Gpu]]]
    ) -> Placement | None:
        best: tuple[float, str, Plan, list[Gpu]] | None = None
        for plan in choices:
            t = plan.gpu_type
            peers = index.get(t, {})
            if sum(len(gs) for gs in peers.values()) < plan.gpus:
                continue
            gpus = pick_packed(peers, plan.gpus, plan.tp)
            if gpus is None:
                continue
            key = (job.remaining_steps * plan.step_time_s, t)
            if best is None or key < best[:2]:
                best = (key[0], t, plan, gpus)
        if best is None:
            return None
        take(index, best[3])
        return Placement(job.job_id, best[2], tuple(best[3]))

    @staticmethod
    def _place_by_stopping(
        job: JobView,
        plans: dict[str, Plan],
        index: dict[str, dict[str, list[Gpu]]],
        running: dict[str, tuple[float, float, str, tuple[Gpu, ...]]],
        stopped: list[str],
    ) -> Placement | None:
        best: tuple[float, str, Plan, list[str]] | None = None
        for t, plan in plans.items():
            have = sum(len(gs) for gs in index.get(t, {}).values())
            victims = sorted(
                (
                    (-left, jid)
                    for jid, (left, restart, gt, _) in running.items()
                    if gt == t and left > job.remaining_steps * plan.step_time_s + restart
                ),
            )
            chosen: list[str] = []
            for _, jid in victims:
                if have >= plan.gpus:
                    break
                chosen.append(jid)
                have += len(running[jid][3])
            if have < plan.gpus or not chosen:
                continue
            key = job.remaining_steps * plan.step_time_s
            if best is None or (key, t) < best[:2]:
                best = (key, t, plan, chosen)
        if best is None:
            return None
        _, t, plan, chosen = best
        trial = {p: list(gs) for p, gs in index.get(t, {}).items()}
        for jid in chosen:
            for g in running[jid][3]:
                trial.setdefault(g.peer, []).append(g)
        gpus = pick_packed(trial, plan.gpus, plan.tp)
        if gpus is None:
            return None  # enough GPUs, but tp groups would span peers: wait instead
        for jid in chosen:
            give(index, running.pop(jid)[3])
            stopped.append(jid)
        take(index, gpus)
        return Placement(job.job_id, plan, tuple(gpus))


class SrtfWidePolicy(SrtfPolicy):
    """The reference, elastic at start: on free GPUs a job takes whichever of its plans ends it soonest.

    The same order, backfilling and preemption as :class:`SrtfPolicy`, but a
    job that starts on free GPUs may use any of MARP's plans that the free
    GPUs hold, not only the user's GPU count: at low load, spreading a job
    over idle GPUs shortens it (no resizing once it runs).  The benchmark
    compares Frenzy with the better of the two references in each cell, so
    the reference is not weakened by either plan rule.
    """

    name = "srtf-wide"

    def _free_choices(self, job: JobView, plans: dict[str, Plan]) -> list[Plan]:
        return list(job.plans)
