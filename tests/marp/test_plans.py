"""Plan enumeration: every plan fits with headroom, degrees divide, one per (type, count), sorted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import InfeasibleError
from frenzyd.gpu_types import GIB, type_info
from frenzyd.marp.analytic import predict
from frenzyd.marp.model import load_model
from frenzyd.marp.overhead import Correction, overhead_bytes
from frenzyd.marp.plans import DEFAULT_HEADROOM, feasible_plans, min_bytes_per_gpu, require_plans, step_time_s
from frenzyd.marp.spec import GpuPool, TrainingSetup


def pool(name: str, count: int, per_node: int | None = None) -> GpuPool:
    info = type_info(name)
    return GpuPool(name, count, info.memory_bytes, info.speed, per_node)


JOB = TrainingSetup(seq_len=2048, micro_batch=1, dtype="bf16-mixed", global_batch=32, recompute="full")


def test_plans_fit_divide_and_are_sorted() -> None:
    m = load_model("llama-3-8b")
    pools = [pool("A100-80GB", 8, 8), pool("RTX-3090", 16, 4), pool("V100-32GB", 8, 4)]
    plans = feasible_plans(m, JOB, pools)
    assert plans
    seen = set()
    for p in plans:
        assert p.bytes_per_gpu * (1 + DEFAULT_HEADROOM) <= p.gpu_memory_bytes
        assert p.dp * p.tp * p.pp == p.gpus
        assert m.heads % p.tp == 0
        assert m.kv_heads % p.tp == 0
        assert m.layers % p.pp == 0
        assert p.micro_batch * p.dp * p.grad_accum == JOB.effective_global_batch
        per_node = {"A100-80GB": 8, "RTX-3090": 4, "V100-32GB": 4}[p.gpu_type]
        assert p.tp <= per_node
        assert (p.gpu_type, p.gpus) not in seen
        seen.add((p.gpu_type, p.gpus))
        # bytes_per_gpu is the analytic peak of that shape plus the type's runtime overhead
        setup = TrainingSetup(
            seq_len=2048,
            micro_batch=p.micro_batch,
            dtype="bf16-mixed",
            global_batch=32,
            recompute="full",
            dp=p.dp,
            tp=p.tp,
            pp=p.pp,
            zero=p.zero,
        )
        peak = predict(m, setup).peak_bytes
        assert p.bytes_per_gpu == peak + overhead_bytes(p.gpu_type, peak, p.gpus)
    times = [p.step_time_s for p in plans]
    assert times == sorted(times)


def test_headroom_and_max_gpus_restrict() -> None:
    m = load_model("llama-2-7b")
    pools = [pool("A100-40GB", 16, 8)]
    loose = feasible_plans(m, JOB, pools, headroom=0.0)
    tight = feasible_plans(m, JOB, pools, headroom=0.5)
    assert len(tight) <= len(loose)
    assert all(p.bytes_per_gpu * 1.5 <= p.gpu_memory_bytes for p in tight)
    assert all(p.gpus <= 4 for p in feasible_plans(m, JOB, pools, max_gpus=4))


def test_more_gpus_faster_when_compute_bound() -> None:
    m = load_model("gpt2")
    setup = TrainingSetup(seq_len=1024, micro_batch=4, dtype="bf16-mixed", global_batch=64)
    p = pool("H100-80GB", 8, 8)
    one = TrainingSetup(seq_len=1024, micro_batch=4, dtype="bf16-mixed", global_batch=64)
    eight = TrainingSetup(seq_len=1024, micro_batch=4, dtype="bf16-mixed", global_batch=64, dp=8)
    assert step_time_s(m, eight, p) < step_time_s(m, one, p)
    assert feasible_plans(m, setup, [p])[0].gpus > 1


def test_slow_network_penalises_spanning_peers() -> None:
    m = load_model("llama-2-7b")
    inside = pool("RTX-4090", 8, 8)
    spread = pool("RTX-4090", 8, 2)
    s = TrainingSetup(seq_len=2048, micro_batch=1, dtype="bf16-mixed", global_batch=32, dp=8, zero=3)
    assert step_time_s(m, s, spread) > step_time_s(m, s, inside)


def test_infeasible_pool_raises_with_needed_and_offered_memory() -> None:
    m = load_model("llama-2-70b")
    setup = TrainingSetup(seq_len=4096, micro_batch=1, dtype="fp32", global_batch=8)
    with pytest.raises(
        InfeasibleError, match=r"needs at least [\d.]+ GiB per GPU with the most sharded plan"
    ) as e:
        require_plans(m, setup, [pool("RTX-3090", 2), pool("T4", 4)])
    assert "largest GPU offers 24.0 GiB" in str(e.value)
    with pytest.raises(InfeasibleError, match="no GPUs"):
        require_plans(m, setup, [])


def test_min_bytes_per_gpu_is_a_lower_bound_of_every_plan() -> None:
    m = load_model("llama-2-7b")
    lower = min_bytes_per_gpu(m, JOB, 8)
    for p in feasible_plans(m, JOB, [pool("A100-80GB", 8, 8)]):
        assert p.bytes_per_gpu >= lower


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["tiny-llama", "gpt2", "qwen2.5-7b"]),
    gb=st.sampled_from([8, 12, 16, 32]),
    count=st.integers(1, 12),
    gpu=st.sampled_from(["T4", "RTX-3090", "A100-80GB"]),
)
def test_plan_invariants_property(name: str, gb: int, count: int, gpu: str) -> None:
    m = load_model(name)
    setup = TrainingSetup(seq_len=512, micro_batch=1, dtype="bf16-mixed", global_batch=gb)
    plans = feasible_plans(m, setup, [pool(gpu, count)])
    assert plans == feasible_plans(m, setup, [pool(gpu, count)])  # deterministic
    for p in plans:
        assert p.dp * p.tp * p.pp == p.gpus <= count
        assert gb % (p.micro_batch * p.dp) == 0
        assert p.grad_accum == gb // (p.micro_batch * p.dp)
        assert p.bytes_per_gpu * (1 + DEFAULT_HEADROOM) <= p.gpu_memory_bytes


def test_overhead_table_and_correction() -> None:
    single = overhead_bytes("V100-16GB", 10 * GIB, 1)
    multi = overhead_bytes("V100-16GB", 10 * GIB, 4)
    assert multi > single > GIB  # the 1.3 GB V100 context alone
    assert overhead_bytes("made-up-gpu", 0, 1) > 0
    c = Correction()
    assert c.factor("A10") == 1.0
    c2 = c.update("A10", 110, 100).update("A10", 110, 100)
    assert 1.0 < c2.factor("A10") <= 1.1
    assert c2.update("A10", 0, 100) == c2
    assert overhead_bytes("A10", GIB, 1, correction=c2) > overhead_bytes("A10", GIB, 1)
