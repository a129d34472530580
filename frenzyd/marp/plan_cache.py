"""MARP's feasible plans reused across calls: a bounded cache keyed by exactly what the plans depend on.

``cached_feasible_plans`` answers what :func:`frenzyd.marp.plans.feasible_plans` answers (the same
list, element for element) and is what the coordinator calls for every queued job on every tick.

What a plan depends on (``plans.count_plan``), and so the key:

* per job: the model's config (its ``ModelSpec`` without the name, which only error messages use),
  the job shape (``plans.job_shape``: seq_len, dtype, optimizer, recompute, effective global batch),
  ``trainer_only`` and the analytic constants;
* per GPU type: the type, its speed, ``gpus_per_node or count`` (tensor parallelism inside one peer,
  and whether a plan spans peers), the calibration's overhead raise for the type;
* the memory budget ``memory_bytes / (1 + headroom)``, through the byte counts it was compared with:
  a type's plans computed under one budget are the plans under every budget in
  ``[largest byte count that fitted, smallest that did not)`` (``plans.Budget``), so a peer whose
  free memory moves by a few MiB does not recompute anything.  ``gpu_memory_bytes`` of the plans is
  stamped with the caller's memory;
* the GPU count only as a bound: the plan of ``n`` GPUs does not depend on how many more there are
  (when ``gpus_per_node`` is given), so the plans for up to ``N`` GPUs answer every bound ``<= N``
  and a larger bound computes only the counts past ``N``.

Peer identities, which peers hold the GPUs and anything else of the offer are not part of it.

In front of that, whole answers are kept by every input (the pools exactly): a queue asked about
again over an unchanged pool gets the very same tuple back (``PlanCache.plans``, ``cached_plans``),
so a caller can keep what it derives from an answer (its own plan records) by the answer's identity.

Bounded: at most ``maxsize`` job shapes (least recently used evicted), each with at most
``TYPES_PER_JOB`` per-type entries and ``BUDGETS_PER_TYPE`` budget intervals per entry; the tensor
peaks and per-shape answers behind them (``plans.Memo``) for the ``MEMO_SHAPES`` most recent shapes.
Safe to call from several threads without a lock: every mapping operation is a single atomic
operation under the GIL and entries are immutable, so a race costs a recomputation, never a wrong
answer.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from frenzyd.marp.analytic import DEFAULT_CONSTANTS, AnalyticConstants
from frenzyd.marp.calibration import Calibration
from frenzyd.marp.plans import (
    CALIBRATED_TORCH,
    DEFAULT_HEADROOM,
    Budget,
    Memo,
    count_plan,
    feasible_plans,
    job_shape,
    overhead_raise,
    plan_counts,
    plan_order,
)
from frenzyd.marp.spec import GpuPool, ModelSpec, Plan, TrainingSetup
from frenzyd.marp.validate import validate

DEFAULT_MAXSIZE = 1024
"""Job shapes kept (a lab's queue repeats a few models and shapes; each shape holds its types' plans,
typically tens of KiB)."""
TYPES_PER_JOB = 64
"""Per-type entries kept per job shape (type x speed x per-node bound x calibration raise)."""
BUDGETS_PER_TYPE = 4
"""Budget intervals kept per type entry (e.g. total memory and today's smallest free memory)."""
ANSWERS = 4096
"""Whole answers kept, by every input (a queue's jobs over today's pool, asked again on every pass)."""
MEMO_SHAPES = 32
"""Job shapes whose ``plans.Memo`` is kept (tensor peaks by setup, each dp x tp x pp's best variant per
type and budget interval): a type's plans recomputed after the pool changed (another free-memory
budget, per-peer bound or count) then mostly look answers up instead of predicting them."""
MEMO_SIZE = 32768
"""Entries one job shape's memo may hold before it starts afresh (a few thousand over a 1,000-peer
pool; ~250 B each)."""

TOKENS = 1024
"""Models and constants whose key numbers are kept."""


class _Key:
    """A key of large frozen parts (a model, a setup, pools) whose hash is computed once per call."""

    __slots__ = ("_hash", "parts")

    def __init__(self, parts: tuple[object, ...]) -> None:
        self.parts = parts
        self._hash = hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Key) and self._hash == other._hash and self.parts == other.parts


_TypeKey = tuple[str, float, int, bool, float]


@dataclass(frozen=True, slots=True)
class _Entry:
    """One GPU type's plans for one job shape, for 1..``bound`` GPUs, valid for budgets in
    ``[fit_max, miss_min)``; ascending GPU count."""

    fit_max: float
    miss_min: float
    bound: int
    memory_bytes: int
    counts: tuple[int, ...]
    plans: tuple[Plan, ...]

    def holds(self, budget: float) -> bool:
        return self.fit_max <= budget < self.miss_min


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was made (or ``clear``)."""

    hits: int
    """Per-type answers taken whole from the cache."""
    misses: int
    """Per-type answers computed (no entry held the budget), or extended past a cached bound."""
    counts_computed: int
    """GPU counts enumerated (each count resolved: ``plans.count_plan`` called, or no dp x tp x pp shape
    of it exists, ``plans.plan_counts``): the work done."""
    job_shapes: int
    """Job shapes held now."""


class PlanCache:
    """A bounded cache of feasible plans; ``maxsize=0`` disables it (every call enumerates afresh)."""

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE) -> None:
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0 disables the cache), got {maxsize}")
        self.maxsize = maxsize
        self._jobs: OrderedDict[_Key, dict[_TypeKey, tuple[_Entry, ...]]] = OrderedDict()
        self._memos: OrderedDict[_Key, Memo] = OrderedDict()
        self._answers: OrderedDict[_Key, tuple[Plan, ...]] = OrderedDict()
        self._tokens: dict[object, int] = {}
        self._by_id: dict[int, tuple[object, int]] = {}
        self._numbers = itertools.count()
        self._hits = self._misses = self._counts = 0

    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._counts, len(self._jobs))

    def clear(self) -> None:
        self._jobs.clear()
        self._memos.clear()
        self._answers.clear()
        self._tokens.clear()
        self._by_id.clear()
        self._hits = self._misses = self._counts = 0

    def feasible_plans(
        self,
        model: ModelSpec,
        setup: TrainingSetup,
        pools: Sequence[GpuPool],
        *,
        headroom: float = DEFAULT_HEADROOM,
        max_gpus: int | None = None,
        constants: AnalyticConstants = DEFAULT_CONSTANTS,
        calibration: Calibration | None = None,
        torch_version: str = CALIBRATED_TORCH,
        trainer_only: bool = False,
    ) -> list[Plan]:
        """Exactly :func:`frenzyd.marp.plans.feasible_plans`' answer (same arguments, same errors)."""
        answer = self.plans(model, setup, pools, headroom=headroom, max_gpus=max_gpus, constants=constants,
                            calibration=calibration, torch_version=torch_version, trainer_only=trainer_only)
        assert answer is not None  # computed when not cached
        return list(answer)

    def plans(
        self,
        model: ModelSpec,
        setup: TrainingSetup,
        pools: Sequence[GpuPool],
        *,
        headroom: float = DEFAULT_HEADROOM,
        max_gpus: int | None = None,
        constants: AnalyticConstants = DEFAULT_CONSTANTS,
        calibration: Calibration | None = None,
        torch_version: str = CALIBRATED_TORCH,
        trainer_only: bool = False,
        compute: bool = True,
    ) -> tuple[Plan, ...] | None:
        """:meth:`feasible_plans`' answer as a tuple that is the very same object for the same inputs as
        long as it is cached (``ANSWERS`` of them), so a caller may keep what it derives from an answer
        by the answer's identity (holding the answer, so the identity cannot be reused).

        ``compute=False``: answer only from what is cached (no GPU count is enumerated), or None when
        some type's plans would have to be computed (a new job shape, GPU type, memory budget or a
        larger count bound); a disabled cache (``maxsize=0``) then always answers None.  Only with
        ``compute=True`` is the answer never None."""
        if self.maxsize == 0:
            if not compute:
                return None
            return tuple(feasible_plans(model, setup, pools, headroom=headroom, max_gpus=max_gpus,
                                        constants=constants, calibration=calibration,
                                        torch_version=torch_version, trainer_only=trainer_only))
        job = job_shape(setup)
        jkey = _Key((self._token(model), job, trainer_only, self._token(constants)))
        extras = tuple(overhead_raise(calibration, pool.gpu_type, model, torch_version) for pool in pools)
        akey = _Key((jkey, tuple(pools), headroom, max_gpus, extras))
        answer = self._answers.get(akey)
        if answer is not None and jkey in self._jobs:  # an evicted job shape forgets its answers
            # (validated when it was computed: validity depends on nothing outside the key)
            with contextlib.suppress(KeyError):
                self._answers.move_to_end(akey)
                self._jobs.move_to_end(jkey)
            self._hits += len(pools)
            return answer
        validate(model, job)
        types = self._jobs.get(jkey)
        if types is None and not compute:
            return None
        if types is None:
            types = {}
            self._jobs[jkey] = types
            while len(self._jobs) > self.maxsize:
                try:
                    self._jobs.popitem(last=False)
                except KeyError:  # emptied by another thread
                    break
        else:
            with contextlib.suppress(KeyError):  # evicted by another thread: `types` still answers
                self._jobs.move_to_end(jkey)
        plans: list[Plan] = []
        memo = self._memo(jkey) if compute else Memo()
        for pool, extra in zip(pools, extras, strict=True):
            limit = pool.count if max_gpus is None else min(pool.count, max_gpus)
            got = self._type_plans(types, pool, limit, model=model, job=job, headroom=headroom,
                                   constants=constants, extra=extra, trainer_only=trainer_only, memo=memo,
                                   compute=compute)
            if got is None:
                return None
            plans.extend(got)
        plans.sort(key=plan_order)
        answer = tuple(plans)
        self._answers[akey] = answer
        while len(self._answers) > ANSWERS:
            try:
                self._answers.popitem(last=False)
            except KeyError:  # emptied by another thread
                break
        return answer

    def _token(self, value: object) -> int:
        """A small number standing for ``value`` (a model without its name, analytic constants) in keys:
        equal values get the same number while it is kept, and a number is never given to another
        value, so keys compare and hash in a few steps instead of a model's twenty fields."""
        hit = self._by_id.get(id(value))
        if hit is not None and hit[0] is value:  # a preset or the default constants: one object
            return hit[1]
        key = replace(value, name="") if isinstance(value, ModelSpec) else value  # the name: messages only
        token = self._tokens.get(key)
        if token is None:
            if len(self._tokens) >= TOKENS:
                self._tokens.clear()  # later keys miss once; never a wrong answer
            token = self._tokens[key] = next(self._numbers)
        if len(self._by_id) >= TOKENS:
            self._by_id.clear()
        self._by_id[id(value)] = (value, token)  # holds `value`, so its id is not reused meanwhile
        return token

    def _memo(self, jkey: _Key) -> Memo:
        memo = self._memos.get(jkey)
        if memo is None or len(memo) > MEMO_SIZE:
            memo = Memo()
            self._memos[jkey] = memo
            while len(self._memos) > MEMO_SHAPES:
                try:
                    self._memos.popitem(last=False)
                except KeyError:  # emptied by another thread
                    break
        else:
            with contextlib.suppress(KeyError):
                self._memos.move_to_end(jkey)
        return memo

    def _type_plans(
        self, types: dict[_TypeKey, tuple[_Entry, ...]], pool: GpuPool, limit: int, *, model: ModelSpec,
        job: TrainingSetup, headroom: float, constants: AnalyticConstants, extra: float, trainer_only: bool,
        memo: Memo, compute: bool = True,
    ) -> Sequence[Plan] | None:
        """``pool``'s plans for 1..``limit`` GPUs; None (``compute=False``) when they are not cached."""
        if limit < 1:
            return ()
        # Without gpus_per_node the count is also the per-peer bound: it is then part of the key.
        per_node = pool.gpus_per_node or pool.count
        tkey: _TypeKey = (pool.gpu_type, pool.speed, per_node, not pool.gpus_per_node, extra)
        budget = pool.memory_bytes / (1.0 + headroom)
        entries = types.get(tkey, ())
        found = next((e for e in entries if e.holds(budget) and e.memory_bytes == pool.memory_bytes), None)
        if found is None:
            found = next((e for e in entries if e.holds(budget)), None)
            if found is not None:  # same plans, another memory figure to show
                found = replace(found, memory_bytes=pool.memory_bytes,
                                plans=tuple(replace(p, gpu_memory_bytes=pool.memory_bytes)
                                            for p in found.plans))
                self._store(types, tkey, entries, None, found)
        if found is not None and found.bound >= limit:
            self._hits += 1
            return found.plans[: bisect.bisect_right(found.counts, limit)]
        if not compute:
            return None
        self._misses += 1
        rec = Budget(budget)
        first = 1 if found is None else found.bound + 1
        new = []
        for gpus in plan_counts(model, job, per_node, first, limit):
            p = count_plan(model, job, pool, gpus, rec, constants=constants, extra=extra,
                           trainer_only=trainer_only, memo=memo)
            if p is not None:
                new.append(p)
        self._counts += limit - first + 1
        if found is None:
            entry = _Entry(rec.fit_max, rec.miss_min, limit, pool.memory_bytes,
                           tuple(p.gpus for p in new), tuple(new))
        else:  # extended past its bound: valid where both the old and the new comparisons agree
            entry = _Entry(max(found.fit_max, rec.fit_max), min(found.miss_min, rec.miss_min), limit,
                           pool.memory_bytes, found.counts + tuple(p.gpus for p in new),
                           found.plans + tuple(new))
        self._store(types, tkey, entries, found, entry)
        return entry.plans

    @staticmethod
    def _store(types: dict[_TypeKey, tuple[_Entry, ...]], tkey: _TypeKey, entries: tuple[_Entry, ...],
               old: _Entry | None, entry: _Entry) -> None:
        kept = tuple(e for e in entries if e is not old)[: BUDGETS_PER_TYPE - 1]
        types.pop(tkey, None)
        types[tkey] = (entry, *kept)
        while len(types) > TYPES_PER_JOB:
            try:
                del types[next(iter(types))]
            except (KeyError, RuntimeError, StopIteration):  # changed by another thread
                break


_default = PlanCache()


def default_cache() -> PlanCache:
    """The process's plan cache (what ``cached_feasible_plans`` uses)."""
    return _default


def set_default_cache(cache: PlanCache) -> PlanCache:
    """Make ``cache`` the process's plan cache (``PlanCache(0)``: none); returns the previous one."""
    global _default
    old, _default = _default, cache
    return old


def cached_plans(
    model: ModelSpec,
    setup: TrainingSetup,
    pools: Sequence[GpuPool],
    *,
    headroom: float = DEFAULT_HEADROOM,
    max_gpus: int | None = None,
    constants: AnalyticConstants = DEFAULT_CONSTANTS,
    calibration: Calibration | None = None,
    torch_version: str = CALIBRATED_TORCH,
    trainer_only: bool = False,
) -> tuple[Plan, ...]:
    """:meth:`PlanCache.plans` of the process's plan cache: the answer as a tuple whose identity is
    stable while it is cached (derive per-answer values once, keyed by it)."""
    answer = _default.plans(model, setup, pools, headroom=headroom, max_gpus=max_gpus, constants=constants,
                            calibration=calibration, torch_version=torch_version, trainer_only=trainer_only)
    assert answer is not None  # computed when not cached
    return answer


def cached_feasible_plans(
    model: ModelSpec,
    setup: TrainingSetup,
    pools: Sequence[GpuPool],
    *,
    headroom: float = DEFAULT_HEADROOM,
    max_gpus: int | None = None,
    constants: AnalyticConstants = DEFAULT_CONSTANTS,
    calibration: Calibration | None = None,
    torch_version: str = CALIBRATED_TORCH,
    trainer_only: bool = False,
) -> list[Plan]:
    """:func:`frenzyd.marp.plans.feasible_plans`, answered from the process's plan cache."""
    return _default.feasible_plans(model, setup, pools, headroom=headroom, max_gpus=max_gpus,
                                   constants=constants, calibration=calibration,
                                   torch_version=torch_version, trainer_only=trainer_only)
