"""Builds simulated jobs: the one adapter to MARP (feasible plans) plus work, speed and arrival scaling.

Every memory question the simulator and the policies ask goes through
:class:`PlanSource`; the real one, :class:`MarpPlanSource`, calls
``frenzyd.marp.plans.feasible_plans`` (there is no second memory model here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from frenzyd.errors import FrenzyError
from frenzyd.has.interface import Cluster, packed_peers
from frenzyd.has.speed import V100_SUSTAINED_FLOPS, JobSpeed, flops_per_step
from frenzyd.marp.spec import GpuPool, Plan
from frenzyd.sim.mapping import LlmJob
from frenzyd.sim.model import SimJob, percentile

_Shape = tuple[JobSpeed, tuple[Plan, ...]]

BASE_UTILISATION = 0.5
"""At ``load`` 1.0 the window's arrivals are stretched so the offered work is half the cluster's capacity."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the speed model needs of a model preset."""

    params: int
    layers: int
    hidden: int


class PlanSource(Protocol):
    """Where memory answers come from (MARP)."""

    def model_info(self, model: str) -> ModelInfo:
        """Parameter count, layers and hidden size of a model preset."""
        ...

    def plans(
        self,
        model: str,
        seq_len: int,
        global_batch: int,
        pools: Sequence[GpuPool],
        max_gpus: int | None = None,
        *,
        recompute: bool = False,
    ) -> list[Plan]:
        """Every feasible plan on ``pools`` with at most ``max_gpus`` GPUs (MARP's ``feasible_plans``)."""
        ...

    def user_plan_fits(
        self,
        model: str,
        seq_len: int,
        global_batch: int,
        pool: GpuPool,
        gpus: int,
        *,
        recompute: bool = False,
    ) -> bool:
        """Whether a plain ZeRO-3 data-parallel plan on ``gpus`` GPUs, micro-batch 1, fits the GPU's memory.

        Physical memory, no headroom: this is what decides a real out-of-memory error.
        """
        ...


class MarpPlanSource:
    """The real plan source: MARP's analytic predictor, runtime-overhead table and plan enumeration."""

    def __init__(self, headroom: float | None = None) -> None:
        self._headroom = headroom

    def model_info(self, model: str) -> ModelInfo:
        m = _marp()
        spec = m.load_model(model)
        return ModelInfo(m.param_count(spec), spec.layers, spec.hidden)

    def plans(
        self,
        model: str,
        seq_len: int,
        global_batch: int,
        pools: Sequence[GpuPool],
        max_gpus: int | None = None,
        *,
        recompute: bool = False,
    ) -> list[Plan]:
        m = _marp()
        setup = m.TrainingSetup(
            seq_len=seq_len,
            micro_batch=1,
            global_batch=global_batch,
            recompute="full" if recompute else "none",
        )
        kwargs: dict[str, Any] = {"max_gpus": max_gpus}
        if self._headroom is not None:
            kwargs["headroom"] = self._headroom
        return list(m.feasible_plans(m.load_model(model), setup, pools, **kwargs))

    def user_plan_fits(
        self,
        model: str,
        seq_len: int,
        global_batch: int,
        pool: GpuPool,
        gpus: int,
        *,
        recompute: bool = False,
    ) -> bool:
        m = _marp()
        accum = max(1, global_batch // gpus)
        setup = m.TrainingSetup(
            seq_len=seq_len,
            micro_batch=1,
            global_batch=accum * gpus,
            zero=3 if gpus > 1 else 0,
            dp=gpus,
            recompute="full" if recompute else "none",
        )
        peak = int(m.predict(m.load_model(model), setup, check=False).peak_bytes)
        return peak + int(m.overhead_bytes(pool.gpu_type, peak, gpus)) <= pool.memory_bytes


def _marp() -> Any:
    """MARP's modules, imported on first use (a clear error instead of a traceback if absent)."""
    try:
        import types

        from frenzyd.marp.analytic import predict
        from frenzyd.marp.model import load_model, param_count
        from frenzyd.marp.overhead import overhead_bytes
        from frenzyd.marp.plans import feasible_plans
        from frenzyd.marp.spec import TrainingSetup
    except ImportError as exc:
        raise FrenzyError(f"MARP is not available ({exc}); the simulator needs frenzyd.marp") from exc
    return types.SimpleNamespace(
        predict=predict,
        load_model=load_model,
        param_count=param_count,
        overhead_bytes=overhead_bytes,
        feasible_plans=feasible_plans,
        TrainingSetup=TrainingSetup,
    )


def pools_of(cluster: Cluster) -> list[GpuPool]:
    """One GpuPool per GPU type of ``cluster`` (count, memory, speed, largest per peer)."""
    per_peer = cluster.max_per_peer()
    counts: dict[str, int] = {}
    for g in cluster.gpus:
        counts[g.gpu_type] = counts.get(g.gpu_type, 0) + 1
    return [
        GpuPool(t.name, counts[t.name], t.memory_bytes, t.speed, per_peer[t.name])
        for t in cluster.types
        if t.name in counts
    ]


def reduce_plans(plans: Sequence[Plan], speed: JobSpeed, cluster: Cluster) -> tuple[Plan, ...]:
    """The fastest plan per (type, GPU count), ``step_time_s`` set by the speed model when packed.

    Plans whose tensor-parallel groups cannot be laid inside peers even on the
    empty cluster are left out (they could never be placed).

    Sorted fastest first (ties by type and count) so every policy sees the same order.
    """
    speeds = {t.name: t.speed for t in cluster.types}
    per_peer = cluster.max_per_peer()
    sizes = cluster.per_peer()
    best: dict[tuple[str, int], Plan] = {}
    for p in plans:
        if p.gpu_type not in speeds:
            continue
        # tensor-parallel groups stay inside a peer: the empty cluster must hold dp·pp of them
        groups = sum(n // p.tp for (_, t), n in sizes.items() if t == p.gpu_type)
        if groups < p.dp * p.pp:
            continue
        step = speed.step_time_s(p, speeds[p.gpu_type], packed_peers(p, per_peer[p.gpu_type]))
        q = replace(p, step_time_s=step)
        key = (p.gpu_type, p.gpus)
        old = best.get(key)
        if old is None or (q.step_time_s, q.tp, q.pp, q.zero, -q.micro_batch) < (
            old.step_time_s,
            old.tp,
            old.pp,
            old.zero,
            -old.micro_batch,
        ):
            best[key] = q
    return tuple(sorted(best.values(), key=lambda p: (p.step_time_s, p.gpu_type, p.gpus)))


def prepare_jobs(
    llm_jobs: Sequence[LlmJob],
    cluster: Cluster,
    source: PlanSource,
    *,
    load: float = 1.0,
    max_gpus: int | None = None,
) -> tuple[list[SimJob], int]:
    """SimJobs for ``llm_jobs`` on ``cluster`` and the number dropped because no plan fits anywhere.

    Work: the trace job's duration on its trace GPU count of V100s at perfect
    scaling.  Arrivals: stretched so the offered work (V100-seconds) is
    :data:`BASE_UTILISATION` of the cluster's capacity (sum of GPU speeds)
    over the window, then divided by ``load`` (``--load`` multiplies the rate).
    ``max_gpus`` caps the plans' GPU count (None: the whole cluster).
    """
    if load <= 0:
        raise FrenzyError("--load must be positive")
    pools = pools_of(cluster)
    info_cache: dict[str, ModelInfo] = {}
    shape_cache: dict[tuple[str, int, int, bool], _Shape] = {}
    fit_cache: dict[tuple[str, int, int, bool, str, int], bool] = {}
    drafts: list[SimJob] = []
    dropped = 0
    for j in llm_jobs:
        key = (j.model, j.seq_len, j.global_batch, j.recompute)
        if key not in shape_cache:
            info = info_cache.get(j.model)
            if info is None:
                info = info_cache[j.model] = source.model_info(j.model)
            flops = flops_per_step(
                info.params, info.layers, info.hidden, j.seq_len, j.global_batch, recompute=j.recompute
            )
            speed = JobSpeed(info.params, flops)
            raw = source.plans(j.model, j.seq_len, j.global_batch, pools, max_gpus, recompute=j.recompute)
            shape_cache[key] = (speed, reduce_plans(raw, speed, cluster))
        speed, plans = shape_cache[key]
        if not plans:
            dropped += 1
            continue
        user = _user_fits(source, j, pools, fit_cache)
        steps = max(1.0, j.trace_duration_s * j.requested_gpus * V100_SUSTAINED_FLOPS / speed.flops_per_step)
        drafts.append(
            SimJob(
                job_id=j.job_id,
                arrival_s=j.arrival_s,
                requested_gpus=j.requested_gpus,
                model=j.model,
                seq_len=j.seq_len,
                global_batch=j.global_batch,
                total_steps=steps,
                speed=speed,
                plans=plans,
                user_fits=user,
                trace_duration_s=j.trace_duration_s,
            )
        )
    if not drafts:
        return [], dropped
    work = sum(d.total_steps * d.speed.flops_per_step / V100_SUSTAINED_FLOPS for d in drafts)
    capacity = sum(t.speed for g in cluster.gpus for t in cluster.types if t.name == g.gpu_type)
    t0 = min(d.arrival_s for d in drafts)
    span = max(d.arrival_s for d in drafts) - t0
    scale = (work / (capacity * BASE_UTILISATION) / span if span > 0 else 1.0) / load
    return [replace(d, arrival_s=(d.arrival_s - t0) * scale) for d in drafts], dropped


def _user_fits(
    source: PlanSource,
    j: LlmJob,
    pools: Sequence[GpuPool],
    cache: dict[tuple[str, int, int, bool, str, int], bool],
) -> frozenset[tuple[str, int]]:
    """(type, count) pairs where FIFO's user plan fits: its ask and each doubling (capped)."""
    largest = max((p.count for p in pools), default=0)
    counts: list[int] = []
    n = min(j.requested_gpus, largest)
    for _ in range(5):  # the ask and up to three resubmissions (plus one spare) with twice the GPUs
        counts.append(min(n, largest))
        n *= 2
    out = set()
    for pool in pools:
        for n in sorted(set(counts)):
            if n > pool.count:
                continue
            key = (j.model, j.seq_len, j.global_batch, j.recompute, pool.gpu_type, n)
            if key not in cache:
                cache[key] = source.user_plan_fits(
                    j.model, j.seq_len, j.global_batch, pool, n, recompute=j.recompute
                )
            if cache[key]:
                out.add((pool.gpu_type, n))
    return frozenset(out)


def alone_jct_s(job: SimJob) -> float:
    """The job's JCT alone on its fastest feasible plan, one start-up cost included: no policy does better."""
    return job.speed.restart_cost_s + job.total_steps * min(p.step_time_s for p in job.plans)


def limit_jct_s(jobs: Sequence[SimJob]) -> float:
    """Average JCT with every job alone on its fastest feasible plan (one start-up cost included)."""
    if not jobs:
        return 0.0
    return sum(alone_jct_s(j) for j in jobs) / len(jobs)


def limit_p99_jct_s(jobs: Sequence[SimJob]) -> float:
    """p99 of the jobs' :func:`alone_jct_s`: no policy that completes every job has a lower p99 JCT.

    (Each job's JCT is at least its time alone, and the percentile of a list
    that is larger element by element is no smaller.)
    """
    return percentile(sorted(alone_jct_s(j) for j in jobs), 99)
