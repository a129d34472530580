"""Frenzy's heterogeneity-aware scheduler (HAS): memory-aware, speed- and work-aware greedy placement.

Per scheduling round, an ordered chain of small rules (``frenzy_rules.py``)
over MARP's feasible plans and one free-GPU index (``free_gpus.py``): order
the queue (aged shortest remaining time) → upgrade running jobs onto freed
faster GPUs → place each job (cheapest plan, smallest-memory type within
slack, best-fit packing), or let it yield / shrink a longer donor →
against starvation, move a holder or reserve the head job's type → grow
running jobs onto GPUs no waiting job can use.  The rules, the exchange
arguments behind their thresholds, what each was tuned on, the invariants
and the cost per round are in ``frenzyd/has/README.md`` ("Frenzy's HAS").
"""

from __future__ import annotations

import random

from frenzyd.has.free_gpus import FreeTracker
from frenzyd.has.frenzy_rules import (
    AGING,
    GAMMA,
    GAMMA_ALONE,
    GROW_MIN_GAIN,
    GROW_TRIES,
    MEMORY_SLACK,
    SHRINK_MIN_RUN_S,
    SHRINK_RATIO,
    SHRINK_TRIES,
    STARVATION_S,
    UPGRADE_TRIES,
    Round,
    cheapest_plan,
    grow,
    order_queue,
    place,
    relieve_starvation,
    shrink_blocked,
    upgrade,
    yield_gpus,
)
from frenzyd.has.interface import Cluster, Decision, Gpu, RunningJob, Snapshot
from frenzyd.has.plan_shape import Shapes
from frenzyd.marp.spec import Plan

__all__ = [
    "AGING",
    "GAMMA",
    "GAMMA_ALONE",
    "GROW_MIN_GAIN",
    "GROW_TRIES",
    "MEMORY_SLACK",
    "SHRINK_MIN_RUN_S",
    "SHRINK_RATIO",
    "SHRINK_TRIES",
    "STARVATION_S",
    "UPGRADE_TRIES",
    "FrenzyPolicy",
]


class FrenzyPolicy:
    """Frenzy HAS: the rule chain of :mod:`frenzyd.has.frenzy_rules`, with what it keeps across rounds."""

    name = "frenzy"
    round_s: float | None = None

    def __init__(self, *, min_run_s: float = SHRINK_MIN_RUN_S) -> None:
        self.min_run_s = min_run_s
        """Least time a job runs on a placement before HAS may shrink, move or upgrade it (the live
        pool's ``scheduler.min_run_s``; the simulator keeps the tuned default)."""
        self._shapes = Shapes()
        self._free = FreeTracker()  # the free-GPU index, changed by each round's difference
        self._totals: tuple[Cluster, dict[str, int]] | None = None
        # (job, start, plan) -> (its GPUs, step time there): a placement's speed does not change.
        self._placed: dict[tuple[str, float, Plan], tuple[tuple[Gpu, ...], float]] = {}

    def _type_totals(self, cluster: Cluster) -> dict[str, int]:
        """GPUs per type in the (static) cluster: counted once per cluster object, when first needed."""
        if self._totals is None or self._totals[0] is not cluster:
            counts: dict[str, int] = {}
            for g in cluster.gpus:
                counts[g.gpu_type] = counts.get(g.gpu_type, 0) + 1
            self._totals = (cluster, counts)
        return self._totals[1]

    def _placed_step_s(self, run: RunningJob, speeds: dict[str, float]) -> float:
        """A running job's step time on its current GPUs: the pool's figure, else the speed model (cached)."""
        if run.step_time_s is not None:
            return run.step_time_s
        key = (run.job.job_id, run.started_s, run.plan)
        entry = self._placed.get(key)
        if entry is not None and entry[0] == run.gpus:
            return entry[1]
        step = run.job.speed.step_time_s(run.plan, speeds[run.plan.gpu_type], len({g.peer for g in run.gpus}))
        if len(self._placed) > 100_000:
            self._placed.clear()
        self._placed[key] = (run.gpus, step)
        return step

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        del rng
        rnd = Round(
            snapshot,
            self._shapes,
            min_run_s=self.min_run_s,
            step_of=self._placed_step_s,
            free=self._free.index(snapshot.free),
        )
        if not snapshot.queued:
            return Decision(placements=tuple(grow(rnd, dict(rnd.free.count))))
        order = order_queue(rnd, snapshot.queued)
        upgrade(rnd, order)
        rnd.room = rnd.free.any_free_outside(rnd.reserved)
        last = len(order) - 1
        for i, job in enumerate(order):
            if rnd.shrink_tries <= 0 and not rnd.room:
                break
            gamma = GAMMA if i < last else GAMMA_ALONE
            shape = rnd.shapes[job.job_id]
            choice = cheapest_plan(rnd, job, shape, gamma)
            if choice is not None:
                if rnd.shrink_tries <= 0 or not yield_gpus(rnd, job, shape, gamma, choice):
                    place(rnd, job, choice[2])
                continue
            if shrink_blocked(rnd, job, shape, gamma):
                continue
            rnd.wanted |= shape.types
            if i == 0:
                relieve_starvation(rnd, job, shape, gamma, self._type_totals(snapshot.cluster))
        if not rnd.preemptions:  # grow only onto types no waiting job can use, even while jobs wait
            idle = {t: n for t, n in rnd.free.count.items() if t not in rnd.wanted and t not in rnd.reserved}
            rnd.placements.extend(grow(rnd, idle, skip=rnd.moved))
        return Decision(placements=tuple(rnd.placements), preemptions=tuple(rnd.preemptions))
