"""bench_scale's pass part computes plans at admission as the coordinator does, times them apart from
the pass, and hides no planning in a pass nor leaves it out of the report."""

from __future__ import annotations

import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_scale as bs  # noqa: E402


def test_admission_is_timed_apart_and_every_pass_finds_its_plans() -> None:
    cell = bs.run_cell(6, 10, gpus=2, passes=3, churn=0.3, busy=0.5, shapes=4, novel=0.5, seed=2,
                       cache=True, profile=False)
    assert cell["plans"] == "admission"
    cold, adm = cell["cold_admission"], cell["admission"]
    assert cold["new_shapes"] > 0  # the first queue's shapes, planned before the first pass
    assert cell["cold_admission_s"] > 0
    assert adm["new_shapes"] > 0  # novel 0.5: later arrivals bring new shapes, each timed
    assert 0 < adm["new_shape_median_s"] <= adm["new_shape_p95_s"] <= adm["new_shape_max_s"]
    # Every job was admitted before the pass that saw it: no pass after the first left one out.
    assert cell["left_out_for_plans"][1:] == [0] * 2
    assert cell["started"] > 0


def test_inline_plans_is_the_pass_that_plans_itself() -> None:
    cell = bs.run_cell(4, 4, gpus=2, passes=2, churn=0.2, busy=0.5, shapes=2, novel=0.0, seed=1, cache=True,
                       profile=False, inline=True)
    assert cell["plans"] == "inline"
    assert cell["admission"] is None
    assert cell["cold_admission_s"] is None
    assert cell["left_out_for_plans"] == [0, 0]
