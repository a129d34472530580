"""Cluster files, the Alibaba node list, the Philly trace window and the mapping rules."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from frenzyd.errors import ConfigError
from frenzyd.sim.cluster import alibaba_cluster, parse_alibaba_csv, parse_cluster_toml
from frenzyd.sim.mapping import MAPPINGS, map_jobs
from frenzyd.sim.trace import busy_window, parse_philly_csv

DATA = Path(__file__).resolve().parents[2] / "frenzyd" / "sim" / "data"


def test_shipped_lab_pool_parses() -> None:
    c = parse_cluster_toml((DATA / "lab.toml").read_text())
    counts = Counter(g.gpu_type for g in c.gpus)
    assert counts == {"RTX-3090": 4, "RTX-A6000": 4, "A100-40GB": 2, "A100-80GB": 2, "T4": 8}
    assert c.max_per_peer()["RTX-A6000"] == 2


def test_custom_types_and_fix_it_errors() -> None:
    c = parse_cluster_toml(
        '[types.MY-GPU]\nmemory_gib = 12\nspeed = 0.5\n[[nodes]]\nname = "x"\ngpus = { MY-GPU = 3, T4 = 1 }\n'
    )
    assert c.type_spec("MY-GPU").memory_bytes == 12 << 30
    assert len(c.gpus) == 4
    for bad, msg in [
        ("[[nodes]]\nname='x'\ngpus={ WHAT = 1 }\n", "unknown GPU type"),
        ("nodes = 3\n", "needs \\[\\[nodes\\]\\]"),
        ("[[nodes]]\nname='x'\ngpus={ T4 = -1 }\n", "non-negative"),
        ("[[nodes]]\nname='x'\ngpus={ T4 = 1 }\n[[nodes]]\nname='x'\ngpus={ T4 = 1 }\n", "twice"),
        ("this is = = not toml", "not valid TOML"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_cluster_toml(bad)


def test_alibaba_list_maps_types_and_leaves_out_undisclosed() -> None:
    text = (DATA / "alibaba-openb-gpu-nodes.csv").read_text()
    nodes = parse_alibaba_csv(text)
    types = Counter(next(iter(c)) for _, c in nodes)
    assert set(types) == {"T4", "P100", "V100-16GB", "V100-32GB", "A10"}
    assert sum(types.values()) == 1213 - 549 - 39
    a = alibaba_cluster(text, target_gpus=64, seed=1)
    b = alibaba_cluster(text, target_gpus=64, seed=1)
    assert a == b
    assert 56 <= len(a.gpus) <= 64
    mix = Counter(g.gpu_type for g in a.gpus)
    assert mix["T4"] > mix["P100"] > 0  # the real mix: T4 is the largest disclosed type


def test_trace_window_is_seeded_and_busy() -> None:
    jobs = parse_philly_csv((DATA / "philly.csv").read_text())
    assert all(j.duration_s >= 60 for j in jobs)
    w1 = busy_window(jobs, 150, seed=3)
    assert w1 == busy_window(jobs, 150, seed=3)
    assert w1 != busy_window(jobs, 150, seed=4)
    assert len(w1) == 150
    assert w1[0].submit_s == 0.0
    assert max(j.submit_s for j in w1) <= 8 * 3600


@pytest.mark.parametrize("rule", sorted(MAPPINGS))
def test_mapping_rules_are_seeded_and_differ(rule: str) -> None:
    jobs = busy_window(parse_philly_csv((DATA / "philly.csv").read_text()), 200, seed=0)
    a = map_jobs(jobs, rule, 1)
    assert a == map_jobs(jobs, rule, 1)
    assert [j.requested_gpus for j in a] == [j.gpus for j in jobs]
    assert len({j.model for j in a}) >= 2
    other = next(r for r in MAPPINGS if r != rule)
    assert [j.model for j in a] != [j.model for j in map_jobs(jobs, other, 1)]


def test_bad_trace_and_mapping_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="not a Philly trace"):
        parse_philly_csv("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        parse_philly_csv("timestamp,duration,num_gpus,gpu_time\nyesterday,1,1,1\n")
    with pytest.raises(ConfigError, match="unknown mapping"):
        map_jobs([], "nope", 0)
