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
   the free GPUs force it across peers: the peer count comes from the sorted
   per-peer free counts, and GPUs are picked only for the winner), except that among plans within
   :data:`MEMORY_SLACK` of the best cost the one on the **smallest-memory**
   type is taken, so large-memory GPUs stay free for jobs only they can hold.
3. **Pack**: the GPUs come from one peer when one peer has them (best fit:
   the peer with the fewest free GPUs that suffices), else from the fullest
   peers, tensor-parallel groups never across peers.
4. **Grow when idle**: GPUs still idle after the queue pass, of types no
   waiting job can use, let a running job (the :data:`GROW_TRIES` with most
   work left; a placement's step time is cached) move to a bigger or faster
   plan if that ends it at least :data:`GROW_MIN_GAIN` sooner, its restart
   cost included.
5. **Shrink for short jobs**: a queued job that finds no free GPUs may take
   GPUs from one running job of the same type that has far more work left
   (:data:`SHRINK_RATIO`), which keeps running on a smaller MARP plan over a
   subset of its own GPUs, or, when no smaller plan frees enough, is stopped
   and requeued with its progress (shortest-remaining-time preemption; elastic
   like Sia's rescaling, but event-driven and only for the first
   :data:`SHRINK_TRIES` blocked jobs of a round, each over its
   :data:`SHRINK_PLANS` cheapest plans).
6. **Reserve against starvation**: when the head job has waited longer than
   :data:`STARVATION_S` and still cannot start, the GPU type of its cheapest
   plan that the cluster can hold is reserved for it: no later job takes GPUs
   of that type in this round, so it starts as soon as enough of them free up.

Invariants: only MARP-feasible plans; no GPU given twice (a placement removes
its GPUs from the free index); tp inside one peer; deterministic (sorting
keys end with the job id; no randomness used); a running job is only
re-placed or stopped for a job with at most 1/:data:`SHRINK_RATIO` of its
remaining time, and only after :data:`SHRINK_MIN_RUN_S` since its last start.
Cost per round: O(Q log Q + Q·K + G + R log R) for Q queued jobs, K plans per
job (rankings cached per plan set: K log K once per distinct set; early exit
when no GPU is free), G free GPUs and R running jobs (shrink donors sorted
once per type and round; each of the S ≤ 4 shrink attempts stops at the first
usable donor); no solver.
"""

from __future__ import annotations

import heapq
import random

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
GROW_WHEN_BLOCKED = True
"""Grow onto idle GPUs of types no waiting job can use, even while other jobs wait."""
GROW_TRIES = 8
"""Running jobs (most work left first) considered for growing per round."""
SHRINK_TRIES = 4
"""Blocked queued jobs per round for which a running job may be shrunk."""
SHRINK_PLANS = 4
"""A blocked job's cheapest plans considered for shrinking."""
SHRINK_RATIO = 4.0
"""A donor must have at least this many times the blocked job's remaining time left."""
SHRINK_MIN_RUN_S = 120.0
"""A donor must have run this long since its last (re)start: no thrashing."""
"""A running job moves onto idle GPUs only if that finishes it at least 20 % sooner (restart included)."""
"""Queue time after which the head job gets its GPU type reserved."""


def _peers_needed(counts_desc: list[int], n: int, tp: int) -> int:
    """Peers :func:`pick_packed` spans for ``n`` GPUs over several peers (fullest first); 0: impossible.

    ``counts_desc``: free GPUs per peer of one type, descending.  The same
    count as picking the GPUs, without building the lists: O(peers used).
    """
    got = 0
    used = 0
    for c in counts_desc:
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


class FrenzyPolicy:
    """Frenzy HAS (see module docstring for the algorithm, invariants and complexity)."""

    name = "frenzy"
    round_s: float | None = None

    def __init__(self) -> None:
        # Rankings and fastest step times depend only on a job's plan set: keyed by the identity of
        # its ``plans`` tuple (the entry keeps the tuple alive, so the id cannot be reused), jobs of
        # one shape (the simulator shares one tuple per model, sequence and batch) share the work.
        self._ranked: dict[tuple[int, float], tuple[tuple[Plan, ...], tuple[tuple[float, Plan], ...]]] = {}
        self._fastest: dict[int, tuple[tuple[Plan, ...], float]] = {}
        self._least: dict[int, tuple[tuple[Plan, ...], tuple[tuple[str, int], ...]]] = {}
        self._fast_first: dict[int, tuple[tuple[Plan, ...], tuple[Plan, ...]]] = {}
        self._pow: dict[float, list[float]] = {}  # n**gamma for small GPU counts, per gamma
        self._totals: tuple[Cluster, dict[str, int]] | None = None
        # (job, start, plan) -> (its GPUs, step time there): a placement's speed does not change.
        self._placed: dict[tuple[str, float, Plan], tuple[tuple[Gpu, ...], float]] = {}

    def _ranking(self, job: JobView, gamma: float) -> tuple[tuple[float, Plan], ...]:
        plans = job.plans
        key = (id(plans), gamma)
        entry = self._ranked.get(key)
        if entry is not None and entry[0] is plans:
            return entry[1]
        scale = self._pow.get(gamma)
        if scale is None:
            scale = self._pow[gamma] = [n**gamma for n in range(257)]
        # Decorated sort (no key function): cost, then type and GPU count (unique per plan: the
        # plans are at most one per type and count), then the index.
        order = sorted(
            [
                (
                    p.step_time_s * (scale[p.gpus] if p.gpus < 257 else p.gpus**gamma),
                    p.gpu_type,
                    p.gpus,
                    i,
                )
                for i, p in enumerate(plans)
            ]
        )
        ranked = tuple((o[0], plans[o[3]]) for o in order)
        if len(self._ranked) > 100_000:
            self._ranked.clear()
        self._ranked[key] = (plans, ranked)
        return ranked

    def _smallest(self, job: JobView) -> tuple[tuple[str, int], ...]:
        """(type, fewest GPUs of any plan of that type) for each type the job has plans on; cached."""
        plans = job.plans
        entry = self._least.get(id(plans))
        if entry is not None and entry[0] is plans:
            return entry[1]
        least: dict[str, int] = {}
        for p in plans:
            if p.gpus < least.get(p.gpu_type, 1 << 30):
                least[p.gpu_type] = p.gpus
        out = tuple(sorted(least.items()))
        if len(self._least) > 100_000:
            self._least.clear()
        self._least[id(plans)] = (plans, out)
        return out

    def _by_step(self, job: JobView) -> tuple[Plan, ...]:
        """The job's plans by packed step time, fastest first (ties: type, GPU count); cached per plan set."""
        plans = job.plans
        entry = self._fast_first.get(id(plans))
        if entry is not None and entry[0] is plans:
            return entry[1]
        order = tuple(p for _, _, _, p in sorted((p.step_time_s, p.gpu_type, p.gpus, p) for p in plans))
        if len(self._fast_first) > 100_000:
            self._fast_first.clear()
        self._fast_first[id(plans)] = (plans, order)
        return order

    def _preferred_gpus(self, job: JobView, gpu_type: str) -> int:
        """GPU count of the job's cheapest plan of ``gpu_type`` while others wait (its un-grown size)."""
        for _, plan in self._ranking(job, GAMMA):
            if plan.gpu_type == gpu_type:
                return plan.gpus
        return 1

    def _type_totals(self, cluster: Cluster) -> dict[str, int]:
        """GPUs per type in the (static) cluster: counted once per cluster object, when first needed."""
        if self._totals is None or self._totals[0] is not cluster:
            counts: dict[str, int] = {}
            for g in cluster.gpus:
                counts[g.gpu_type] = counts.get(g.gpu_type, 0) + 1
            self._totals = (cluster, counts)
        return self._totals[1]

    def _remaining_s(self, job: JobView) -> float:
        plans = job.plans
        entry = self._fastest.get(id(plans))
        if entry is not None and entry[0] is plans:
            return job.remaining_steps * entry[1]
        fastest = min((p.step_time_s for p in plans), default=float("inf"))
        if len(self._fastest) > 100_000:
            self._fastest.clear()
        self._fastest[id(plans)] = (plans, fastest)
        return job.remaining_steps * fastest

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
        for g in snapshot.free:
            t = g.gpu_type
            by_peer = free.get(t)
            if by_peer is None:
                by_peer = free[t] = {}
                free_n[t] = 0
            on_peer = by_peer.get(g.peer)
            if on_peer is None:
                by_peer[g.peer] = [g]
            else:
                on_peer.append(g)
            free_n[t] += 1
        # Each running job's time left where it runs, once per round (the one O(R) pass).
        lefts = [(r.job.remaining_steps * self._placed_step_s(r, speeds), r) for r in snapshot.running]
        if not snapshot.queued:
            return Decision(placements=tuple(self._grow(lefts, free, free_n, speeds)))
        now = snapshot.now_s
        runs_on: dict[str, list[tuple[float, RunningJob]]] = {}
        for lr in lefts:
            runs_on.setdefault(lr[1].plan.gpu_type, []).append(lr)
        moved: set[str] = set()
        wanted: set[str] = set()

        shrink_tries = SHRINK_TRIES
        donor_order: dict[str, dict[int, list[tuple[float, int, RunningJob]]]] = {}  # shrink donors (cache)
        max_free: dict[str, int] = {}  # most free GPUs on one peer, per type (cache, dropped on change)
        peer_counts: dict[str, list[int]] = {}  # free GPUs per peer, descending, per type (same)
        order = sorted(
            snapshot.queued,
            key=lambda j: (self._remaining_s(j) - AGING * (now - j.arrival_s), j.arrival_s, j.job_id),
        )
        reserved: set[str] = set()
        placements: list[Placement] = []
        preemptions: list[str] = []
        placed_queued = 0
        left = len(order)
        for i, job in enumerate(order):
            left -= 1
            if shrink_tries <= 0 and not any(n > 0 for t, n in free_n.items() if t not in reserved):
                break
            gamma = GAMMA if left > 0 else GAMMA_ALONE
            smallest = self._smallest(job)
            candidates: list[tuple[float, Plan, list[Gpu] | None]] = []
            best = float("inf")
            reach = 1.0 + MEMORY_SLACK
            # O(types) test first: a job none of whose smallest plans per type has the GPUs free is
            # blocked without scanning (or, cold, even ranking) its plans.
            fits = any(free_n.get(t, 0) >= n and t not in reserved for t, n in smallest)
            for packed_cost, plan in self._ranking(job, gamma) if fits else ():
                if packed_cost > best * reach:
                    break  # the packed cost is a lower bound of the real one
                t = plan.gpu_type
                if t in reserved or free_n.get(t, 0) < plan.gpus:
                    continue
                biggest = max_free.get(t)
                if biggest is None:
                    biggest = max_free[t] = max((len(gs) for gs in free[t].values()), default=0)
                if plan.gpus <= biggest:  # fits on one peer: the packed cost is exact, pick GPUs later
                    candidates.append((packed_cost, plan, None))
                    best = min(best, packed_cost)
                    continue
                per_peer = peer_counts.get(t)
                if per_peer is None:
                    per_peer = peer_counts[t] = sorted((len(gs) for gs in free[t].values()), reverse=True)
                peers = _peers_needed(per_peer, plan.gpus, plan.tp)
                if peers == 0:
                    continue
                step = job.speed.step_time_s(plan, speeds[t], peers)
                cost = step * plan.gpus**gamma
                candidates.append((cost, plan, None))
                best = min(best, cost)
            if candidates:
                _, choice, maybe = min(
                    (c for c in candidates if c[0] <= best * (1.0 + MEMORY_SLACK)),
                    key=lambda c: (memory[c[1].gpu_type], c[0], c[1].gpu_type, c[1].gpus),
                )
                gpus = maybe or pick_packed(free[choice.gpu_type], choice.gpus, choice.tp)
                if gpus is None:  # cannot happen: one peer had room; keep the invariant explicit
                    continue
                max_free.pop(choice.gpu_type, None)
                peer_counts.pop(choice.gpu_type, None)
                for g in gpus:
                    free[choice.gpu_type][g.peer].remove(g)
                free_n[choice.gpu_type] -= len(gpus)
                placements.append(Placement(job.job_id, choice, tuple(gpus)))
                placed_queued += 1
                continue
            if shrink_tries > 0:
                shrink_tries -= 1
                pair = self._shrink_for(
                    job,
                    self._ranking(job, gamma),
                    runs_on=runs_on,
                    donor_order=donor_order,
                    moved=moved,
                    free=free,
                    free_n=free_n,
                    speeds=speeds,
                    now=now,
                    reserved=reserved,
                )
                if pair is not None:
                    stopped, places = pair
                    max_free.clear()
                    peer_counts.clear()
                    if stopped is not None:
                        preemptions.append(stopped)
                    placements.extend(places)
                    placed_queued += 1
                    continue
            if len(wanted) < len(free_n):  # types a waiting job could use: not for growing
                wanted.update(t for t, _ in smallest)
            if i == 0 and now - job.arrival_s > STARVATION_S:
                total = self._type_totals(cluster)
                for _, plan in self._ranking(job, gamma):
                    if plan.gpus <= total.get(plan.gpu_type, 0):
                        reserved.add(plan.gpu_type)
                        break
        if not preemptions and (GROW_WHEN_BLOCKED or placed_queued == len(order)):
            idle = {t: n for t, n in free_n.items() if t not in wanted and t not in reserved}
            placements.extend(self._grow(lefts, free, idle, speeds, skip=moved))
        return Decision(placements=tuple(placements), preemptions=tuple(preemptions))

    def _shrink_for(
        self,
        job: JobView,
        ranked: tuple[tuple[float, Plan], ...],
        *,
        runs_on: dict[str, list[tuple[float, RunningJob]]],
        donor_order: dict[str, dict[int, list[tuple[float, int, RunningJob]]]],
        moved: set[str],
        free: dict[str, dict[str, list[Gpu]]],
        free_n: dict[str, int],
        speeds: dict[str, float],
        now: float,
        reserved: set[str],
    ) -> tuple[str | None, list[Placement]] | None:
        """Make room for a blocked ``job`` by shrinking (or stopping) one much longer running job.

        The donor, of the same GPU type, keeps a subset of its own GPUs (a
        smaller MARP plan of its type) or, when no smaller plan frees enough,
        is stopped and requeued with its progress (returned as the first
        element); the GPUs it gives up, with the free ones, must hold
        ``job``'s plan.  Donors: ran at least :data:`SHRINK_MIN_RUN_S` since their last
        start, not changed this round, and either with at least
        :data:`SHRINK_RATIO` times ``job``'s remaining time left, or grown past
        their preferred size (they then shrink, at most back to that size).  O(K·R).
        """
        for _, plan in ranked[:SHRINK_PLANS]:
            t = plan.gpu_type
            if t in reserved:
                continue
            mine = job.remaining_steps * plan.step_time_s
            need = plan.gpus - free_n.get(t, 0)
            best: tuple[float, RunningJob, Plan | None, list[Gpu]] | None = None
            buckets = donor_order.get(t)
            if buckets is None:
                # Once per type per round: the runs that may give GPUs, bucketed by their GPU count and
                # most time left first inside a bucket (ties: snapshot order), each costed once.
                buckets = donor_order[t] = {}
                for k, (r_left, r) in enumerate(runs_on.get(t, ())):
                    if now - r.started_s >= SHRINK_MIN_RUN_S:
                        buckets.setdefault(len(r.gpus), []).append((-r_left, k, r))
                for bucket in buckets.values():
                    bucket.sort(key=lambda d: (d[0], d[1]))
            # Only donors holding at least ``need`` GPUs can help: merge those buckets, in the same
            # most-time-left-first order as one sorted list (O(visited · log sizes), not O(R)).
            usable = [b for have_n, b in buckets.items() if have_n >= need]
            donors = usable[0] if len(usable) == 1 else heapq.merge(*usable, key=lambda d: (d[0], d[1]))
            for neg_left, _, r in donors:
                left = -neg_left
                if r.job.job_id in moved:
                    continue
                have = len(r.gpus)
                # A job grown past its own preferred size gives the extra GPUs back to anyone.
                floor = self._preferred_gpus(r.job, t)
                grown = have > floor
                if left < SHRINK_RATIO * mine and not grown:
                    continue
                own: dict[str, list[Gpu]] = {}
                for g in r.gpus:
                    own.setdefault(g.peer, []).append(g)
                option: tuple[float, RunningJob, Plan | None, list[Gpu]] | None = None
                if left >= SHRINK_RATIO * mine:
                    option = (left, r, None, [])
                for smaller in sorted(r.job.plans, key=lambda q: -q.gpus):
                    if smaller.gpu_type != t or smaller.gpus >= have or have - smaller.gpus < need:
                        continue
                    if left < SHRINK_RATIO * mine and smaller.gpus < floor:
                        continue
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
            pool = {peer: list(gs) for peer, gs in free.get(t, {}).items()}
            for g in r.gpus:
                if g not in kept:
                    pool.setdefault(g.peer, []).append(g)
            gpus = pick_packed(pool, plan.gpus, plan.tp)
            if gpus is None:
                continue
            moved.add(r.job.job_id)
            released = [g for g in r.gpus if g not in kept]
            for g in released:
                free.setdefault(t, {}).setdefault(g.peer, []).append(g)
            free_n[t] = free_n.get(t, 0) + len(released)
            for g in gpus:
                free[t][g.peer].remove(g)
            free_n[t] -= len(gpus)
            mine_placement = Placement(job.job_id, plan, tuple(gpus))
            if donor_plan is None:
                return r.job.job_id, [mine_placement]
            return None, [Placement(r.job.job_id, donor_plan, tuple(kept)), mine_placement]
        return None

    def _grow(
        self,
        lefts: list[tuple[float, RunningJob]],
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
        # The GROW_TRIES running jobs with the most work left (the ones a move helps most), by the
        # packed estimate (plain arithmetic, O(R)); the speed model re-costs only those few.
        # (Shrunk this round: a job's old GPUs are not its own any more.)
        movable = [
            (left, run.job.job_id, run)
            for left, run in lefts
            if left > run.job.speed.restart_cost_s * 2 and run.job.job_id not in skip
        ]
        for now_left, _, run in heapq.nlargest(GROW_TRIES, movable, key=lambda x: (x[0], x[1])):
            job = run.job
            if not any(n > 0 for n in free_n.values()):
                break
            restart = job.restart_cost_s
            target = now_left * (1.0 - GROW_MIN_GAIN)
            # Per type: free GPUs per peer, descending (the job's own GPUs count as free on its type).
            counts: dict[str, list[int]] = {}
            best: tuple[float, Plan] | None = None
            for plan in self._by_step(job):
                bound = restart + job.remaining_steps * plan.step_time_s  # packed: a lower bound
                if bound >= target or (best is not None and bound >= best[0]):
                    break  # plans come fastest first: no later one can do better
                t = plan.gpu_type
                own = t == run.plan.gpu_type
                avail = free_n.get(t, 0) + (len(run.gpus) if own else 0)
                if plan.gpus > avail or (own and plan.gpus <= len(run.gpus)):
                    continue
                per_peer = counts.get(t)
                if per_peer is None:
                    by_peer = {peer: len(gs) for peer, gs in free.get(t, {}).items()}
                    if own:
                        for g in run.gpus:
                            by_peer[g.peer] = by_peer.get(g.peer, 0) + 1
                    per_peer = counts[t] = sorted(by_peer.values(), reverse=True)
                # As pick_packed: one peer when one holds the plan (tp groups then fit), else fullest first.
                peers = (
                    1
                    if per_peer and per_peer[0] >= plan.gpus
                    else _peers_needed(per_peer, plan.gpus, plan.tp)
                )
                if peers == 0:
                    continue
                left = restart + job.remaining_steps * job.speed.step_time_s(plan, speeds[t], peers)
                if left < target and (best is None or left < best[0]):
                    best = (left, plan)
            picked: tuple[float, Plan, list[Gpu]] | None = None
            if best is not None:
                t = best[1].gpu_type
                pool = {peer: list(gs) for peer, gs in free.get(t, {}).items()}
                if t == run.plan.gpu_type:
                    for g in run.gpus:
                        pool.setdefault(g.peer, []).append(g)
                chosen = pick_packed(pool, best[1].gpus, best[1].tp)
                if chosen is not None:  # always: the counts above said so
                    picked = (best[0], best[1], chosen)
            best3 = picked
            if best3 is not None:
                moves.append((now_left - best3[0], job.job_id, best3[1], best3[2]))
                t = best3[1].gpu_type
                mine = set(run.gpus)
                taken = set(best3[2])
                for g in best3[2]:
                    if g not in mine:
                        free[t][g.peer].remove(g)
                        free_n[t] -= 1
                for g in run.gpus:
                    if g not in taken:
                        free.setdefault(g.gpu_type, {}).setdefault(g.peer, []).append(g)
                        free_n[g.gpu_type] = free_n.get(g.gpu_type, 0) + 1
        # In discovery order: a move may use GPUs an earlier move gave up.
        return [Placement(jid, plan, tuple(gpus)) for _, jid, plan, gpus in moves]
