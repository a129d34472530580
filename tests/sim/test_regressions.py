"""Whole simulations on the shipped data that once broke an invariant (kept as regression tests)."""

from __future__ import annotations

import time
from pathlib import Path

from frenzyd.has.registry import load_policy
from frenzyd.sim.cluster import alibaba_cluster
from frenzyd.sim.jobs import MarpPlanSource, prepare_jobs
from frenzyd.sim.mapping import map_jobs
from frenzyd.sim.simulator import simulate
from frenzyd.sim.trace import busy_window, parse_philly_csv

DATA = Path(__file__).resolve().parents[2] / "frenzyd" / "sim" / "data"


def test_frenzy_never_grows_a_job_it_just_shrank() -> None:
    """Alibaba slice, gputime mapping, seed 0: a shrunk donor was then grown onto GPUs it had given away."""
    cluster = alibaba_cluster((DATA / "alibaba-openb-gpu-nodes.csv").read_text(), target_gpus=64, seed=0)
    window = busy_window(parse_philly_csv((DATA / "philly.csv").read_text()), 160, 0)
    jobs, _ = prepare_jobs(map_jobs(window, "gputime", 0), cluster, MarpPlanSource(), load=1.0)
    result = simulate(load_policy("frenzy"), jobs, cluster, seed=0, clock=time.perf_counter)
    assert {o.state for o in result.outcomes} == {"completed"}
    assert result.summary()["restarts"] > 0  # the scenario does shrink/grow jobs
