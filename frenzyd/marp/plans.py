"""Enumerates the feasible GPU plans of a job over a pool inventory and ranks them by estimated step time.

Per GPU type, every GPU count that factors as dp x tp x pp (tp inside one
peer and dividing the heads, pp dividing the layers, dp dividing the global
batch) is tried with ZeRO 0-3 and the micro-batches that keep the job's global
batch exact; a shape is feasible when ``bytes_per_gpu x (1 + headroom) <=
gpu_memory_bytes``, with ``bytes_per_gpu`` = analytic tensor peak + the type's
runtime overhead.  Only the fastest shape per (type, count) is kept.

Step time (constants and sources in ``marp/README.md``)::

    compute = (6·P + 2·P·[recompute]) · T + (6 + 2·[recompute]) · L · s · h_attn · T
              / (gpus · peak_flops · MFU)   (T = tokens per step; causal attention counted once)
    bubble  = compute · (pp - 1) / grad_accum      (1F1B)
    comm    = dp gradient sync (every micro-step, as the reference step runs)
              + ZeRO-3 parameter all-gathers + tp activation all-reduces,
              each bytes / link bandwidth (NVLink or PCIe inside a peer, Ethernet across peers)

Pure and deterministic: the same inputs give the same list.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from frenzyd.errors import InfeasibleError
from frenzyd.gpu_types import known_type
from frenzyd.marp import model as M
from frenzyd.marp.analytic import DEFAULT_CONSTANTS, AnalyticConstants, predict
from frenzyd.marp.calibration import Calibration
from frenzyd.marp.combos import runs
from frenzyd.marp.overhead import overhead_bytes
from frenzyd.marp.spec import GpuPool, ModelSpec, Plan, TrainingSetup
from frenzyd.marp.validate import validate

GIB = 1024**3

DEFAULT_HEADROOM = 0.10
"""Fraction of free memory a plan must leave unused (``bytes × (1 + headroom) ≤ memory``)."""

MFU = 0.40
"""Model FLOPs utilisation: PaLM reports 46 % and Megatron-LM 41-52 % on A100 clusters (Chowdhery et
al. 2022, Narayanan et al. 2021); a lab's HF training loop lands lower, so 0.40 is an upper-ish figure
applied equally to every type (only the ranking matters)."""

V100_TFLOPS = 125.0
"""Scale for types outside the canonical table: ``speed × V100 peak``."""

NVLINK_BPS = 150e9
"""Effective all-reduce bus bandwidth over NVLink (A100/H100 SXM: 300-450 GB/s unidirectional NVLink,
NCCL tests show 150-250 GB/s bus bandwidth)."""
PCIE_BPS = 12e9
"""Effective bus bandwidth between GPUs over PCIe 3/4 x16 on a workstation (nominal 16/32 GB/s)."""
ETHERNET_BPS = 1.25e9
"""Between peers: 10 GbE, the common lab LAN (1.25 GB/s nominal)."""

_NVLINK_TYPES = frozenset({"A100-40GB", "A100-80GB", "H100-80GB", "H200"})


@dataclass(frozen=True, slots=True)
class _Shape:
    dp: int
    tp: int
    pp: int


CALIBRATED_TORCH = "2.13"
"""The torch version MARP's predictions were validated for: the default calibration key."""


@functools.lru_cache(maxsize=4096)
def _divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    """The divisors of ``n`` (at most ``limit``), ascending, in O(sqrt(n)) steps, or O(limit) when a
    limit is given (a model config's 2**31 layers took minutes as a scan of every number to n)."""
    if limit is not None and limit < math.isqrt(n):
        return tuple(d for d in range(1, limit + 1) if n % d == 0)
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    every = small + [n // d for d in reversed(small) if d * d != n]
    return tuple(d for d in every if limit is None or d <= limit)


def _peak_flops(pool: GpuPool) -> float:
    info = known_type(pool.gpu_type)
    tflops = info.peak_tflops if info is not None else pool.speed * V100_TFLOPS
    return tflops * 1e12


def step_time_s(model: ModelSpec, setup: TrainingSetup, pool: GpuPool) -> float:
    """Estimated seconds per optimizer step of ``setup``'s plan on ``pool``'s GPU type."""
    gpus = setup.world_size
    gb = setup.effective_global_batch
    tokens = gb * setup.seq_len
    params = M.param_count(model)
    rec = setup.recompute == "full"
    attn_width = model.heads * model.head_dim
    flops = (6 + 2 * rec) * params * tokens + (
        6 + 2 * rec
    ) * model.layers * setup.seq_len * attn_width * tokens
    compute = flops / (gpus * _peak_flops(pool) * MFU)
    micro = setup.grad_accum
    bubble = compute * (setup.pp - 1) / micro if setup.pp > 1 else 0.0

    per_node = pool.gpus_per_node or pool.count
    intra = NVLINK_BPS if pool.gpu_type in _NVLINK_TYPES else PCIE_BPS
    spans = gpus > per_node
    dp_bw = ETHERNET_BPS if spans else intra
    pbytes = 2 if setup.dtype == "bf16" else 4
    shard_params = params / (setup.tp * setup.pp)
    comm = 0.0
    d = setup.dp
    if d > 1:
        ring = (d - 1) / d
        grad_bytes = shard_params * pbytes
        comm += (
            micro * 2 * ring * grad_bytes / dp_bw
        )  # all-reduce (or reduce-scatter + gather) per micro-step
        if setup.zero == 1:
            comm += ring * grad_bytes / dp_bw  # parameter broadcast after the sharded step
        if setup.zero == 3:
            comm += micro * 2 * ring * grad_bytes / dp_bw  # params gathered again for backward
    if setup.tp > 1:
        act = setup.micro_batch * setup.seq_len * model.hidden * (2 if setup.dtype != "fp32" else 4)
        per_layer = 4 * 2 * (setup.tp - 1) / setup.tp * act / intra
        comm += micro * (model.layers // setup.pp) * per_layer
    if setup.pp > 1:
        act = setup.micro_batch * setup.seq_len * model.hidden * 4
        comm += micro * 2 * act / (ETHERNET_BPS if spans else intra)
    return compute + bubble + comm


def _shapes(model: ModelSpec, gpus: int, per_node: int, global_batch: int) -> list[_Shape]:
    """Every dp x tp x pp = ``gpus`` the model and batch allow, tp then pp ascending (tp <= per_node and
    dividing heads, kv heads and ffn; pp dividing the layers; dp dividing the global batch)."""
    out = []
    pps = _divisors(model.layers, gpus)  # pp <= gpus: no need for the larger divisors
    for tp in range(1, min(gpus, per_node) + 1):
        if gpus % tp or model.heads % tp or model.kv_heads % tp or model.ffn % tp:
            continue
        rest = gpus // tp
        for pp in pps:
            if pp > rest:
                break
            if rest % pp:
                continue
            dp = rest // pp
            if global_batch % dp:
                continue
            out.append(_Shape(dp, tp, pp))
    return out


@functools.lru_cache(maxsize=4096)
def _counts_upto(layout: tuple[int, int, int, int], per_node: int, global_batch: int, last: int
                 ) -> tuple[int, ...]:
    """Every GPU count up to ``last`` that factors as dp x tp x pp as ``_shapes`` allows, ascending
    (``layout``: the model's layers, heads, kv heads and ffn width)."""
    layers, heads, kv_heads, ffn = layout
    out: set[int] = set()
    for tp in range(1, min(per_node, last) + 1):
        if heads % tp or kv_heads % tp or ffn % tp:
            continue
        for pp in _divisors(layers, last // tp):
            for dp in _divisors(global_batch, last // (tp * pp)):
                out.add(dp * tp * pp)
    return tuple(sorted(out))


def plan_counts(
    model: ModelSpec, job: TrainingSetup, per_node: int, first: int, last: int
) -> tuple[int, ...]:
    """The GPU counts in ``[first, last]`` that have a dp x tp x pp shape at all (``_shapes`` is empty
    for every other count, so ``count_plan`` is None there without comparing any byte count): an
    enumeration over a pool of a thousand GPUs of a type visits the few dozen counts that can hold a
    plan, not all thousand."""
    if last < max(1, first):
        return ()
    counts = _counts_upto((model.layers, model.heads, model.kv_heads, model.ffn), per_node,
                          job.effective_global_batch, last)
    return counts[bisect.bisect_left(counts, first):]


_Variant = tuple[int, int, int, int, int]
"""(micro-batch, ZeRO stage, dp, tp, pp) of a candidate of one job shape."""
Peaks = dict[_Variant, int]
"""Tensor peaks already predicted for one model, job shape and constants, by variant (they do not
depend on the GPU type): shared by every type and count of one enumeration, and by the plan cache
across calls."""


def _bytes(gpu_type: str, peak: int, world_size: int, extra: float) -> int:
    """A candidate's bytes per GPU: its tensor peak, the type's runtime overhead, the calibration's raise."""
    return peak + overhead_bytes(gpu_type, peak, world_size) + int(extra * peak)


def overhead_raise(
    calibration: Calibration | None, gpu_type: str, model: ModelSpec, torch_version: str
) -> float:
    """The calibration's raise of the runtime overhead of ``gpu_type``, as a fraction of the tensor peak."""
    if calibration is None:
        return 0.0
    c = calibration.correction(gpu_type, model.family, torch_version)
    return c.extra_overhead_fraction if c.applies else 0.0


class Budget:
    """A GPU's memory budget for tensors + overhead (``memory / (1 + headroom)``) that records what it
    was compared with: every answer of :meth:`fits` stays the same for any budget in
    ``[fit_max, miss_min)``, so a plan computed under it is the plan for every such budget
    (``frenzyd.marp.plan_cache`` reuses it there)."""

    __slots__ = ("fit_max", "limit", "miss_min")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.fit_max = -math.inf
        """The largest byte count that fitted (-inf: none was compared)."""
        self.miss_min = math.inf
        """The smallest byte count that did not fit (inf: none was compared)."""

    def fits(self, nbytes: int) -> bool:
        if nbytes <= self.limit:
            self.fit_max = max(self.fit_max, nbytes)
            return True
        self.miss_min = min(self.miss_min, nbytes)
        return False


def job_shape(setup: TrainingSetup) -> TrainingSetup:
    """The part of ``setup`` plans depend on (seq_len, dtype, optimizer, recompute, effective global
    batch), as the one-GPU setup every candidate is derived from."""
    return TrainingSetup(seq_len=setup.seq_len, micro_batch=1, dtype=setup.dtype,
                         global_batch=setup.effective_global_batch, optimizer=setup.optimizer,
                         recompute=setup.recompute, zero=0, dp=1, tp=1, pp=1)


def _variant(job: TrainingSetup, shape: _Shape, micro_batch: int, zero: int) -> TrainingSetup:
    """``replace(job, micro_batch=, zero=, dp=, tp=, pp=)`` without ``replace``'s introspection (hot)."""
    return TrainingSetup(seq_len=job.seq_len, micro_batch=micro_batch, dtype=job.dtype,
                         global_batch=job.global_batch, optimizer=job.optimizer, recompute=job.recompute,
                         zero=zero, dp=shape.dp, tp=shape.tp, pp=shape.pp)


_Best = tuple[float, TrainingSetup, int]
"""A shape's fastest fitting variant: (step time, setup, bytes per GPU)."""
_ShapeKey = tuple[str, float, float, int, int, int, bool]
"""GPU type, speed, calibration raise, dp, tp, pp, spans peers."""


@dataclass(slots=True)
class Memo:
    """What enumerating one job's plans learnt that holds for any pool: tensor peaks and whether the
    trainer runs a variant (neither depends on the GPU type), and each shape's fastest fitting
    variant by GPU type, speed, calibration raise, dp/tp/pp and whether it spans peers, for the budget
    intervals it was found under (``Budget``).  For one model, job shape, ``trainer_only`` and
    constants."""

    peaks: Peaks = field(default_factory=dict)
    runs: dict[_Variant, bool] = field(default_factory=dict)
    shapes: dict[_ShapeKey, tuple[tuple[float, float, _Best | None], ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.peaks) + len(self.runs) + len(self.shapes)


def _shape_best(
    model: ModelSpec, job: TrainingSetup, pool: GpuPool, shape: _Shape, budget: Budget, *,
    constants: AnalyticConstants, extra: float, trainer_only: bool, memo: Memo,
) -> _Best | None:
    """The fastest fitting (ZeRO stage, micro-batch) of ``shape`` on ``pool``'s type, or None."""
    peaks, gpus = memo.peaks, shape.dp * shape.tp * shape.pp

    def nbytes(micro: int, zero: int) -> int:
        key = (micro, zero, shape.dp, shape.tp, shape.pp)
        peak = peaks.get(key)
        if peak is None:
            peak = peaks[key] = predict(model, _variant(job, shape, micro, zero), constants=constants,
                                        check=False).peak_bytes
        return _bytes(pool.gpu_type, peak, gpus, extra)

    def trainer_runs(micro: int, zero: int) -> bool:
        key = (micro, zero, shape.dp, shape.tp, shape.pp)
        ok = memo.runs.get(key)
        if ok is None:
            ok = memo.runs[key] = runs(_variant(job, shape, micro, zero), model)
        return ok

    per_dp = job.effective_global_batch // shape.dp
    micros: Sequence[int] = _divisors(per_dp)
    zeros = (0, 1, 2, 3) if shape.dp > 1 else (0,)
    # The smallest variants of a shape are ZeRO-3 and (when FSDP2's unsharded root group
    # outweighs DDP's buckets, e.g. dp = 2) ZeRO-1 at micro-batch 1: if both miss, all do.
    if not budget.fits(nbytes(1, zeros[-1])) and (shape.dp == 1 or not budget.fits(nbytes(1, 1))):
        return None
    best: _Best | None = None
    for zero in zeros:
        # Largest micro-batch that fits is the fastest for this zero (fewer micro-steps).
        fit: tuple[int, int] | None = None
        if trainer_only:  # what runs depends on the micro-batch only through grad_accum
            micros = [m for m in _divisors(per_dp) if trainer_runs(m, zero)]
        lo, hi = 0, len(micros) - 1
        while lo <= hi:  # memory grows with the micro-batch: binary search
            mid = (lo + hi) // 2
            b = nbytes(micros[mid], zero)
            if budget.fits(b):
                fit = (micros[mid], b)
                lo = mid + 1
            else:
                hi = mid - 1
        if fit is None:
            continue
        cand = _variant(job, shape, fit[0], zero)
        t = step_time_s(model, cand, pool)
        if best is None or t < best[0]:
            best = (t, cand, fit[1])
    return best


def count_plan(
    model: ModelSpec,
    job: TrainingSetup,
    pool: GpuPool,
    gpus: int,
    budget: Budget,
    *,
    constants: AnalyticConstants = DEFAULT_CONSTANTS,
    extra: float = 0.0,
    trainer_only: bool = False,
    memo: Memo | None = None,
) -> Plan | None:
    """The fastest feasible plan of exactly ``gpus`` GPUs of ``pool``'s type, or None.

    ``job`` is :func:`job_shape`'s; ``extra`` the calibration's raise of the type's overhead.  Depends on
    ``pool`` only through its type, speed, ``gpus_per_node or count`` and (``gpu_memory_bytes`` of the
    plan) its memory, and on the memory budget only through ``budget.fits``.  ``memo``: what earlier
    enumerations of this model, job shape, ``trainer_only`` and constants found (filled in here).
    """
    per_node = pool.gpus_per_node or pool.count
    best: _Best | None = None
    for shape in _shapes(model, gpus, per_node, job.effective_global_batch):
        found: _Best | None
        if memo is None:
            found = _shape_best(model, job, pool, shape, budget, constants=constants, extra=extra,
                                trainer_only=trainer_only, memo=Memo())
        else:
            key = (pool.gpu_type, pool.speed, extra, shape.dp, shape.tp, shape.pp, gpus > per_node)
            known = memo.shapes.get(key, ())
            hit = next((k for k in known if k[0] <= budget.limit < k[1]), None)
            if hit is not None:  # the same comparisons would give the same answers
                budget.fit_max, budget.miss_min = max(budget.fit_max, hit[0]), min(budget.miss_min, hit[1])
                found = hit[2]
            else:
                own = Budget(budget.limit)
                found = _shape_best(model, job, pool, shape, own, constants=constants, extra=extra,
                                    trainer_only=trainer_only, memo=memo)
                budget.fit_max, budget.miss_min = max(budget.fit_max, own.fit_max), min(budget.miss_min,
                                                                                      own.miss_min)
                memo.shapes[key] = ((own.fit_max, own.miss_min, found), *known[:3])
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    if best is None:
        return None
    t, cand, b = best
    return Plan(gpu_type=pool.gpu_type, gpus=gpus, dp=cand.dp, tp=cand.tp, pp=cand.pp, zero=cand.zero,
                micro_batch=cand.micro_batch, grad_accum=cand.grad_accum, bytes_per_gpu=b,
                gpu_memory_bytes=pool.memory_bytes, step_time_s=t)


def plan_order(p: Plan) -> tuple[float, int, str]:
    """The order of :func:`feasible_plans`' answer: fastest first, then fewer GPUs, then type name."""
    return (p.step_time_s, p.gpus, p.gpu_type)


def feasible_plans(
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
    """Feasible plans of the job over ``pools``, best (fastest) first; at most one per (type, GPU count).

    ``trainer_only``: only plans the built-in trainer executes (``combos.runs``: its table of
    parallel forms, 1F1B's grad_accum >= pp, ...), for jobs that run ``frenzyd.trainer``.

    Only ``setup``'s job shape is used (seq_len, dtype, optimizer, recompute,
    effective global batch); its dp/tp/pp/zero/micro_batch are ignored.  A
    ``calibration`` raises each type's runtime overhead where its correction
    applies (for the model's family and ``torch_version``).
    Raises ConfigError for an impossible job shape; returns [] when nothing fits.
    ``frenzyd.marp.plan_cache.cached_feasible_plans`` gives the same answer, reused across calls.
    """
    job = job_shape(setup)
    validate(model, job)
    plans: list[Plan] = []
    memo = Memo()
    for pool in pools:
        limit = pool.count if max_gpus is None else min(pool.count, max_gpus)
        budget = Budget(pool.memory_bytes / (1.0 + headroom))
        extra = overhead_raise(calibration, pool.gpu_type, model, torch_version)
        for gpus in plan_counts(model, job, pool.gpus_per_node or pool.count, 1, limit):
            best = count_plan(model, job, pool, gpus, budget, constants=constants, extra=extra,
                              trainer_only=trainer_only, memo=memo)
            if best is not None:
                plans.append(best)
    plans.sort(key=plan_order)
    return plans


def min_bytes_per_gpu(model: ModelSpec, setup: TrainingSetup, max_gpus: int) -> int:
    """Smallest worst-rank tensor peak over every plan of up to ``max_gpus`` GPUs (no runtime overhead).

    The most sharded plan: ZeRO-3 over the data-parallel GPUs, the largest tp and pp that divide the
    model, micro-batch 1.
    """
    gb = setup.effective_global_batch
    job = replace(setup, micro_batch=1, global_batch=gb, dp=1, tp=1, pp=1, zero=0)
    best: int | None = None
    for gpus in range(1, max_gpus + 1):
        for shape in _shapes(model, gpus, gpus, gb):
            cand = replace(job, dp=shape.dp, tp=shape.tp, pp=shape.pp, zero=3 if shape.dp > 1 else 0)
            peak = predict(model, cand, check=False).peak_bytes
            if best is None or peak < best:
                best = peak
    if best is None:
        raise InfeasibleError(f"no parallel shape of up to {max_gpus} GPUs fits {model.name}'s layout")
    return best


def require_plans(
    model: ModelSpec,
    setup: TrainingSetup,
    pools: Sequence[GpuPool],
    *,
    headroom: float = DEFAULT_HEADROOM,
    max_gpus: int | None = None,
    calibration: Calibration | None = None,
    torch_version: str = CALIBRATED_TORCH,
) -> list[Plan]:
    """Like :func:`feasible_plans`, but raise InfeasibleError (saying what is needed) when none fits."""
    plans = feasible_plans(
        model,
        setup,
        pools,
        headroom=headroom,
        max_gpus=max_gpus,
        calibration=calibration,
        torch_version=torch_version,
    )
    if plans:
        return plans
    if not pools:
        raise InfeasibleError("the pool offers no GPUs: add GPUs (--gpus TYPE:COUNT,...) and try again")
    most = max(p.count for p in pools) if max_gpus is None else min(max_gpus, max(p.count for p in pools))
    need = min_bytes_per_gpu(model, setup, most)
    largest = max(pools, key=lambda p: p.memory_bytes)
    extra = overhead_raise(calibration, largest.gpu_type, model, torch_version)
    need_total = need + overhead_bytes(largest.gpu_type, need, most) + int(extra * need)
    raise InfeasibleError(
        f"{model.name} needs at least {need_total * (1 + headroom) / GIB:.1f} GiB per GPU with the most "
        f"sharded plan over {most} GPUs (tensors {need / GIB:.1f} GiB + runtime overhead, "
        f"{headroom:.0%} headroom); the largest GPU offers {largest.memory_bytes / GIB:.1f} GiB "
        f"({largest.gpu_type}). Add larger or more GPUs, or shorten --seq-len, or use --recompute full"
    )
