"""The plan cache answers what feasible_plans answers, and recomputes whenever an input the plans
depend on changes (and only the GPU counts or types it must)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzyd.errors import ConfigError
from frenzyd.gpu_types import GPU_TYPES, type_info
from frenzyd.marp.calibration import Calibration, CalibrationKey, RunSample
from frenzyd.marp.model import load_model
from frenzyd.marp.plan_cache import (
    PlanCache,
    cached_feasible_plans,
    cached_plans,
    default_cache,
    set_default_cache,
)
from frenzyd.marp.plans import feasible_plans
from frenzyd.marp.spec import GpuPool, ModelSpec, TrainingSetup

GIB = 1 << 30
MODEL = load_model("gpt2")
JOB = TrainingSetup(seq_len=512, micro_batch=1, global_batch=32, dtype="bf16-mixed")
TYPES = ("RTX-3090", "A100-80GB", "T4", "RTX-A6000", "V100-32GB")


def pool(name: str, count: int, per_node: int | None = 4, memory: int | None = None) -> GpuPool:
    info = type_info(name)
    return GpuPool(name, count, info.memory_bytes if memory is None else memory, info.speed, per_node)


POOLS = [pool("RTX-3090", 12), pool("T4", 8)]


def computed(cache: PlanCache) -> int:
    return cache.stats().counts_computed


def ask(cache: PlanCache, model: ModelSpec, setup: TrainingSetup, pools: list[GpuPool], **kw: object) -> int:
    """Ask ``cache``; check the answer against a fresh enumeration; return the GPU counts it computed."""
    before = computed(cache)
    got = cache.feasible_plans(model, setup, pools, **kw)  # type: ignore[arg-type]
    assert got == feasible_plans(model, setup, pools, **kw)  # type: ignore[arg-type]
    return computed(cache) - before


SHARED = PlanCache()
"""Shared by the property's examples, so later examples meet entries earlier ones left."""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["tiny-llama", "tiny-gpt2", "tiny-qwen2", "gpt2"]),
    seq=st.sampled_from([64, 128, 512]),
    gb=st.sampled_from([1, 4, 6, 16, 24]),
    dtype=st.sampled_from(["fp32", "bf16", "bf16-mixed"]),
    recompute=st.sampled_from(["none", "full"]),
    optimizer=st.sampled_from(["adamw", "sgd"]),
    trainer_only=st.booleans(),
    headroom=st.sampled_from([0.0, 0.1, 0.25]),
    max_gpus=st.one_of(st.none(), st.integers(1, 12)),
    pools=st.lists(
        st.tuples(st.sampled_from(TYPES), st.integers(0, 16), st.one_of(st.none(), st.integers(1, 8)),
                  st.floats(0.02, 1.0)),
        min_size=0, max_size=3,
    ),
)
def test_cached_answer_equals_a_fresh_one(
    name: str, seq: int, gb: int, dtype: str, recompute: str, optimizer: str, trainer_only: bool,
    headroom: float, max_gpus: int | None, pools: list[tuple[str, int, int | None, float]],
) -> None:
    model = load_model(name)
    setup = TrainingSetup(seq_len=seq, micro_batch=1, global_batch=gb, dtype=dtype,  # type: ignore[arg-type]
                          recompute=recompute, optimizer=optimizer)  # type: ignore[arg-type]
    gpools = [pool(t, n, per, int(frac * GPU_TYPES[t].memory_bytes)) for t, n, per, frac in pools]
    kw = {"headroom": headroom, "max_gpus": max_gpus, "trainer_only": trainer_only}
    ask(SHARED, model, setup, gpools, **kw)
    assert ask(SHARED, model, setup, gpools, **kw) == 0  # the same question again: nothing computed
    # The pool as the next tick sees it: a GPU more or fewer, a few MiB more or less free.
    moved = [replace(p, count=max(0, p.count + d), memory_bytes=p.memory_bytes + m)
             for p, d, m in zip(gpools, (1, -1, 2), (5 << 20, -(3 << 20), 0), strict=False)]
    ask(SHARED, model, setup, moved, **kw)
    # Fewer GPUs free on one peer (the per-peer bound falls), and much less memory free.
    squeezed = [replace(p, gpus_per_node=max(1, (p.gpus_per_node or 2) - 1), memory_bytes=p.memory_bytes // 2)
                for p in gpools]
    ask(SHARED, model, setup, squeezed, **kw)


@pytest.mark.parametrize(
    ("what", "model", "setup", "pools", "kw"),
    [
        ("model config", replace(MODEL, layers=6), JOB, POOLS, {}),
        ("seq_len", MODEL, replace(JOB, seq_len=1024), POOLS, {}),
        ("global batch", MODEL, replace(JOB, global_batch=48), POOLS, {}),
        ("dtype", MODEL, replace(JOB, dtype="fp32"), POOLS, {}),
        ("recompute", MODEL, replace(JOB, recompute="full"), POOLS, {}),
        ("optimizer", MODEL, replace(JOB, optimizer="sgd"), POOLS, {}),
        ("trainer_only", MODEL, JOB, POOLS, {"trainer_only": True}),
        ("GPU type", MODEL, JOB, [pool("RTX-4090", 12), pool("T4", 8)], {}),
        ("speed", MODEL, JOB, [replace(POOLS[0], speed=2.0), POOLS[1]], {}),
        ("GPUs per node", MODEL, JOB, [pool("RTX-3090", 12, per_node=2), POOLS[1]], {}),
        ("memory", MODEL, JOB, [pool("RTX-3090", 12, memory=3 * GIB), POOLS[1]], {}),
        ("headroom", MODEL, JOB, POOLS, {"headroom": 2.0}),
        ("count bound", MODEL, JOB, [pool("RTX-3090", 20), POOLS[1]], {}),
        ("calibration", MODEL, JOB, POOLS, {"calibration": Calibration(((
            CalibrationKey("RTX-3090", "gpt2", "2.13"), (RunSample("cuda", 0.5, 1),) * 3),))}),
    ],
)
def test_a_change_to_an_input_the_plans_depend_on_is_a_miss(
    what: str, model: ModelSpec, setup: TrainingSetup, pools: list[GpuPool], kw: dict[str, object]
) -> None:
    cache = PlanCache()
    assert ask(cache, MODEL, JOB, POOLS) > 0
    assert ask(cache, MODEL, JOB, POOLS) == 0
    assert ask(cache, model, setup, pools, **kw) > 0, what


@pytest.mark.parametrize(
    ("what", "model", "setup", "pools"),
    [
        ("model name", replace(MODEL, name="my-run"), JOB, POOLS),
        ("micro-batch and plan of the setup", MODEL, replace(JOB, micro_batch=4, dp=2, zero=3), POOLS),
        ("peers holding the GPUs", MODEL, JOB, list(reversed(POOLS))),
        ("fewer GPUs", MODEL, JOB, [pool("RTX-3090", 5), pool("T4", 1)]),
        ("a few MiB less free", MODEL, JOB, [pool("RTX-3090", 12, memory=(24 << 30) - (7 << 20)), POOLS[1]]),
    ],
)
def test_what_the_plans_do_not_depend_on_is_a_hit(
    what: str, model: ModelSpec, setup: TrainingSetup, pools: list[GpuPool]
) -> None:
    cache = PlanCache()
    ask(cache, MODEL, JOB, POOLS)
    assert ask(cache, model, setup, pools) == 0, what


def test_a_larger_count_bound_computes_only_the_new_counts() -> None:
    cache = PlanCache()
    assert ask(cache, MODEL, JOB, [pool("RTX-3090", 10)]) == 10
    assert ask(cache, MODEL, JOB, [pool("RTX-3090", 16)]) == 6
    assert ask(cache, MODEL, JOB, [pool("RTX-3090", 3)]) == 0
    assert ask(cache, MODEL, JOB, [pool("RTX-3090", 16)], max_gpus=4) == 0


def test_without_gpus_per_node_the_count_is_part_of_the_key() -> None:
    cache = PlanCache()
    assert ask(cache, MODEL, JOB, [pool("RTX-3090", 8, per_node=None)]) == 8
    assert ask(cache, MODEL, JOB, [pool("RTX-3090", 4, per_node=None)]) == 4  # tp may not span 8 now


def test_the_memory_figure_is_the_callers_even_on_a_hit() -> None:
    cache = PlanCache()
    ask(cache, MODEL, JOB, POOLS)
    less = (24 << 30) - (5 << 20)
    got = cache.feasible_plans(MODEL, JOB, [pool("RTX-3090", 12, memory=less), POOLS[1]])
    assert {p.gpu_memory_bytes for p in got if p.gpu_type == "RTX-3090"} == {less}


def test_bounded_least_recently_used_first() -> None:
    cache = PlanCache(maxsize=2)
    a, b, c = (replace(JOB, seq_len=s) for s in (128, 256, 512))
    ask(cache, MODEL, a, POOLS)
    ask(cache, MODEL, b, POOLS)
    ask(cache, MODEL, a, POOLS)  # a is now the most recently used
    ask(cache, MODEL, c, POOLS)  # evicts b
    assert cache.stats().job_shapes == 2
    assert ask(cache, MODEL, a, POOLS) == 0
    assert ask(cache, MODEL, b, POOLS) > 0


def test_maxsize_zero_is_no_cache_and_negative_is_refused() -> None:
    off = PlanCache(0)
    assert ask(off, MODEL, JOB, POOLS) == 0  # nothing counted: it is feasible_plans itself
    assert off.stats().job_shapes == 0
    with pytest.raises(ValueError, match="maxsize"):
        PlanCache(-1)


def test_an_impossible_job_raises_as_feasible_plans_does() -> None:
    cache = PlanCache()
    ask(cache, MODEL, JOB, POOLS)
    bad = replace(JOB, seq_len=MODEL.max_positions + 1)
    with pytest.raises(ConfigError) as fresh:
        feasible_plans(MODEL, bad, POOLS)
    with pytest.raises(ConfigError) as cached:
        cache.feasible_plans(MODEL, bad, POOLS)
    assert str(cached.value) == str(fresh.value)


def test_the_default_cache_is_swappable() -> None:
    mine = PlanCache()
    old = set_default_cache(mine)
    try:
        assert default_cache() is mine
        assert cached_feasible_plans(MODEL, JOB, POOLS) == feasible_plans(MODEL, JOB, POOLS)
        assert mine.stats().misses > 0
    finally:
        set_default_cache(old)


def test_the_same_question_gets_the_same_answer_object() -> None:
    cache = PlanCache()
    first = cache.plans(MODEL, JOB, POOLS)
    assert cache.plans(MODEL, replace(JOB, micro_batch=2), list(POOLS)) is first  # equal inputs
    assert list(first) == feasible_plans(MODEL, JOB, POOLS)
    other = cache.plans(MODEL, JOB, [pool("RTX-3090", 11), POOLS[1]])
    assert other is not first
    assert list(other) == feasible_plans(MODEL, JOB, [pool("RTX-3090", 11), POOLS[1]])
    mine = cache.feasible_plans(MODEL, JOB, POOLS)
    mine.clear()  # a list answer is the caller's own
    assert cache.feasible_plans(MODEL, JOB, POOLS) == list(first)
    old = set_default_cache(cache)
    try:
        assert cached_plans(MODEL, JOB, POOLS) is first
    finally:
        set_default_cache(old)
