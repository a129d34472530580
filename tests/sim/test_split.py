"""The trace split by time: tuning, validation and test windows never share a job, and there are many."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzyd.errors import ConfigError
from frenzyd.sim.trace import SPLITS, parse_philly_csv, split_window, split_windows

DATA = Path(__file__).resolve().parents[2] / "frenzyd" / "sim" / "data"


@pytest.fixture(scope="module")
def trace() -> list:  # type: ignore[type-arg]
    return parse_philly_csv((DATA / "philly.csv").read_text())


def test_splits_cover_disjoint_time_ranges_with_more_than_eleven_windows_in_all(trace: list) -> None:  # type: ignore[type-arg]
    t_first, t_last = trace[0].submit_s, trace[-1].submit_s
    ranges = {}
    total = 0
    for name, (a, b) in SPLITS.items():
        starts = split_windows(trace, name, 160)
        assert len(starts) == len(set(starts))
        total += len(starts)
        lo, hi = t_first + a * (t_last - t_first), t_first + b * (t_last - t_first)
        for i in starts:
            assert lo <= trace[i].submit_s < hi + 1.0
        ranges[name] = (lo, hi)
    assert total > 11
    assert (
        len(split_windows(trace, "test", 160)) >= 3
    )  # the final benchmark's three seeds draw distinct windows
    assert ranges["tune"][1] <= ranges["validation"][0] <= ranges["validation"][1] <= ranges["test"][0]


def test_seeds_draw_distinct_windows_and_the_same_seed_the_same_jobs(trace: list) -> None:  # type: ignore[type-arg]
    a = split_window(trace, 100, 0, "validation")
    assert a == split_window(trace, 100, 0, "validation")
    assert len(a) == 100
    starts = split_windows(trace, "validation", 100)
    assert starts[0] != starts[1]


def test_unknown_split_and_too_many_jobs_are_clear_errors(trace: list) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match="unknown trace split"):
        split_window(trace, 10, 0, "train")
    with pytest.raises(ConfigError, match="ask for fewer"):
        split_window(trace, 100_000, 0, "test")
