"""bench_marp's trainer table (scripts/_marp_trainer.py): its fixed rows and its scoring (no processes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import _marp_trainer as mt  # noqa: E402

from frenzyd.marp.combos import COMBOS, combo_of  # noqa: E402
from frenzyd.marp.model import load_model, param_count  # noqa: E402
from frenzyd.trainer.plan import resolve  # noqa: E402


def test_full_rows_cover_every_parallel_form_at_world_sizes_2_to_4() -> None:
    """... and the 3-D meshes (dp x tp x pp) at 8, the least they take, the tiny model only."""
    seen = set()
    for row in mt.FULL_ROWS:
        plan = resolve(row.plan(data="unused"))  # a plan the trainer runs, as given
        shape = (plan.micro_batch, plan.grad_accum, plan.world_size)
        assert shape == (row.micro_batch, row.grad_accum, row.world)
        three_d = min(row.dp, row.tp, row.pp) > 1
        assert (row.world, row.model) == (8, mt.TINY_MODEL) if three_d else 2 <= row.world <= 4
        combo = combo_of(plan.setup())
        assert combo is not None
        seen.add(combo.name)
    assert seen == {c.name for c in COMBOS} - {"single"}
    assert {r.dtype for r in mt.FULL_ROWS} >= {"fp32", "bf16-mixed"}
    assert len({r.name for r in mt.FULL_ROWS}) == len(mt.FULL_ROWS)
    assert param_count(load_model(mt.BIG_MODEL)) >= 100_000_000
    assert {r.model for r in mt.FULL_ROWS} == {mt.TINY_MODEL, mt.BIG_MODEL}


def test_3d_rows_are_every_zero_stage_and_a_world_without_rows_is_refused(tmp_path: Path) -> None:
    rows = [r for r in mt.FULL_ROWS if r.world == 8]
    assert {r.zero for r in rows} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match=r"no row has a world size in \[5\]"):  # before any process starts
        mt.TrainerTable(tiny=False, worlds=frozenset({5}), workdir=tmp_path)


def test_tiny_rows_are_one_group_of_the_tiny_model() -> None:
    assert {r.world for r in mt.TINY_ROWS} == {2}
    assert {r.model for r in mt.TINY_ROWS} == {mt.TINY_MODEL}
    assert set(mt.TINY_ROWS) <= set(mt.FULL_ROWS)


def test_prediction_is_per_rank_on_the_cpu() -> None:
    row = mt.Row(mt.TINY_MODEL, "bf16-mixed", pp=2, grad_accum=2)
    pred = mt.predict(row)
    assert len(pred.rank_peaks) == 2
    assert pred.rank_peaks[0] != pred.rank_peaks[1]  # two different stages


def test_score_takes_the_worst_rank_and_flags_under_prediction() -> None:
    s = mt.score([100, 96, 104], [100, 100, 100])
    assert s["accuracy"] == pytest.approx(0.96)
    assert s["worst_under"] == pytest.approx(-0.04)
    assert s["under_gt_3pct"] is True
    assert s["meets_target"] is False
    ok = mt.score([99, 102], [100, 100])
    assert ok["meets_target"] is True
    assert ok["under_gt_3pct"] is False
    over = mt.score([110], [100])
    assert (over["worst_under"], over["under_gt_3pct"], over["meets_target"]) == (0.0, False, False)
    with pytest.raises(ValueError, match="ranks"):
        mt.score([1, 2], [1])
