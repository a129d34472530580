"""Tiresias (Gu et al., NSDI 2019) as a baseline: discretised two-dimensional least-attained-service.

Size-unaware: a job's priority comes only from the service it has had so
far, in GPU-seconds (GPUs × time: the "2D" of 2D-LAS), never from its
declared work.  Faithful to the paper and its artifact
(``SymbioticLab/Tiresias``, ``simulator/run_sim.py`` ``dlas_sim_jobs`` as
called for ``--schedule dlas-gpu``; ``simulator/jobs.py``):

* **Queues**: :data:`QUEUE_LIMITS_GPU_S` = the artifact's
  ``queue_limit`` with ``num_queue = 3``: a job starts in Q0 and moves to
  Q1 once it has had 3,250 GPU-seconds and to Q2 at 7,200 (demotion only;
  the artifact's ``dlas-gpu`` runs with ``solve_starvation = 0``: the
  paper's PromoteKnob, which sends a long-waiting job back to Q0, is off,
  and so it is here).
* **Order**: queues in priority order; inside a queue FIFO, running jobs
  ahead of waiting ones (the artifact moves waiting jobs to the back of their
  queue after each pass, so a running job is not stopped for a job of its
  own queue).
* **Pass** (preemptive): walk that order with the cluster's GPUs as a budget;
  a job that still fits runs (a running one keeps its GPUs), a running job
  that no longer fits is stopped (the simulator charges its checkpoint
  costs, the same for every policy), a waiting job that fits starts.
* **Jobs are rigid**, as in the paper: the GPU count the user asked for; the
  plan on each type is MARP's fastest plan within that count, else the
  smallest feasible plan above it (the size-aware reference's rule,
  :func:`frenzyd.has.srtf.budget_plan`).
* **Heterogeneity-aware placement** (ours: Tiresias assumes one GPU type):
  a starting job takes the type where its plan is fastest among those with
  enough GPUs left in the pass; GPUs by best fit (one peer if one holds
  them, else the fullest peers), tensor-parallel groups inside a peer.
* **Rounds**: every arrival and completion, and at the first
  :data:`ROUND_S` tick after a running job crosses a queue limit while a
  job waits (``wake_at_s``; the artifact schedules at each such queue jump,
  ``next_job_jump``); quiet ticks before that change nothing and are skipped.

O(J log J + J·T + G) per round for J jobs, T types and G GPUs; no solver.
"""

from __future__ import annotations

import random

from frenzyd.has.interface import Decision, Gpu, JobView, Placement, Snapshot, pick_packed
from frenzyd.has.srtf import budget_plans, free_index, give, take
from frenzyd.marp.spec import Plan

QUEUE_LIMITS_GPU_S = (3250.0, 7200.0)
"""Attained GPU-seconds at which a job moves from Q0 to Q1 and from Q1 to Q2 (artifact ``queue_limit``)."""
ROUND_S = 60.0


def queue_of(job: JobView) -> int:
    """The job's Tiresias queue from its attained service (GPU-seconds on any type)."""
    attained = sum(s for _, s in job.service_s)
    return sum(1 for limit in QUEUE_LIMITS_GPU_S if attained >= limit)


class TiresiasPolicy:
    """Discretised 2D-LAS with heterogeneity-aware placement (see module docstring)."""

    name = "tiresias"
    round_s: float | None = ROUND_S
    time_driven = True  # demotions come with service alone: the simulator must not skip quiet ticks
    wake_at_s = 0.0
    """When the next demotion of a running job could change the pass (set by ``decide``; inf if none)."""

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        capacity: dict[str, int] = {}
        for g in snapshot.cluster.gpus:
            capacity[g.gpu_type] = capacity.get(g.gpu_type, 0) + 1
        entries: list[tuple[int, int, float, str, JobView, tuple[Gpu, ...] | None, Plan | None]] = []
        for r in snapshot.running:
            entries.append((queue_of(r.job), 0, r.job.arrival_s, r.job.job_id, r.job, r.gpus, r.plan))
        for j in snapshot.queued:
            entries.append((queue_of(j), 1, j.arrival_s, j.job_id, j, None, None))
        entries.sort(key=lambda e: e[:4])
        keep: set[str] = set()
        starts: list[tuple[JobView, Plan]] = []
        stop: list[tuple[str, tuple[Gpu, ...]]] = []
        for _, _, _, jid, job, gpus, plan in entries:
            if gpus is not None and plan is not None:  # running: keeps its GPUs while its type has room
                if capacity.get(plan.gpu_type, 0) >= len(gpus):
                    capacity[plan.gpu_type] -= len(gpus)
                    keep.add(jid)
                else:
                    stop.append((jid, gpus))
                continue
            best: Plan | None = None
            for t, p in budget_plans(job).items():
                fits = capacity.get(t, 0) >= p.gpus
                if fits and (best is None or (p.step_time_s, t) < (best.step_time_s, best.gpu_type)):
                    best = p
            if best is not None:
                capacity[best.gpu_type] -= best.gpus
                starts.append((job, best))
        self.wake_at_s = self._next_demotion_s(
            snapshot, keep, starts, waiting=len(entries) - len(keep) - len(starts)
        )
        index = free_index(snapshot.free)
        for _, gpus in stop:
            give(index, gpus)
        placements = []
        for job, plan in starts:
            chosen = pick_packed(index.get(plan.gpu_type, {}), plan.gpus, plan.tp)
            if chosen is None:
                continue  # the GPUs are there but scattered in pieces too small for its tp groups
            take(index, chosen)
            placements.append(Placement(job.job_id, plan, tuple(chosen)))
        return Decision(placements=tuple(placements), preemptions=tuple(jid for jid, _ in stop))

    @staticmethod
    def _next_demotion_s(
        snapshot: Snapshot, keep: set[str], starts: list[tuple[JobView, Plan]], *, waiting: int
    ) -> float:
        """The earliest time a job that runs after this pass crosses a queue limit, while a job waits.

        Like the artifact's ``next_job_jump``: between arrivals and
        completions only a demotion can change the pass, and only when some
        job waits; the simulator's quiet ticks before then can be skipped.
        """
        if waiting <= 0:
            return float("inf")
        running = [(r.job, len(r.gpus)) for r in snapshot.running if r.job.job_id in keep]
        soonest = float("inf")
        for job, n in [*running, *((j, p.gpus) for j, p in starts)]:
            attained = sum(s for _, s in job.service_s)
            for limit in QUEUE_LIMITS_GPU_S:
                if attained < limit:
                    soonest = min(soonest, snapshot.now_s + (limit - attained) / max(1, n))
                    break
        return soonest
