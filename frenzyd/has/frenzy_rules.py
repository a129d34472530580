"""Frenzy's rules, one function each, over one round's state (:class:`Round`) and its free-GPU index.

The chain :meth:`frenzyd.has.frenzy.FrenzyPolicy.decide` runs: :func:`order_queue`
→ :func:`upgrade` → per queued job :func:`cheapest_plan`, then :func:`yield_gpus`
or :func:`place`, else :func:`shrink_blocked` → :func:`relieve_starvation` for the
head job → :func:`grow`.  The exchange arguments behind the thresholds and what
each rule was tuned on are in ``frenzyd/has/README.md`` ("Frenzy's HAS").
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from frenzyd.has.free_gpus import FreeGpus, peers_needed
from frenzyd.has.interface import Gpu, JobView, Placement, RunningJob, Snapshot, pick_packed
from frenzyd.has.plan_shape import PlanShape, Shapes, powers
from frenzyd.marp.spec import Plan

AGING = 0.05
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
SHRINK_RATIO = 1.0
"""A donor is stopped or shrunk at will only with more than this many times the blocked job's time
left, plus its own restart: 1 is the exchange argument exactly (4.0 before 2026-12-03)."""
SHRINK_MIN_RUN_S = 120.0
"""A donor must have made progress this long since its last (re)start's first step: no thrashing
(``RunningJob.ran_s``: a start that takes longer than this does not count as running)."""
UPGRADE_TRIES = 4
"""Running jobs (most time left first) considered per round for a move onto free GPUs of a faster type."""

Donor = tuple[float, int, RunningJob]
"""A running job as a shrink donor: (-time left, snapshot index, job)."""
Outcome = tuple[str | None, list[Placement]]
"""What a shrink or move does: the job it stops (or None) and its placements."""


class Round:
    """One round's state, shared by the rules: the snapshot's values, the free GPUs and what was decided.

    Built in one O(G + R) pass: the free-GPU index, each running job's time
    left where it runs (``lefts``) and, when jobs wait, the shrink donors per
    type and GPU count (``runs_on``, each bucket sorted on first use).
    """

    __slots__ = (
        "donors_sorted",
        "free",
        "lefts",
        "memory",
        "min_run_s",
        "moved",
        "now",
        "placements",
        "preemptions",
        "reserved",
        "room",
        "runs_on",
        "shapes",
        "shapes_of",
        "shrink_tries",
        "speeds",
        "stuck",
        "wanted",
    )

    def __init__(
        self,
        snapshot: Snapshot,
        shapes: Shapes,
        *,
        min_run_s: float,
        step_of: Callable[[RunningJob, dict[str, float]], float],
        free: FreeGpus | None = None,
    ) -> None:
        cluster = snapshot.cluster
        self.now = snapshot.now_s
        self.memory = {t.name: t.memory_bytes for t in cluster.types}
        self.speeds = {t.name: t.speed for t in cluster.types}
        self.free = FreeGpus(snapshot.free) if free is None else free
        """The free GPUs, changed as the rules take and give them (``free``: the caller's index of
        ``snapshot.free``, e.g. from a :class:`~frenzyd.has.free_gpus.FreeTracker`)."""
        self.shapes_of = shapes
        self.min_run_s = min_run_s
        self.lefts: list[tuple[float, str, RunningJob]] = []
        """Per running job: (time left where it runs, job id, job)."""
        self.runs_on: dict[str, dict[int, list[Donor]]] = {}
        """Shrink donors per type and GPU count."""
        lefts = self.lefts
        runs_on = self.runs_on
        speeds = self.speeds
        if not snapshot.queued:  # no job to give way to: growth reads only the times left
            for r in snapshot.running:
                step = r.step_time_s
                r_left = r.job.remaining_steps * (step if step is not None else step_of(r, speeds))
                lefts.append((r_left, r.job.job_id, r))
        for k, r in enumerate(snapshot.running if snapshot.queued else ()):
            step = r.step_time_s
            r_left = r.job.remaining_steps * (step if step is not None else step_of(r, speeds))
            lefts.append((r_left, r.job.job_id, r))
            by_size = runs_on.get(r.plan.gpu_type)
            if by_size is None:
                by_size = runs_on[r.plan.gpu_type] = {}
            bucket = by_size.get(len(r.gpus))
            if bucket is None:
                by_size[len(r.gpus)] = [(-r_left, k, r)]
            else:
                bucket.append((-r_left, k, r))
        self.donors_sorted: set[tuple[str, int]] = set()
        """(type, GPU count) donor buckets sorted this round."""
        self.moved: set[str] = set()
        """Running jobs placed anew this round (shrunk, moved, upgraded): not touched again."""
        self.reserved: set[str] = set()
        """Types kept for a starving job: no later job takes them this round."""
        self.wanted: set[str] = set()
        """Types a waiting job could use: not for growing."""
        self.shapes: dict[str, PlanShape] = {}
        """The queued jobs' plan shapes (:func:`order_queue`)."""
        self.stuck: set[int] = set()
        """Plan sets (ids of shapes) for which no type had room; cleared when a shrink or move frees GPUs."""
        self.placements: list[Placement] = []
        self.preemptions: list[str] = []
        self.shrink_tries = SHRINK_TRIES
        self.room = False
        """Some unreserved type has a free GPU (set before the queue pass, then kept current)."""

    def apply(self, outcome: Outcome | None) -> bool:
        """Apply a shrink's or move's outcome (a stopped donor, the placements); False when there was none."""
        if outcome is None:
            return False
        self.stuck.clear()  # GPUs moved: a shrink may have freed more than it took
        stopped, places = outcome
        if stopped is not None:
            self.preemptions.append(stopped)
        self.placements.extend(places)
        self.room = self.free.any_free_outside(self.reserved)
        return True


# ----------------------------------------------------------------------------- order


def order_queue(rnd: Round, queued: tuple[JobView, ...]) -> list[JobView]:
    """The queue by aged shortest remaining time: ``R − AGING·W`` (ties: arrival, id).

    R = remaining steps × the fastest plan's packed step time, W = time queued.
    Records each queued job's plan shape in ``rnd.shapes``.
    """
    shapes = rnd.shapes
    of = rnd.shapes_of.of
    for j in queued:
        shapes[j.job_id] = of(j)
    now = rnd.now
    return sorted(
        queued,
        key=lambda j: (
            j.remaining_steps * shapes[j.job_id].fastest - AGING * (now - j.arrival_s),
            j.arrival_s,
            j.job_id,
        ),
    )


# ----------------------------------------------------------------------------- upgrade


def _upgrade_candidates(rnd: Round) -> list[tuple[float, str, RunningJob]]:
    """The :data:`UPGRADE_TRIES` running jobs with most time left (ties: id) on a type slower than the
    fastest free one, ``min_run_s`` of progress there, whose fastest plan anywhere ends them within half
    their time left, restart included: popped from a heap until that many pass (no sort of all)."""
    speeds = rnd.speeds
    top = max(speeds[t] for t, n in rnd.free.count.items() if n > 0)
    heap = [(-left, jid, run) for left, jid, run in rnd.lefts if speeds[run.plan.gpu_type] < top]
    heapq.heapify(heap)
    candidates: list[tuple[float, str, RunningJob]] = []
    of = rnd.shapes_of.of
    while heap and len(candidates) < UPGRADE_TRIES:
        neg_left, jid, run = heapq.heappop(heap)
        job = run.job
        if run.ran_s(rnd.now) >= rnd.min_run_s and -neg_left > 2.0 * (
            job.restart_cost_s + job.remaining_steps * of(job).fastest
        ):
            candidates.append((-neg_left, jid, run))
    return candidates


class _FirstOnType:
    """Whether a mover with a given time on a type comes before every waiting job that can use it.

    A waiting job's time there: its fastest plan on the type, less its aging
    credit (as the queue order counts it).  ``order`` is sorted by that time on
    the job's fastest plan anywhere (a lower bound), so a type's scan stops at
    the first job whose key reaches the mover's time, and resumes there for the
    next question: at most Q jobs per type in the round, few for a short mover.
    """

    __slots__ = ("_order", "_rnd", "_scanned")

    def __init__(self, rnd: Round, order: list[JobView]) -> None:
        self._rnd = rnd
        self._order = order
        self._scanned: dict[str, tuple[int, float, bool]] = {}
        """Per type: (jobs of ``order`` scanned, the least time on it found, whether one can use it)."""

    def __call__(self, u: str, there: float) -> bool:
        """Some waiting job can use type ``u`` (else: growth's case) and none would hold it for less
        than ``there``."""
        order = self._order
        shapes = self._rnd.shapes
        now = self._rnd.now
        i, least, seen = self._scanned.get(u, (0, float("inf"), False))
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
        self._scanned[u] = (i, least, seen)
        return seen and least >= there


def _upgrade_plan(
    rnd: Round, run: RunningJob, left: float, comes_first: _FirstOnType
) -> tuple[float, str, int, Plan] | None:
    """The plan on free GPUs of a faster type that ends ``run`` soonest, within ``left/2 − restart``
    and before every waiting job that can use the type; None: none.  (time there, type, GPUs, plan)."""
    job = run.job
    free = rnd.free
    count = free.count
    speeds = rnd.speeds
    steps = job.remaining_steps
    budget = 0.5 * left - job.restart_cost_s  # m' must stay below m/2 − restart
    current = run.plan.gpu_type
    shape = rnd.shapes_of.of(job)
    fastest_on = shape.fastest_on()
    best: tuple[float, str, int, Plan] | None = None
    for u, least, _ in shape.groups:
        if speeds[u] <= speeds[current] or count.get(u, 0) < least:
            continue
        if steps * fastest_on[u] >= budget:
            continue
        # Even its fastest plan there (packed) must come before every waiting job that can use
        # u; comes_first is monotone in the time, so this also rules out every slower plan.
        if not comes_first(u, steps * fastest_on[u]):
            continue
        on_u: tuple[float, str, int, Plan] | None = None  # the best plan on u within budget
        for p in shape.fastest_first(u):
            bound = steps * p.step_time_s  # packed: a lower bound of its real time
            if bound >= budget or (on_u is not None and bound > on_u[0]):
                break  # fastest first: no later plan can do better
            if best is not None and bound > best[0]:
                break
            if p.gpus > count[u]:
                continue
            peers = free.peers_for(u, p.gpus, p.tp)
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
    return best


def upgrade(rnd: Round, order: list[JobView]) -> None:
    """Move running jobs stuck on slow GPUs onto free GPUs of a faster type that waiting jobs want.

    Moving a job with ``m`` left where it runs to a plan where it needs
    ``m'`` delays a waiting job that would have taken those GPUs by about
    ``m' + restart``, and the mover gains ``m − m' − restart``: the sum of
    completion times drops when ``2·(m' + restart) < m`` (the yield rule's
    exchange argument, seen from the running job; no tuned constant).
    Shortest remaining time first on the contested type: ``m'`` must not
    exceed any waiting job's time on that type (:class:`_FirstOnType`), else
    that job should go first and the move waits for a later event.  Types no
    waiting job can use are left to growth.  Each candidate
    (:func:`_upgrade_candidates`) moves at most once.  Runs before the queue
    pass, so the GPUs a mover gives up serve the waiting jobs.
    O(R + UPGRADE_TRIES·(T·Q + K)) for T types.
    """
    free = rnd.free
    if not free.any_free():
        return
    candidates = _upgrade_candidates(rnd)
    if not candidates:
        return
    comes_first = _FirstOnType(rnd, order)
    for left, jid, run in candidates:
        best = _upgrade_plan(rnd, run, left, comes_first)
        if best is None:
            continue
        plan = best[3]
        u = plan.gpu_type
        gpus = free.pick(u, plan.gpus, plan.tp)
        if gpus is None:  # cannot happen: the peer count said so
            continue
        free.take(u, gpus)
        free.give(run.gpus)
        rnd.moved.add(jid)
        rnd.placements.append(Placement(jid, plan, tuple(gpus)))


# ----------------------------------------------------------------------------- place


def cheapest_plan(rnd: Round, job: JobView, shape: PlanShape, gamma: float) -> tuple[float, int, Plan] | None:
    """The job's plan on free GPUs: (cost, GPUs, plan); None when no unreserved type has room.

    A plan costs ``step_time × gpus^gamma`` where it would really run.  Per
    type with GPUs free, one linear pass over the type's plans: the packed cost
    bounds the real one from below, so the speed model re-costs (over the peers
    it would span) only a plan that could still win.  Among the types within
    :data:`MEMORY_SLACK` of the best cost, the smallest-memory one.
    """
    if id(shape) in rnd.stuck:
        return None
    free = rnd.free
    count = free.count
    fullest_of = free.fullest_of
    reserved = rnd.reserved
    per_type: list[tuple[float, int, Plan]] = []
    best = float("inf")
    scale = powers(gamma)
    for t, least, of_type in shape.groups:
        n_free = count.get(t, 0)
        if n_free < least or t in reserved:
            continue
        fullest = fullest_of.get(t)
        if fullest is None:
            fullest = free.fullest(t)
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
                peers = free.peers_for(t, n, plan.tp)
                if peers == 0:
                    continue
                cost = job.speed.step_time_s(plan, rnd.speeds[t], peers) * n**gamma
                if cost > best_c or (cost == best_c and n > best_n):
                    continue
            best_c, best_n, best_p = cost, n, plan
        if best_p is not None:
            per_type.append((best_c, best_n, best_p))
            best = min(best, best_c)
    if not per_type:
        rnd.stuck.add(id(shape))
        return None
    memory = rnd.memory
    return min(
        (c for c in per_type if c[0] <= best * (1.0 + MEMORY_SLACK)),
        key=lambda c: (memory[c[2].gpu_type], c[0], c[2].gpu_type, c[1]),
    )


def place(rnd: Round, job: JobView, plan: Plan) -> None:
    """Start ``job`` on ``plan``: one peer when one peer holds it (best fit), else the fullest peers."""
    free = rnd.free
    gpus = free.place(plan)
    if gpus is None:  # cannot happen: the peer counts said so; keep the invariant explicit
        return
    if free.count[plan.gpu_type] == 0:
        rnd.room = free.any_free_outside(rnd.reserved)
    rnd.placements.append(Placement(job.job_id, plan, tuple(gpus)))


# ----------------------------------------------------------------------------- yield and shrink


def yield_gpus(
    rnd: Round, job: JobView, shape: PlanShape, gamma: float, choice: tuple[float, int, Plan]
) -> bool:
    """A job that could start on free GPUs asks a longer running job on another type to give way.

    The job's time on the free GPUs (``t_free``, from its chosen plan's cost)
    against its time on GPUs a donor holds: stopping the donor delays it by
    about the newcomer's time there plus its restart, and the newcomer gains
    the difference, so a type is tried only when ``2·t_there < t_free`` and a
    donor only when ``2·t_there + its restart < t_free`` (:func:`shrink_for`).
    Uses one of the round's :data:`SHRINK_TRIES`.  True when a donor gave way.
    """
    if rnd.shrink_tries <= 0:
        return False
    c_cost, c_n, _ = choice
    scale = powers(gamma)
    t_free = job.remaining_steps * c_cost / (scale[c_n] if c_n < 257 else c_n**gamma)
    better = tuple(
        cp for cp in shape.cheapest_per_type(gamma) if 2.0 * job.remaining_steps * cp[1].step_time_s < t_free
    )
    if not better:
        return False
    rnd.shrink_tries -= 1
    return rnd.apply(shrink_for(rnd, job, better, beat_s=t_free))


def shrink_blocked(rnd: Round, job: JobView, shape: PlanShape, gamma: float) -> bool:
    """A job that found no free GPUs takes a longer running job's (its cheapest plan per type).

    Uses one of the round's :data:`SHRINK_TRIES`.  True when a donor gave way.
    """
    if rnd.shrink_tries <= 0:
        return False
    rnd.shrink_tries -= 1
    return rnd.apply(shrink_for(rnd, job, shape.cheapest_per_type(gamma)))


def _usable_donors(rnd: Round, t: str, need: int) -> list[list[Donor]]:
    """The donor buckets of type ``t`` holding at least ``need`` GPUs, each sorted on first use (most
    time left first; ties: snapshot order, the index is unique so the job itself is never compared)."""
    usable = []
    for have_n, bucket in rnd.runs_on.get(t, {}).items():
        if have_n >= need:
            if (t, have_n) not in rnd.donors_sorted:
                rnd.donors_sorted.add((t, have_n))
                bucket.sort()
            usable.append(bucket)
    return usable


def _donor_option(
    rnd: Round, r: RunningJob, *, left: float, t: str, mine: float, need: int
) -> tuple[float, RunningJob, Plan | None, list[Gpu]] | None:
    """What donor ``r`` (``left`` to run) can give a job with ``mine`` left on type ``t`` lacking ``need``
    GPUs: (left, r, its smaller plan or None to stop it, the GPUs it keeps); None: nothing."""
    have = len(r.gpus)
    # Newcomer first, donor after: the sum of the two completion times drops when the donor's time left
    # exceeds the newcomer's time there plus the donor's restart (SRPT's exchange with a switch cost).
    rich = left > SHRINK_RATIO * mine + r.job.restart_cost_s
    shape = rnd.shapes_of.of(r.job)
    # A job grown past its own preferred size gives the extra GPUs back to anyone.
    floor = 0 if rich else shape.preferred(GAMMA).get(t, 1)
    if not rich and have <= floor:
        return None
    own: dict[str, list[Gpu]] = {}
    for g in r.gpus:
        own.setdefault(g.peer, []).append(g)
    option: tuple[float, RunningJob, Plan | None, list[Gpu]] | None = None
    if rich:
        option = (left, r, None, [])
    for smaller in shape.most_gpus_first(t):
        if smaller.gpus >= have or have - smaller.gpus < need:
            continue
        if not rich and smaller.gpus < floor:
            break  # fewer GPUs from here on
        keep = pick_packed(own, smaller.gpus, smaller.tp)
        if keep is not None:
            return (left, r, smaller, keep)
    return option


def shrink_for(
    rnd: Round,
    job: JobView,
    ranked: tuple[tuple[float, Plan], ...],
    *,
    beat_s: float | None = None,
) -> Outcome | None:
    """Make room for ``job`` by shrinking (or stopping) one longer running job.

    The donor, of the same GPU type, keeps a subset of its own GPUs (a
    smaller MARP plan of its type) or, when no smaller plan frees enough,
    is stopped and requeued with its progress (returned as the first
    element); the GPUs it gives up, with the free ones, must hold
    ``job``'s plan.  Donors: ``min_run_s`` of progress since their last
    start's first step, not changed this round, and either with more time
    left than ``job`` needs there plus their own restart (:data:`SHRINK_RATIO`
    times ``job``'s time, plus the restart: the exchange argument), or grown
    past their preferred size (they then shrink, at most back to that size).
    With ``beat_s`` (a yield: ``job`` could start on free GPUs and would take
    ``beat_s`` there) a donor also needs ``2·mine + its restart < beat_s``.
    Over ``ranked`` (plans, cheapest first), donors most time left first; the
    first donor with an option is the one a full scan would choose.  O(K·R).
    """
    moved = rnd.moved
    now = rnd.now
    min_run_s = rnd.min_run_s
    count = rnd.free.count
    for _, plan in ranked:
        t = plan.gpu_type
        if t in rnd.reserved:
            continue
        mine = job.remaining_steps * plan.step_time_s
        need = plan.gpus - count.get(t, 0)
        usable = _usable_donors(rnd, t, need)
        if not usable:
            continue
        best: tuple[float, RunningJob, Plan | None, list[Gpu]] | None = None
        donors = usable[0] if len(usable) == 1 else heapq.merge(*usable)
        for neg_left, _, r in donors:
            if r.job.job_id in moved or r.ran_s(now) < min_run_s:
                continue
            if beat_s is not None and 2.0 * mine + r.job.restart_cost_s >= beat_s:
                continue
            best = _donor_option(rnd, r, left=-neg_left, t=t, mine=mine, need=need)
            if best is not None:
                break  # most time left first: the first donor with an option is the best one
        if best is None:
            continue
        _, r, donor_plan, kept = best
        gpus = rnd.free.hand_over([g for g in r.gpus if g not in kept], plan)
        if gpus is None:
            continue
        moved.add(r.job.job_id)
        mine_placement = Placement(job.job_id, plan, tuple(gpus))
        if donor_plan is None:
            return r.job.job_id, [mine_placement]
        return None, [Placement(r.job.job_id, donor_plan, tuple(kept)), mine_placement]
    return None


# ----------------------------------------------------------------------------- starvation


def relieve_starvation(
    rnd: Round, job: JobView, shape: PlanShape, gamma: float, totals: dict[str, int]
) -> None:
    """The head job, queued past :data:`STARVATION_S` and still blocked, gets its type.

    The type of its cheapest plan the cluster could hold (``totals``: GPUs per
    type): a holder moves there away (:func:`move_for`), else the type is
    reserved (no later job takes it in the round).  A job queued less long:
    nothing.
    """
    if rnd.now - job.arrival_s <= STARVATION_S:
        return
    for _, plan in shape.ranking(gamma):
        if plan.gpus <= totals.get(plan.gpu_type, 0):
            if not rnd.apply(move_for(rnd, job, plan)):
                rnd.reserved.add(plan.gpu_type)
                rnd.room = rnd.free.any_free_outside(rnd.reserved)
            return


def move_for(rnd: Round, job: JobView, plan: Plan) -> Outcome | None:
    """Start a starving ``job`` on ``plan``: one running job of its type moves to free GPUs of another.

    Without the move ``job`` waits about as long as a holder of its type
    runs (``m``); moved, the holder ends after its restart plus its time
    ``m'`` on the other type's best plan.  The sum of the two completion
    times drops when ``restart + m' < 2·m`` (an exchange argument; no
    tuned constant).  Candidates: running jobs of the type holding at
    least the GPUs ``plan`` still lacks, ``min_run_s`` of progress there, not
    changed this round; the one that gains most (ties: job id).  O(R·K)
    over the type's running jobs.
    """
    free = rnd.free
    count = free.count
    speeds = rnd.speeds
    t = plan.gpu_type
    need = plan.gpus - count.get(t, 0)
    options: list[tuple[float, str, RunningJob, Plan]] = []  # (-gain, job id, mover, its plan there)
    for have_n, bucket in rnd.runs_on.get(t, {}).items():
        if have_n < need:
            continue
        for neg_left, _, r in bucket:
            if r.job.job_id in rnd.moved or r.ran_s(rnd.now) < rnd.min_run_s:
                continue
            restart = r.job.restart_cost_s
            budget = -2.0 * neg_left - restart  # m' must stay below 2·m − restart
            best: tuple[float, str, RunningJob, Plan] | None = None
            for u, least, of_type in rnd.shapes_of.of(r.job).groups:
                if u == t or u in rnd.reserved or count.get(u, 0) < least:
                    continue
                for p in of_type:
                    if p.gpus > count[u] or r.job.remaining_steps * p.step_time_s >= budget:
                        continue  # too many GPUs, or even packed too slow
                    peers = free.peers_for(u, p.gpus, p.tp)
                    if peers == 0:
                        continue
                    there = r.job.remaining_steps * r.job.speed.step_time_s(p, speeds[u], peers)
                    if there < budget and (best is None or there - budget < best[0]):
                        best = (there - budget, r.job.job_id, r, p)
            if best is not None:
                options.append(best)
    for _, _, r, there_plan in sorted(options, key=lambda o: (o[0], o[1])):  # most gain first
        u = there_plan.gpu_type
        theirs = free.pick(u, there_plan.gpus, there_plan.tp)
        if theirs is None:  # cannot happen: the peer count said so
            continue
        mine = free.hand_over(list(r.gpus), plan)
        if mine is None:  # the freed GPUs do not hold the plan in whole tp groups
            continue
        rnd.moved.add(r.job.job_id)
        free.take(u, theirs)
        return None, [
            Placement(r.job.job_id, there_plan, tuple(theirs)),
            Placement(job.job_id, plan, tuple(mine)),
        ]
    return None


# ----------------------------------------------------------------------------- grow


def _grow_plan(
    rnd: Round, run: RunningJob, now_left: float, avail: dict[str, int]
) -> tuple[float, Plan] | None:
    """The plan on ``run``'s own GPUs plus idle ones (``avail`` per type) that ends it soonest, at least
    :data:`GROW_MIN_GAIN` sooner than ``now_left``, restart included: (its time left there, plan).

    Ties: faster packed step, type, GPU count.  Only the types it could use;
    the packed bound skips the speed model for plans that cannot win.
    """
    job = run.job
    free = rnd.free
    speeds = rnd.speeds
    restart = job.restart_cost_s
    target = now_left * (1.0 - GROW_MIN_GAIN)
    # Per type: (-free GPUs, peer), fullest first (the job's own GPUs count as free on its type).
    counts: dict[str, list[tuple[int, str]]] = {}
    best_key: tuple[float, float, str, int] | None = None
    best_plan: Plan | None = None
    have = len(run.gpus)
    for t, least, of_type in rnd.shapes_of.of(job).groups:
        own = t == run.plan.gpu_type
        n_avail = avail.get(t, 0) + (have if own else 0)
        if least > n_avail or (own and n_avail <= have):
            continue
        for plan in of_type:
            n = plan.gpus
            if n > n_avail or (own and n <= have):
                continue
            bound = restart + job.remaining_steps * plan.step_time_s  # packed: a lower bound
            if bound >= target or (best_key is not None and bound > best_key[0]):
                continue
            per_peer = counts.get(t)
            if per_peer is None:
                if own:
                    by_peer = {peer: len(gs) for peer, gs in free.by_type.get(t, {}).items()}
                    for g in run.gpus:
                        by_peer[g.peer] = by_peer.get(g.peer, 0) + 1
                    per_peer = sorted([(-c, peer) for peer, c in by_peer.items()])
                else:  # the index's list, kept across candidates until GPUs of the type change
                    per_peer = free.fullest(t)
                counts[t] = per_peer
            # As pick_packed: one peer when one holds it (tp groups then fit), else fullest first.
            if per_peer and -per_peer[0][0] >= n:
                peers = 1
            elif own:
                peers = peers_needed(per_peer, n, plan.tp)
            else:
                peers = free.peers_for(t, n, plan.tp)
            if peers == 0:
                continue
            left = restart + job.remaining_steps * job.speed.step_time_s(plan, speeds[t], peers)
            key = (left, plan.step_time_s, t, n)
            if left < target and (best_key is None or key < best_key):
                best_key, best_plan = key, plan
    if best_key is None or best_plan is None:
        return None
    return best_key[0], best_plan


def grow(rnd: Round, avail: dict[str, int], skip: set[str] | frozenset[str] = frozenset()) -> list[Placement]:
    """Move running jobs onto idle GPUs where it pays for their restart.

    ``avail``: the idle GPUs per type growth may use (the caller's own dict,
    updated here; GPUs a mover gives up join it).  A job moves when its new
    plan (its own GPUs plus idle ones of a type) finishes it at least
    :data:`GROW_MIN_GAIN` sooner, restart included.  The :data:`GROW_TRIES`
    running jobs with most work left (not in ``skip``: changed this round; not
    still starting: a start cut short wastes the work it did, and a live pool's
    starts share its hosts' CPUs), in
    that order, each at most once: O(R + GROW_TRIES·K·P).  Placements in
    discovery order: a move may use GPUs an earlier move gave up.
    """
    if not any(n > 0 for n in avail.values()):
        return []
    lefts = rnd.lefts
    free = rnd.free
    moves: list[Placement] = []
    # The top of all jobs is the top of the movable ones when every one of them is movable (the
    # usual case: the jobs with most work left are far from their last restart cost); else filter
    # all and take it again.
    top = heapq.nlargest(GROW_TRIES, lefts)
    now = rnd.now
    if any(left <= run.job.restart_cost_s * 2 or jid in skip or run.ran_s(now) < 0 for left, jid, run in top):
        top = heapq.nlargest(
            GROW_TRIES,
            [lr for lr in lefts
             if lr[0] > lr[2].job.restart_cost_s * 2 and lr[1] not in skip and lr[2].ran_s(now) >= 0],
        )
    for now_left, _, run in top:
        if not any(n > 0 for n in avail.values()):
            break
        best = _grow_plan(rnd, run, now_left, avail)
        if best is None:
            continue
        plan = best[1]
        t = plan.gpu_type
        if t == run.plan.gpu_type:  # its own GPUs count as free: a copy, new lists for their peers
            pool = dict(free.by_type.get(t, {}))
            for g in run.gpus:
                pool[g.peer] = [*pool.get(g.peer, ()), g]
            chosen = pick_packed(pool, plan.gpus, plan.tp)
            if chosen is None:  # cannot happen: the counts above said so
                continue
            mine = set(run.gpus)
            taken = set(chosen)
            new = [g for g in chosen if g not in mine]
            free.take(t, new)
        else:  # pick_packed's choice from the index's sorted peers, taken in place (no re-sort)
            picked = free.place(plan)
            if picked is None:  # cannot happen: the counts above said so
                continue
            chosen, taken, new = picked, set(picked), picked
        moves.append(Placement(run.job.job_id, plan, tuple(chosen)))
        avail[t] -= len(new)
        given = [g for g in run.gpus if g not in taken]
        free.give(given)
        for g in given:
            avail[g.gpu_type] = avail.get(g.gpu_type, 0) + 1
    return moves
