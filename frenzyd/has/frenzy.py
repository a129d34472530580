"""Frenzy's heterogeneity-aware scheduler (HAS): memory-aware, speed- and work-aware greedy placement.

Per scheduling round, an ordered chain of rules over MARP's feasible plans:
order the queue (aged shortest remaining time) → upgrade running jobs onto
freed faster GPUs → place each job (cheapest plan, smallest-memory type
within slack, best-fit packing), or let it yield / shrink a much longer
donor → against starvation, move a holder or reserve the head job's type →
grow running jobs onto GPUs no waiting job can use.  The rules, the
exchange arguments behind their thresholds, what each was tuned on, the
invariants and the cost per round are in ``frenzyd/has/README.md``
("Frenzy's HAS"); the constants below name their roles.
"""

from __future__ import annotations

import bisect
import heapq
import random
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple

from frenzyd.has.interface import (
    Cluster,
    Decision,
    Gpu,
    JobView,
    Placement,
    RunningJob,
    Snapshot,
    pick_packed,
)
from frenzyd.marp.spec import Plan

AGING = 0.25
"""Seconds of priority gained per second of waiting."""
GAMMA = 0.678
"""Cost exponent on the GPU count while other jobs wait: doubling must buy ≥ 1.6x."""
GAMMA_ALONE = 0.25
"""Cost exponent when the job is the last one waiting: doubling must buy ≥ 1.19x."""
MEMORY_SLACK = 0.15
"""A smaller-memory type is preferred when its plan costs at most this much more."""
STARVATION_S = 2 * 3600.0
"""Queue time after which the head job gets its GPU type reserved."""
GROW_MIN_GAIN = 0.2
"""With nobody waiting, a running job moves onto idle GPUs only if it then ends ≥ 20 % sooner."""
GROW_TRIES = 8
"""Running jobs (most work left first) considered for growing per round."""
SHRINK_TRIES = 4
"""Blocked queued jobs per round for which a running job may be shrunk."""
SHRINK_RATIO = 4.0
"""A donor must have at least this many times the blocked job's remaining time left."""
SHRINK_MIN_RUN_S = 120.0
"""A donor must have run this long since its last (re)start: no thrashing."""
UPGRADE_TRIES = 4
"""Running jobs (most time left first) considered per round for a move onto free GPUs of a faster type."""


def _peers_needed(fullest: list[tuple[int, str]], n: int, tp: int) -> int:
    """Peers :func:`pick_packed` spans for ``n`` GPUs over several peers (fullest first); 0: impossible.

    ``fullest``: (-free GPUs, peer) per peer of one type, fullest first.  The
    same count as picking the GPUs, without building the lists: O(peers used).
    """
    got = 0
    used = 0
    for neg, _ in fullest:
        c = -neg
        take = min((c // tp) * tp, n - got)
        take = (take // tp) * tp
        if take <= 0:
            if c < tp:
                break  # descending: no later peer holds a whole tp group either
            continue
        got += take
        used += 1
        if got == n:
            return used
    return 0


def _fullest_first(by_peer: dict[str, list[Gpu]]) -> list[tuple[int, str]]:
    """(-free GPUs, peer) for every peer with a free GPU of one type: fullest first, ties by name."""
    return sorted([(-len(gs), p) for p, gs in by_peer.items() if gs])


_peer_and_type = attrgetter("peer", "gpu_type")


def _neg_count(entry: tuple[int, str]) -> int:
    return entry[0]


class _Chunk(NamedTuple):
    """What one placement takes from one peer: the peer's free GPUs before, the ones taken, the rest."""

    peer: str
    had: int
    taken: list[Gpu]
    rest: list[Gpu]


def _pick_ordered(
    by_peer: dict[str, list[Gpu]], fullest: list[tuple[int, str]], n: int, tp: int
) -> list[_Chunk] | None:
    """:func:`pick_packed`'s choice, per peer, from the type's peers kept fullest first (no scan of all).

    Best fit: among the peers holding ``n`` (a prefix of ``fullest``) the one
    with fewest free GPUs, ties by name; else fullest peers first (lowest
    indices first, whole tp groups: :func:`take_in_order`).
    """
    if fullest and -fullest[0][0] >= n:
        last = bisect.bisect_right(fullest, -n, key=_neg_count) - 1  # the last peer that holds n
        # The first name among the peers with that count:
        neg, peer = fullest[bisect.bisect_left(fullest, fullest[last][0], key=_neg_count)]
        gs = sorted(by_peer[peer])
        return [_Chunk(peer, -neg, gs[:n], gs[n:])]
    chunks: list[_Chunk] = []
    got = 0
    for neg, peer in fullest:
        if -neg < tp:
            break  # fullest first: no later peer holds a whole tp group
        take = (min(-neg, n - got) // tp) * tp
        gs = sorted(by_peer[peer])
        chunks.append(_Chunk(peer, -neg, gs[:take], gs[take:]))
        got += take
        if got == n:
            return chunks
    return None


def _take(by_peer: dict[str, list[Gpu]], fullest: list[tuple[int, str]], chunks: list[_Chunk]) -> None:
    """Remove a placement's GPUs from a type's free GPUs, keeping ``fullest`` sorted (empty peers dropped)."""
    for peer, had, _, rest in chunks:
        del fullest[bisect.bisect_left(fullest, (-had, peer))]
        if rest:
            by_peer[peer] = rest
            bisect.insort(fullest, (-len(rest), peer))
        else:
            del by_peer[peer]


def _remove_free(by_peer: dict[str, list[Gpu]], gpus: list[Gpu]) -> None:
    """Remove ``gpus`` (all free, of one type) from a type's free GPUs; a peer left empty is dropped."""
    per: dict[str, set[Gpu]] = {}
    for g in gpus:
        per.setdefault(g.peer, set()).add(g)
    for peer, mine in per.items():
        rest = [g for g in by_peer[peer] if g not in mine]
        if rest:
            by_peer[peer] = rest
        else:
            del by_peer[peer]


def _hand_over(
    free: dict[str, dict[str, list[Gpu]]], free_n: dict[str, int], released: list[Gpu], plan: Plan
) -> list[Gpu] | None:
    """GPUs for ``plan`` from its type's free GPUs plus ``released`` (a running job's, given up).

    When they hold it (:func:`pick_packed`), the released GPUs become free and
    the chosen ones are taken, in ``free`` and ``free_n``; else nothing changes
    and None is returned.
    """
    t = plan.gpu_type
    pool = {peer: list(gs) for peer, gs in free.get(t, {}).items()}
    for g in released:
        pool.setdefault(g.peer, []).append(g)
    gpus = pick_packed(pool, plan.gpus, plan.tp)
    if gpus is None:
        return None
    for g in released:
        free.setdefault(t, {}).setdefault(g.peer, []).append(g)
    _remove_free(free[t], gpus)
    free_n[t] = free_n.get(t, 0) + len(released) - len(gpus)
    return gpus


class _Shape:
    """What Frenzy derives from one plan set: grouped once, everything else computed on first use."""

    __slots__ = (
        "_asc_step",
        "_desc",
        "_fastest_on",
        "_groups",
        "_preferred",
        "_ranked",
        "_types",
        "fastest",
        "plans",
    )

    def __init__(self, plans: tuple[Plan, ...]) -> None:
        self.plans = plans
        self.fastest = min([p.step_time_s for p in plans], default=float("inf"))  # packed step time
        self._groups: tuple[tuple[str, int, tuple[Plan, ...]], ...] | None = None
        self._ranked: dict[float, tuple[tuple[float, Plan], ...]] = {}
        self._preferred: dict[str, int] | None = None
        self._desc: dict[str, tuple[Plan, ...]] = {}
        self._types: frozenset[str] | None = None
        self._fastest_on: dict[str, float] | None = None
        self._asc_step: dict[str, tuple[Plan, ...]] = {}

    @property
    def groups(self) -> tuple[tuple[str, int, tuple[Plan, ...]], ...]:
        """Per type, by name: (type, fewest GPUs of any of its plans, its plans).

        One linear pass on first use (a fresh policy object pays O(K) per plan
        set it looks at, no sort).
        """
        if self._groups is None:
            by_type: dict[str, list[Plan]] = {}
            least: dict[str, int] = {}
            for p in self.plans:
                t = p.gpu_type
                same = by_type.get(t)
                if same is None:
                    by_type[t] = [p]
                    least[t] = p.gpus
                else:
                    same.append(p)
                    least[t] = min(least[t], p.gpus)
            self._groups = tuple((t, least[t], tuple(by_type[t])) for t in sorted(by_type))
        return self._groups

    @property
    def types(self) -> frozenset[str]:
        """The GPU types the plan set has a plan on."""
        if self._types is None:
            self._types = frozenset(t for t, _, _ in self.groups)
        return self._types

    def fastest_on(self) -> dict[str, float]:
        """Per type: the fastest packed step time of its plans (read only)."""
        if self._fastest_on is None:
            self._fastest_on = {t: min(p.step_time_s for p in of_type) for t, _, of_type in self.groups}
        return self._fastest_on

    def fastest_first(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type``, fastest packed step first (ties: fewer GPUs)."""
        asc = self._asc_step.get(gpu_type)
        if asc is None:
            asc = self._asc_step[gpu_type] = tuple(
                sorted(self._of_type(gpu_type), key=lambda p: (p.step_time_s, p.gpus))
            )
        return asc

    def _of_type(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type`` as :attr:`groups` holds them (none: empty)."""
        return next((g for t, _, g in self.groups if t == gpu_type), ())

    def most_gpus_first(self, gpu_type: str) -> tuple[Plan, ...]:
        """The plans of ``gpu_type``, most GPUs first (at most one per count)."""
        desc = self._desc.get(gpu_type)
        if desc is None:
            desc = self._desc[gpu_type] = tuple(sorted(self._of_type(gpu_type), key=lambda p: -p.gpus))
        return desc

    def ranking(self, gamma: float) -> tuple[tuple[float, Plan], ...]:
        """Every (cost, plan), ``cost = step_time × gpus^gamma`` (packed), cheapest first.

        Ties: type, then GPU count.
        """
        ranked = self._ranked.get(gamma)
        if ranked is None:
            ranked = self._ranked[gamma] = tuple((c, p) for c, _, _, p in sorted(_costed(self.plans, gamma)))
        return ranked

    def cheapest_per_type(self, gamma: float) -> tuple[tuple[float, Plan], ...]:
        """Each type's cheapest (cost, plan) (packed cost as :meth:`ranking`), cheapest first."""
        key = -gamma - 1.0  # its own slot in the cache: gammas are >= 0
        ranked = self._ranked.get(key)
        if ranked is None:
            scale = _powers(gamma)
            best = [
                min((p.step_time_s * _pow(scale, p.gpus, gamma), t, p.gpus, p) for p in of_type)
                for t, _, of_type in self.groups
            ]
            ranked = self._ranked[key] = tuple((c, p) for c, _, _, p in sorted(best))
        return ranked

    def preferred(self) -> dict[str, int]:
        """Per type, the GPU count of the cheapest plan while others wait (a job's un-grown size)."""
        if self._preferred is None:
            scale = _powers(GAMMA)
            self._preferred = {
                t: min(of_type, key=lambda p: (p.step_time_s * _pow(scale, p.gpus, GAMMA), p.gpus)).gpus
                for t, _, of_type in self.groups
            }
        return self._preferred


def _pow(scale: list[float], n: int, gamma: float) -> float:
    return scale[n] if n < 257 else float(n**gamma)


def _costed(plans: tuple[Plan, ...], gamma: float) -> list[tuple[float, str, int, Plan]]:
    """(packed cost, type, GPU count, plan) per plan: sortable, the plan never compared (type and count
    are unique per plan)."""
    scale = _powers(gamma)
    return [(p.step_time_s * _pow(scale, p.gpus, gamma), p.gpu_type, p.gpus, p) for p in plans]


_POWERS: dict[float, list[float]] = {}


def _powers(gamma: float) -> list[float]:
    """``n**gamma`` for n < 257 (GPU counts), per gamma."""
    table = _POWERS.get(gamma)
    if table is None:
        table = _POWERS[gamma] = [n**gamma for n in range(257)]
    return table


class _Round(NamedTuple):
    """What a shrink reads and updates in one round (the round's own dicts and sets, shared)."""

    runs_on: dict[str, dict[int, list[tuple[float, int, RunningJob]]]]
    """Shrink donors per type and GPU count: (-time left, snapshot index, job)."""
    donors_sorted: set[tuple[str, int]]
    moved: set[str]
    free: dict[str, dict[str, list[Gpu]]]
    free_n: dict[str, int]
    now: float
    reserved: set[str]


class FrenzyPolicy:
    """Frenzy HAS (see module docstring for the algorithm, invariants and complexity)."""

    name = "frenzy"
    round_s: float | None = None

    def __init__(self, *, min_run_s: float = SHRINK_MIN_RUN_S) -> None:
        self.min_run_s = min_run_s
        """Least time a job runs on a placement before HAS may shrink, move or upgrade it (the live
        pool's ``scheduler.min_run_s``; the simulator keeps the tuned default)."""
        # What depends only on a job's plan set, keyed by the identity of its ``plans`` tuple (the
        # entry keeps the tuple alive, so the id cannot be reused): jobs of one shape (the simulator
        # shares one tuple per model, sequence and batch) share the work, one lookup per job.
        self._shapes: dict[int, _Shape] = {}
        self._totals: tuple[Cluster, dict[str, int]] | None = None
        # (job, start, plan) -> (its GPUs, step time there): a placement's speed does not change.
        self._placed: dict[tuple[str, float, Plan], tuple[tuple[Gpu, ...], float]] = {}

    def _shape(self, job: JobView) -> _Shape:
        plans = job.plans
        shape = self._shapes.get(id(plans))
        if shape is not None and shape.plans is plans:
            return shape
        if len(self._shapes) > 100_000:
            self._shapes.clear()
        shape = self._shapes[id(plans)] = _Shape(plans)
        return shape

    def _preferred_gpus(self, job: JobView, gpu_type: str) -> int:
        """GPU count of the job's cheapest plan of ``gpu_type`` while others wait (its un-grown size)."""
        return self._shape(job).preferred().get(gpu_type, 1)

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
        cluster = snapshot.cluster
        memory = {t.name: t.memory_bytes for t in cluster.types}
        speeds = {t.name: t.speed for t in cluster.types}
        free: dict[str, dict[str, list[Gpu]]] = {}
        free_n: dict[str, int] = {}
        # Runs of one peer and type (the snapshot lists GPUs by peer), grouped in C: O(G), few steps.
        for (peer, t), run_of in groupby(snapshot.free, key=_peer_and_type):
            gs = list(run_of)
            by_peer = free.get(t)
            if by_peer is None:
                by_peer = free[t] = {}
                free_n[t] = 0
            on_peer = by_peer.get(peer)
            if on_peer is None:
                by_peer[peer] = gs
            else:
                on_peer.extend(gs)
            free_n[t] += len(gs)
        # The one O(R) pass: each running job's time left where it runs, and the shrink donors per
        # type and GPU count as (-time left, snapshot index, job), sorted on first use.
        lefts: list[tuple[float, str, RunningJob]] = []
        runs_on: dict[str, dict[int, list[tuple[float, int, RunningJob]]]] = {}
        for k, r in enumerate(snapshot.running):
            step = r.step_time_s
            r_left = r.job.remaining_steps * (step if step is not None else self._placed_step_s(r, speeds))
            lefts.append((r_left, r.job.job_id, r))
            by_size = runs_on.get(r.plan.gpu_type)
            if by_size is None:
                by_size = runs_on[r.plan.gpu_type] = {}
            bucket = by_size.get(len(r.gpus))
            if bucket is None:
                by_size[len(r.gpus)] = [(-r_left, k, r)]
            else:
                bucket.append((-r_left, k, r))
        if not snapshot.queued:
            return Decision(placements=tuple(self._grow(lefts, free, free_n, speeds)))
        now = snapshot.now_s
        moved: set[str] = set()
        wanted: set[str] = set()

        shrink_tries = SHRINK_TRIES
        donors_sorted: set[tuple[str, int]] = set()  # (type, GPU count) donor buckets sorted this round
        # Per type: its peers fullest first (built on first use, kept sorted as GPUs are taken).
        fullest_of: dict[str, list[tuple[int, str]]] = {}
        shapes = {j.job_id: self._shape(j) for j in snapshot.queued}
        order = sorted(
            snapshot.queued,
            key=lambda j: (
                j.remaining_steps * shapes[j.job_id].fastest - AGING * (now - j.arrival_s),
                j.arrival_s,
                j.job_id,
            ),
        )
        reserved: set[str] = set()
        ctx = _Round(runs_on, donors_sorted, moved, free, free_n, now, reserved)
        placements: list[Placement] = self._upgrade(lefts, order, shapes, ctx, speeds)
        preemptions: list[str] = []

        # Plan sets for which no type had enough free GPUs (or not in whole tp groups on its peers).
        # Free GPUs only go in the queue pass and reservations only grow, so such a set stays stuck
        # for the round's later jobs, which then skip the scan, until a shrink hands GPUs back.
        stuck: set[int] = set()

        def room_left() -> bool:
            """Some unreserved type has a free GPU (``room``, recomputed after every change)."""
            return any(n > 0 for t, n in free_n.items() if t not in reserved)

        room = room_left()

        def took(pair: tuple[str | None, list[Placement]] | None) -> bool:
            """Apply a shrink's or move's outcome (a stopped donor, the moves); False when it found none."""
            nonlocal room
            if pair is None:
                return False
            fullest_of.clear()  # the shrink moved GPUs of a type: rebuild on next use
            stuck.clear()  # ... and may have freed more than it took
            stopped, places = pair
            preemptions.extend(() if stopped is None else (stopped,))
            placements.extend(places)
            room = room_left()
            return True

        left = len(order)
        for i, job in enumerate(order):
            left -= 1
            if shrink_tries <= 0 and not room:
                break
            gamma = GAMMA if left > 0 else GAMMA_ALONE
            shape = shapes[job.job_id]
            # Per type with GPUs free: its cheapest plan where it would really run.  One linear pass
            # over the type's plans; the packed cost bounds the real one from below, so the speed
            # model re-costs (over several peers) only a plan that could still win.
            per_type: list[tuple[float, int, Plan]] = []
            best = float("inf")
            scale = _powers(gamma)
            for t, least, of_type in () if id(shape) in stuck else shape.groups:
                n_free = free_n.get(t, 0)
                if n_free < least or t in reserved:
                    continue
                fullest = fullest_of.get(t)
                if fullest is None:
                    fullest = fullest_of[t] = _fullest_first(free[t])
                biggest = -fullest[0][0] if fullest else 0
                best_c = float("inf")
                best_n = 0
                best_p: Plan | None = None
                for plan in of_type:
                    n = plan.gpus
                    if n > n_free:
                        continue
                    cost = plan.step_time_s * (scale[n] if n < 257 else n**gamma)
                    if cost > best_c or (cost == best_c and n > best_n):
                        continue  # cannot win: the real cost is at least the packed one
                    if n > biggest:  # not on one peer: the real cost, over the peers it would span
                        peers = _peers_needed(fullest, n, plan.tp)
                        if peers == 0:
                            continue
                        cost = job.speed.step_time_s(plan, speeds[t], peers) * n**gamma
                        if cost > best_c or (cost == best_c and n > best_n):
                            continue
                    best_c, best_n, best_p = cost, n, plan
                if best_p is not None:
                    per_type.append((best_c, best_n, best_p))
                    best = min(best, best_c)
            if per_type:
                # Among the types within MEMORY_SLACK of the best cost, the smallest-memory one.
                c_cost, c_n, choice = min(
                    (c for c in per_type if c[0] <= best * (1.0 + MEMORY_SLACK)),
                    key=lambda c: (memory[c[2].gpu_type], c[0], c[2].gpu_type, c[1]),
                )
                if shrink_tries > 0:
                    # Yield: the job's time on the free GPUs against its time on GPUs a much longer
                    # running job holds.  Stopping that job delays it by about the newcomer's time
                    # there plus its restart; the newcomer gains the difference: worth it when
                    # t_free > 2·t_there + restart (the donor test in _shrink_for, beat_s).
                    t_free = job.remaining_steps * c_cost / (scale[c_n] if c_n < 257 else c_n**gamma)
                    better = tuple(
                        cp
                        for cp in shape.cheapest_per_type(gamma)
                        if 2.0 * job.remaining_steps * cp[1].step_time_s < t_free
                    )
                    if better:
                        shrink_tries -= 1
                        if took(self._shrink_for(job, better, ctx, beat_s=t_free)):
                            continue
                t = choice.gpu_type
                chunks = _pick_ordered(free[t], fullest_of[t], choice.gpus, choice.tp)
                if chunks is None:  # cannot happen: the peer counts said so; keep the invariant explicit
                    continue
                _take(free[t], fullest_of[t], chunks)
                gpus = [g for c in chunks for g in c.taken]
                free_n[t] -= len(gpus)
                if free_n[t] == 0:
                    room = room_left()
                placements.append(Placement(job.job_id, choice, tuple(gpus)))
                continue
            stuck.add(id(shape))
            if shrink_tries > 0:
                shrink_tries -= 1
                if took(self._shrink_for(job, shape.cheapest_per_type(gamma), ctx)):
                    continue
            wanted |= shape.types  # types a waiting job could use: not for growing
            if i == 0 and now - job.arrival_s > STARVATION_S:
                total = self._type_totals(cluster)
                for _, plan in shape.ranking(gamma):
                    if plan.gpus <= total.get(plan.gpu_type, 0):
                        if not took(self._move_for(job, plan, ctx, speeds)):
                            reserved.add(plan.gpu_type)
                            room = room_left()
                        break
        if not preemptions:  # grow only onto types no waiting job can use, even while jobs wait
            idle = {t: n for t, n in free_n.items() if t not in wanted and t not in reserved}
            placements.extend(self._grow(lefts, free, idle, speeds, skip=moved))
        return Decision(placements=tuple(placements), preemptions=tuple(preemptions))

    def _shrink_for(
        self,
        job: JobView,
        ranked: tuple[tuple[float, Plan], ...],
        rnd: _Round,
        *,
        beat_s: float | None = None,
    ) -> tuple[str | None, list[Placement]] | None:
        """Make room for a blocked ``job`` by shrinking (or stopping) one much longer running job.

        The donor, of the same GPU type, keeps a subset of its own GPUs (a
        smaller MARP plan of its type) or, when no smaller plan frees enough,
        is stopped and requeued with its progress (returned as the first
        element); the GPUs it gives up, with the free ones, must hold
        ``job``'s plan.  Donors: ran at least :data:`SHRINK_MIN_RUN_S` since their last
        start, not changed this round, and either with at least
        :data:`SHRINK_RATIO` times ``job``'s remaining time left, or grown past
        their preferred size (they then shrink, at most back to that size).
        With ``beat_s`` (a yield: ``job`` could start on free GPUs and would take
        ``beat_s`` there) a donor also needs ``2·mine + its restart < beat_s``.  O(K·R).
        """
        runs_on, donors_sorted, moved, free, free_n, now, reserved = rnd
        for _, plan in ranked:
            t = plan.gpu_type
            if t in reserved:
                continue
            mine = job.remaining_steps * plan.step_time_s
            need = plan.gpus - free_n.get(t, 0)
            best: tuple[float, RunningJob, Plan | None, list[Gpu]] | None = None
            # Only donors holding at least ``need`` GPUs can help: those buckets, each sorted on first
            # use (most time left first; ties: snapshot order, the index is unique so the job itself
            # is never compared), merged into the order one sorted list would give.
            usable = []
            for have_n, bucket in runs_on.get(t, {}).items():
                if have_n >= need:
                    if (t, have_n) not in donors_sorted:
                        donors_sorted.add((t, have_n))
                        bucket.sort()
                    usable.append(bucket)
            if not usable:
                continue
            donors = usable[0] if len(usable) == 1 else heapq.merge(*usable)
            for neg_left, _, r in donors:
                left = -neg_left
                if r.job.job_id in moved or now - r.started_s < self.min_run_s:
                    continue
                if beat_s is not None and 2.0 * mine + r.job.restart_cost_s >= beat_s:
                    continue
                have = len(r.gpus)
                rich = left >= SHRINK_RATIO * mine
                # A job grown past its own preferred size gives the extra GPUs back to anyone.
                floor = 0 if rich else self._preferred_gpus(r.job, t)
                if not rich and have <= floor:
                    continue
                own: dict[str, list[Gpu]] = {}
                for g in r.gpus:
                    own.setdefault(g.peer, []).append(g)
                option: tuple[float, RunningJob, Plan | None, list[Gpu]] | None = None
                if rich:
                    option = (left, r, None, [])
                for smaller in self._shape(r.job).most_gpus_first(t):
                    if smaller.gpus >= have or have - smaller.gpus < need:
                        continue
                    if not rich and smaller.gpus < floor:
                        break  # fewer GPUs from here on
                    keep = pick_packed(own, smaller.gpus, smaller.tp)
                    if keep is not None:
                        option = (left, r, smaller, keep)
                        break
                if option is not None:
                    best = option
                    break  # most time left first: the first donor with an option is the best one
            if best is None:
                continue
            _, r, donor_plan, kept = best
            gpus = _hand_over(free, free_n, [g for g in r.gpus if g not in kept], plan)
            if gpus is None:
                continue
            moved.add(r.job.job_id)
            mine_placement = Placement(job.job_id, plan, tuple(gpus))
            if donor_plan is None:
                return r.job.job_id, [mine_placement]
            return None, [Placement(r.job.job_id, donor_plan, tuple(kept)), mine_placement]
        return None

    def _move_for(
        self, job: JobView, plan: Plan, rnd: _Round, speeds: dict[str, float]
    ) -> tuple[None, list[Placement]] | None:
        """Start a starving ``job`` on ``plan``: one running job of its type moves to free GPUs of another.

        Without the move ``job`` waits about as long as a holder of its type
        runs (``m``); moved, the holder ends after its restart plus its time
        ``m'`` on the other type's best plan.  The sum of the two completion
        times drops when ``restart + m' < 2·m`` (an exchange argument; no
        tuned constant).  Candidates: running jobs of the type holding at
        least the GPUs ``plan`` still lacks, run at least
        :data:`SHRINK_MIN_RUN_S`, not changed this round; the one that gains
        most (ties: job id).  O(R·K) over the type's running jobs.
        """
        runs_on, _, moved, free, free_n, now, reserved = rnd
        t = plan.gpu_type
        need = plan.gpus - free_n.get(t, 0)
        fullest_of: dict[str, list[tuple[int, str]]] = {}
        options: list[tuple[float, str, RunningJob, Plan]] = []  # (-gain, job id, mover, its plan there)
        for have_n, bucket in runs_on.get(t, {}).items():
            if have_n < need:
                continue
            for neg_left, _, r in bucket:
                if r.job.job_id in moved or now - r.started_s < self.min_run_s:
                    continue
                restart = r.job.restart_cost_s
                budget = -2.0 * neg_left - restart  # m' must stay below 2·m − restart
                best: tuple[float, str, RunningJob, Plan] | None = None
                for u, least, of_type in self._shape(r.job).groups:
                    if u == t or u in reserved or free_n.get(u, 0) < least:
                        continue
                    fullest = fullest_of.get(u)
                    if fullest is None:
                        fullest = fullest_of[u] = _fullest_first(free[u])
                    for p in of_type:
                        if p.gpus > free_n[u] or r.job.remaining_steps * p.step_time_s >= budget:
                            continue  # too many GPUs, or even packed too slow
                        peers = 1 if -fullest[0][0] >= p.gpus else _peers_needed(fullest, p.gpus, p.tp)
                        if peers == 0:
                            continue
                        there = r.job.remaining_steps * r.job.speed.step_time_s(p, speeds[u], peers)
                        if there < budget and (best is None or there - budget < best[0]):
                            best = (there - budget, r.job.job_id, r, p)
                if best is not None:
                    options.append(best)
        for _, _, r, there_plan in sorted(options, key=lambda o: (o[0], o[1])):  # most gain first
            u = there_plan.gpu_type
            theirs = pick_packed(free[u], there_plan.gpus, there_plan.tp)
            if theirs is None:  # cannot happen: the peer count said so
                continue
            mine = _hand_over(free, free_n, list(r.gpus), plan)
            if mine is None:  # the freed GPUs do not hold the plan in whole tp groups
                continue
            moved.add(r.job.job_id)
            _remove_free(free[u], theirs)
            free_n[u] -= len(theirs)
            return None, [
                Placement(r.job.job_id, there_plan, tuple(theirs)),
                Placement(job.job_id, plan, tuple(mine)),
            ]
        return None

    def _upgrade(
        self,
        lefts: list[tuple[float, str, RunningJob]],
        order: list[JobView],
        shapes: dict[str, _Shape],
        rnd: _Round,
        speeds: dict[str, float],
    ) -> list[Placement]:
        """Move running jobs stuck on slow GPUs onto free GPUs of a faster type that waiting jobs want.

        Moving a job with ``m`` left where it runs to a plan where it needs
        ``m'`` delays a waiting job that would have taken those GPUs by about
        ``m' + restart``, and the mover gains ``m − m' − restart``: the sum of
        completion times drops when ``2·(m' + restart) < m`` (the yield rule's
        exchange argument, seen from the running job; no tuned constant).
        Shortest remaining time first on the contested type: ``m'`` must not
        exceed any waiting job's time on that type (its fastest plan there,
        less its aging credit, as the queue order counts it), else that job
        should go first and the move waits for a later event.  Types no waiting
        job can use are left to growth.  Only onto a type faster per GPU than
        the mover's own.  Candidates: the :data:`UPGRADE_TRIES` running jobs
        with most time left among those on a type slower than the fastest free
        one whose fastest plan anywhere could pass the test, run at least
        :data:`SHRINK_MIN_RUN_S`; each moves at most once.  Runs before the
        queue pass, so the GPUs a mover gives up serve the waiting jobs.
        O(R + UPGRADE_TRIES·(T·Q + K)) for T types: a type's scan of the
        queue stops at the first job whose key reaches the mover's time there
        and resumes there for the next candidate (rarely more than a few jobs).
        """
        _, _, moved, free, free_n, now, _ = rnd
        if not any(n > 0 for n in free_n.values()):
            return []
        # Only onto a faster type: jobs on the fastest type with a free GPU, or a faster one, stay.
        # Of the others, the UPGRADE_TRIES with most time left among those whose fastest plan anywhere
        # ends them within half their time left, restart included: popped from a heap, most time left
        # first (ties: job id), until that many pass (no sort of every running job).
        top = max(speeds[t] for t, n in free_n.items() if n > 0)
        heap = [(-left, jid, run) for left, jid, run in lefts if speeds[run.plan.gpu_type] < top]
        heapq.heapify(heap)
        candidates: list[tuple[float, str, RunningJob]] = []
        while heap and len(candidates) < UPGRADE_TRIES:
            neg_left, jid, run = heapq.heappop(heap)
            job = run.job
            if now - run.started_s >= self.min_run_s and -neg_left > 2.0 * (
                job.restart_cost_s + job.remaining_steps * self._shape(job).fastest
            ):
                candidates.append((-neg_left, jid, run))
        if not candidates:
            return []
        # Per type: (jobs of ``order`` scanned, the least time on it found, whether one can use it).
        scanned: dict[str, tuple[int, float, bool]] = {}

        def comes_first(u: str, there: float) -> bool:
            """Some waiting job can use type ``u`` (else: growth's case) and none would hold it for less
            than ``there``: its time on its fastest plan there, less its aging credit.

            ``order`` is sorted by that time on the job's fastest plan anywhere (a lower bound), so
            the scan stops at the first job whose key reaches ``there``, and resumes where an earlier
            call for the type stopped: at most Q jobs per type in the round, few for a short mover.
            """
            i, least, seen = scanned.get(u, (0, float("inf"), False))
            while least >= there and i < len(order):
                j = order[i]
                shape = shapes[j.job_id]
                key = j.remaining_steps * shape.fastest - AGING * (now - j.arrival_s)
                if key >= there and seen:
                    break
                step = shape.fastest_on().get(u)
                if step is not None:
                    least = min(least, key + j.remaining_steps * (step - shape.fastest))
                    seen = True
                i += 1
            scanned[u] = (i, least, seen)
            return seen and least >= there

        fullest_of: dict[str, list[tuple[int, str]]] = {}
        moves: list[Placement] = []
        for left, jid, run in candidates:
            job = run.job
            steps = job.remaining_steps
            budget = 0.5 * left - job.restart_cost_s  # m' must stay below m/2 − restart
            current = run.plan.gpu_type
            shape = self._shape(job)
            fastest_on = shape.fastest_on()
            best: tuple[float, str, int, Plan] | None = None
            for u, least, _ in shape.groups:
                if speeds[u] <= speeds[current] or free_n.get(u, 0) < least:
                    continue
                if steps * fastest_on[u] >= budget:
                    continue
                # Even its fastest plan there (packed) must come before every waiting job that can use
                # u; comes_first is monotone in the time, so this also rules out every slower plan.
                if not comes_first(u, steps * fastest_on[u]):
                    continue
                fullest = fullest_of.get(u)
                if fullest is None:
                    fullest = fullest_of[u] = _fullest_first(free[u])
                on_u: tuple[float, str, int, Plan] | None = None  # the best plan on u within budget
                for p in shape.fastest_first(u):
                    bound = steps * p.step_time_s  # packed: a lower bound of its real time
                    if bound >= budget or (on_u is not None and bound > on_u[0]):
                        break  # fastest first: no later plan can do better
                    if best is not None and bound > best[0]:
                        break
                    if p.gpus > free_n[u]:
                        continue
                    peers = 1 if -fullest[0][0] >= p.gpus else _peers_needed(fullest, p.gpus, p.tp)
                    if peers == 0:
                        continue
                    there = steps * job.speed.step_time_s(p, speeds[u], peers)
                    key = (there, u, p.gpus, p)
                    if there < budget and (on_u is None or key[:3] < on_u[:3]):
                        on_u = key
                # Its best plan there must come before every waiting job that can use u; if it does
                # not, no slower plan on u does.
                if on_u is not None and (best is None or on_u[:3] < best[:3]) and comes_first(u, on_u[0]):
                    best = on_u
            if best is None:
                continue
            plan = best[3]
            u = plan.gpu_type
            gpus = pick_packed(free[u], plan.gpus, plan.tp)
            if gpus is None:  # cannot happen: the peer count said so
                continue
            _remove_free(free[u], gpus)
            free_n[u] -= len(gpus)
            for g in run.gpus:
                free.setdefault(current, {}).setdefault(g.peer, []).append(g)
            free_n[current] = free_n.get(current, 0) + len(run.gpus)
            fullest_of.pop(u, None)
            fullest_of.pop(current, None)
            moved.add(jid)
            moves.append(Placement(jid, plan, tuple(gpus)))
        return moves

    def _grow(
        self,
        lefts: list[tuple[float, str, RunningJob]],
        free: dict[str, dict[str, list[Gpu]]],
        free_n: dict[str, int],
        speeds: dict[str, float],
        skip: frozenset[str] | set[str] = frozenset(),
    ) -> list[Placement]:
        """With nobody waiting, move running jobs onto idle GPUs where it pays for its restart.

        A job moves when its new plan (its own GPUs plus idle ones of a type)
        finishes it at least :data:`GROW_MIN_GAIN` sooner, restart included.
        The :data:`GROW_TRIES` running jobs with most work left, in that order,
        each at most once per round: O(R + GROW_TRIES·K·P).
        """
        moves: list[tuple[float, str, Plan, list[Gpu]]] = []
        if not any(n > 0 for n in free_n.values()):
            return []
        # The GROW_TRIES running jobs with the most work left (the ones a move helps most; ties: job id).
        # (Shrunk this round: a job's old GPUs are not its own any more.)  The top of all jobs is the
        # top of the movable ones when every one of them is movable (the usual case: the jobs with
        # most work left are far from their last restart cost); else filter all and take it again.
        top = heapq.nlargest(GROW_TRIES, lefts)
        if any(left <= run.job.restart_cost_s * 2 or jid in skip for left, jid, run in top):
            top = heapq.nlargest(
                GROW_TRIES,
                [lr for lr in lefts if lr[0] > lr[2].job.restart_cost_s * 2 and lr[1] not in skip],
            )
        for now_left, _, run in top:
            job = run.job
            if not any(n > 0 for n in free_n.values()):
                break
            restart = job.restart_cost_s
            target = now_left * (1.0 - GROW_MIN_GAIN)
            # Per type: free GPUs per peer, descending (the job's own GPUs count as free on its type).
            counts: dict[str, list[tuple[int, str]]] = {}
            # The plan that ends the job soonest (ties: faster packed step, type, GPU count), over the
            # types it could use now; the packed bound skips the speed model for plans that cannot win.
            best_key: tuple[float, float, str, int] | None = None
            best_plan: Plan | None = None
            have = len(run.gpus)
            for t, least, of_type in self._shape(job).groups:
                own = t == run.plan.gpu_type
                avail = free_n.get(t, 0) + (have if own else 0)
                if least > avail or (own and avail <= have):
                    continue
                for plan in of_type:
                    n = plan.gpus
                    if n > avail or (own and n <= have):
                        continue
                    bound = restart + job.remaining_steps * plan.step_time_s  # packed: a lower bound
                    if bound >= target or (best_key is not None and bound > best_key[0]):
                        continue
                    per_peer = counts.get(t)
                    if per_peer is None:
                        by_peer = {peer: len(gs) for peer, gs in free.get(t, {}).items()}
                        if own:
                            for g in run.gpus:
                                by_peer[g.peer] = by_peer.get(g.peer, 0) + 1
                        per_peer = counts[t] = sorted([(-c, peer) for peer, c in by_peer.items()])
                    # As pick_packed: one peer when one holds it (tp groups then fit), else fullest first.
                    peers = 1 if per_peer and -per_peer[0][0] >= n else _peers_needed(per_peer, n, plan.tp)
                    if peers == 0:
                        continue
                    left = restart + job.remaining_steps * job.speed.step_time_s(plan, speeds[t], peers)
                    key = (left, plan.step_time_s, t, n)
                    if left < target and (best_key is None or key < best_key):
                        best_key, best_plan = key, plan
            best = None if best_key is None or best_plan is None else (best_key[0], best_plan)
            picked: tuple[float, Plan, list[Gpu]] | None = None
            if best is not None:
                t = best[1].gpu_type
                pool = free.get(t, {})  # pick_packed only reads it
                if t == run.plan.gpu_type:  # its own GPUs count as free: a copy, new lists for their peers
                    pool = dict(pool)
                    for g in run.gpus:
                        pool[g.peer] = [*pool.get(g.peer, ()), g]
                chosen = pick_packed(pool, best[1].gpus, best[1].tp)
                if chosen is not None:  # always: the counts above said so
                    picked = (best[0], best[1], chosen)
            best3 = picked
            if best3 is not None:
                moves.append((now_left - best3[0], job.job_id, best3[1], best3[2]))
                t = best3[1].gpu_type
                mine = set(run.gpus)
                taken = set(best3[2])
                _remove_free(free[t], [g for g in best3[2] if g not in mine])
                free_n[t] -= len(taken - mine)
                for g in run.gpus:
                    if g not in taken:
                        free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
                        free_n[g.gpu_type] = free_n.get(g.gpu_type, 0) + 1
        # In discovery order: a move may use GPUs an earlier move gave up.
        return [Placement(jid, plan, tuple(gpus)) for _, jid, plan, gpus in moves]
