"""``plans.plan_counts`` names exactly the GPU counts that have a dp x tp x pp shape: the enumeration
skips the others, so it must never skip one that holds a plan."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.marp.model import load_model
from frenzyd.marp.plans import _shapes, plan_counts
from frenzyd.marp.spec import TrainingSetup

MODELS = [load_model(n) for n in ("gpt2", "tiny-llama", "llama-2-7b", "tiny-qwen2")]


@settings(max_examples=80, deadline=None)
@given(model=st.sampled_from(MODELS), layers=st.one_of(st.none(), st.integers(1, 97)),
       gb=st.integers(1, 300), per_node=st.integers(1, 9), first=st.integers(1, 40), last=st.integers(0, 400))
def test_plan_counts_are_the_counts_with_a_shape(model: object, layers: int | None, gb: int, per_node: int,
                                                 first: int, last: int) -> None:
    m = model if layers is None else replace(model, layers=layers)  # type: ignore[type-var]
    job = TrainingSetup(seq_len=128, micro_batch=1, global_batch=gb)
    want = tuple(n for n in range(first, last + 1) if _shapes(m, n, per_node, gb))  # type: ignore[arg-type]
    assert plan_counts(m, job, per_node, first, last) == want  # type: ignore[arg-type]


def test_a_huge_batch_or_layer_count_is_bounded_by_the_count_asked() -> None:
    m = replace(MODELS[0], layers=2**31)
    job = TrainingSetup(seq_len=128, micro_batch=1, global_batch=2**53)
    got = plan_counts(m, job, 4, 1, 64)
    assert got == tuple(n for n in range(1, 65) if _shapes(m, n, 4, 2**53))
