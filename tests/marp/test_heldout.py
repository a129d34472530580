"""The random held-out grid generator: seeded, inside its documented ranges, with the issue-19 quota."""

from __future__ import annotations

import pytest

from frenzyd.marp.analytic import predict
from frenzyd.marp.heldout import MAX_PARAMS, MAX_PEAK_BYTES, RANGES, TINY_RANGES, draw_grid
from frenzyd.marp.validate import validate


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 12345])
def test_draws_respect_limits_ranges_and_the_quota(seed: int) -> None:
    grid = draw_grid(seed, 40)
    assert len(grid) == 40
    assert len({c.name for c in grid}) == 40
    quota = [c for c in grid if c.quota]
    assert len(quota) >= 10  # >= 25 %
    for c in quota:
        spec = c.spec
        assert spec.family == "llama"
        assert spec.kv_heads < spec.heads
        assert c.setup.dtype == "fp32"
        assert c.setup.seq_len >= 1024
    for c in grid:
        spec, s = c.spec, c.setup
        validate(spec, s)
        assert c.params <= MAX_PARAMS
        assert predict(spec, s, device="cpu").peak_bytes * s.dp <= MAX_PEAK_BYTES
        assert s.tp == s.pp == 1
        assert s.seq_len in RANGES["seq"]
        assert s.micro_batch in RANGES["micro_batch"]
        assert s.dp == 1 or s.dp in RANGES["dp"]
        lo, hi = RANGES["layers"]
        assert lo <= spec.layers <= hi
        lo, hi = RANGES["vocab"]
        assert lo <= spec.vocab <= hi
        assert spec.head_dim in RANGES["head_dim"] + RANGES["gpt2_head_dim"]
        assert not (s.optimizer == "sgd" and s.zero >= 2)  # fused SGD cannot run under FSDP2 (torch 2.13)


def test_same_seed_same_grid_other_seed_other_grid() -> None:
    a, b, c = draw_grid(3, 12), draw_grid(3, 12), draw_grid(4, 12)
    assert a == b
    assert a != c


def test_grid_covers_both_families_dtypes_recompute_and_plans_over_seeds() -> None:
    grid = [c for seed in range(4) for c in draw_grid(seed, 40)]
    assert {c.spec.family for c in grid} == {"gpt2", "llama"}
    assert {c.setup.dtype for c in grid} == {"fp32", "bf16", "bf16-mixed"}
    assert {c.setup.recompute for c in grid} == {"none", "full"}
    assert {c.setup.zero for c in grid if c.setup.dp > 1} == {0, 1, 2, 3}
    assert any(c.spec.tied_embeddings for c in grid if c.spec.family == "llama")
    assert any(c.setup.grad_accum > 1 for c in grid)
    assert any(c.spec.kv_heads < c.spec.heads for c in grid if not c.quota)


def test_tiny_draws_are_tiny() -> None:
    for c in draw_grid(0, 5, tiny=True):
        assert c.params < 2_000_000
        assert c.spec.hidden <= TINY_RANGES["hidden"][1]
    assert sum(c.quota for c in draw_grid(0, 5, tiny=True)) == 2


def test_bad_count_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        draw_grid(0, 0)
