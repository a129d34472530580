"""scripts/compare_tiny.py's comparison (no benchmark runs) and scripts/benchmeta.py's writer."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import benchmeta  # noqa: E402
import compare_tiny as ct  # noqa: E402


def sched_doc() -> dict[str, Any]:
    return {
        "argv": ["python", "scripts/bench_sched.py", "--tiny"],
        "git_commit": "abc",
        "machine": {"cpus": 2},
        "started": "2026-01-01T00:00:00Z",
        "config": {"tiny": True, "sia_time_limit_s": 2.0, "loads": [1.0]},
        "jct_cells": [
            {
                "wall_s": 1.5,
                "limit": {"avg_jct_s": 394.9},
                "policies": {
                    "sia": {
                        "avg_jct_s": 749.8,
                        "solver_timeouts": 0,
                        "decision_ms": {"median": 4.0, "p95": 13.0, "max": 456.0},
                    }
                },
            }
        ],
        "overhead": [{"gpus": 16, "policies": {"sia": {"median_ms": 17.0, "placements": 10}}}],
        "overhead_growth": {"sia": {"gpus_exponent": -0.1}},
        "wall_s": 8.0,
    }


def test_leaves_paths_and_empty_containers() -> None:
    got = ct.leaves({"a": [1, {"b": None}], "c": {}, "d": []})
    assert got == {("a", 0): 1, ("a", 1, "b"): None, ("c",): {}, ("d",): []}
    assert ct.fmt_path(("a", 1, "b")) == "a[1].b"
    assert ct.fmt_path(()) == "(document)"


def test_same_is_type_strict_and_nan_equal() -> None:
    assert ct.same(1.5, 1.5)
    assert not ct.same(1, 1.0)
    assert not ct.same(True, 1)
    assert ct.same(math.nan, math.nan)
    assert not ct.same(None, 0)


def test_provenance_and_timings_left_out_results_compared() -> None:
    before = sched_doc()
    after = copy.deepcopy(before)
    # New-style provenance instead of the old one: not compared.
    for k in ("argv", "started"):
        del after[k]
    after.update(command=["py"], time="2026-02-02T00:00:00Z", git_commit="def-dirty", machine={"cpus": 16})
    # Timings move: ratios, no difference.
    after["wall_s"] = 10.0
    after["jct_cells"][0]["wall_s"] = 1.5 * 1.1
    after["jct_cells"][0]["policies"]["sia"]["decision_ms"] = {"median": 4.4, "p95": 13.0, "max": 900.0}
    after["overhead"][0]["policies"]["sia"]["median_ms"] = 17.0
    after["overhead_growth"]["sia"]["gpus_exponent"] = 0.3  # derived from timings: ignored
    c = ct.compare("bench_sched", before, after)
    assert c.identical, c.differences
    # config.{tiny,sia_time_limit_s,loads[0]}, limit.avg_jct_s, sia.avg_jct_s, solver_timeouts, gpus,
    # placements
    assert c.compared == 8
    # wall_s twice, decision_ms.{median,p95,max}, median_ms
    assert c.timing_leaves == 6
    assert c.ratios[("wall_s",)] == pytest.approx(1.25)
    assert c.ratios[("jct_cells", 0, "policies", "sia", "decision_ms", "max")] == pytest.approx(900 / 456)
    s = c.ratio_summary()
    assert s["n"] == 6
    assert s["median"] == pytest.approx(1.1)
    assert s["outside_20pct"] == 2


def test_simulated_seconds_and_configured_durations_are_results() -> None:
    before = sched_doc()
    after = copy.deepcopy(before)
    after["jct_cells"][0]["policies"]["sia"]["avg_jct_s"] = 749.8000001
    after["config"]["sia_time_limit_s"] = 3.0
    c = ct.compare("bench_sched", before, after)
    assert not c.identical
    assert [ct.fmt_path(p) for p, _, _ in c.differences] == [
        "config.sia_time_limit_s",
        "jct_cells[0].policies.sia.avg_jct_s",
    ]

    pool = {"config": {"heartbeat_s": 0.5}, "results": {"failover": {"failover_s": 2.5, "heartbeat_s": 0.5}}}
    pool_after = copy.deepcopy(pool)
    pool_after["results"]["failover"].update(failover_s=9.0, heartbeat_s=1.0)
    c = ct.compare("bench_pool", pool, pool_after)
    assert [ct.fmt_path(p) for p, _, _ in c.differences] == ["results.failover.heartbeat_s"]
    assert c.ratios == {("results", "failover", "failover_s"): pytest.approx(3.6)}


def test_byte_counts_are_results_and_structure_changes_differ() -> None:
    before = {"rows": [{"measured": 100, "real": {"wall_s": 1.0, "peak_bytes": 100}}], "wall_s": 3.0}
    after = copy.deepcopy(before)
    after["rows"][0]["real"]["peak_bytes"] = 101
    after["rows"][0]["extra"] = 1
    del after["wall_s"]  # a timing gone is a change of shape
    c = ct.compare("bench_marp", before, after)
    got = {ct.fmt_path(p): (b, a) for p, b, a in c.differences}
    assert got == {"rows[0].real.peak_bytes": (100, 101), "rows[0].extra": (None, 1), "wall_s": (3.0, None)}


def test_unlisted_benchmark_compares_every_leaf() -> None:
    c = ct.compare("bench_new", {"x_ms": 1.0, "git_commit": "a"}, {"x_ms": 2.0, "git_commit": "b"})
    assert c.compared == 1
    assert not c.identical


def test_capped_solves_are_counted() -> None:
    before = sched_doc()
    after = copy.deepcopy(before)
    after["jct_cells"][0]["policies"]["sia"]["solver_timeouts"] = 2
    c = ct.compare("bench_sched", before, after)
    assert c.capped_solves == 2


def test_every_listed_timing_benchmark_exists() -> None:
    assert set(ct.TIMINGS) | set(ct.TIMING_DERIVED) | set(ct.EXTRA_ARGS) <= set(ct.benchmarks(ct.ROOT))


def test_table_and_json_report() -> None:
    ok = ct.compare("bench_peers", {"sizes": {"n": 1}, "p50_ms": 1.0}, {"sizes": {"n": 1}, "p50_ms": 1.1})
    bad = ct.compare("bench_pool", {"errors": 0}, {"errors": 1})
    text = ct.table([ok, bad, ct.Comparison("bench_sched", error="run failed: exit status 1")])
    lines = text.splitlines()
    assert "| bench_peers | yes " in lines[2]
    assert "1.10" in lines[2]
    assert "NO (1 differ)" in lines[3]
    assert "ERROR" in lines[4]
    doc = bad.to_json(show=5)
    assert doc["differences"] == [{"path": "errors", "before": 0, "after": 1}]
    json.dumps(doc)


def test_compare_dirs_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = tmp_path / "b", tmp_path / "a"
    before.mkdir()
    after.mkdir()
    doc = sched_doc()
    (before / "bench_sched.json").write_text(json.dumps(doc))
    (after / "bench_sched.json").write_text(json.dumps(doc))
    dirs = ["--before-dir", str(before), "--after-dir", str(after)]
    assert ct.main([*dirs, "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["benchmarks"][0]["identical"] is True
    doc["jct_cells"][0]["policies"]["sia"]["avg_jct_s"] += 1
    (after / "bench_sched.json").write_text(json.dumps(doc))
    assert ct.main(dirs) == 1
    assert "jct_cells[0].policies.sia.avg_jct_s: 749.8 -> 750.8" in capsys.readouterr().out
    (after / "bench_sched.json").unlink()
    (after / "bench_peers.json").write_text("{}")
    assert ct.main(dirs) == 2


def test_write_results(tmp_path: Path) -> None:
    prov = benchmeta.provenance()
    assert list(prov) == list(benchmeta.PROVENANCE_KEYS)
    assert prov["command"][0] == sys.executable
    assert prov["time"].endswith("Z")
    assert {"platform", "python", "processor", "cpus"} <= set(prov["machine"])
    out = tmp_path / "deep" / "r.json"
    benchmeta.write_results(out, {"results": {"x": 1}}, prov)
    text = out.read_text()
    assert text.endswith("}\n")
    assert text.startswith('{\n  "command": [')
    assert list(json.loads(text)) == [*benchmeta.PROVENANCE_KEYS, "results"]
    with pytest.raises(ValueError, match="provenance"):
        benchmeta.write_results(out, {"git_commit": "x"}, prov)


def test_git_commit(tmp_path: Path) -> None:
    assert benchmeta.git_commit(tmp_path) == "unknown"
    sha = benchmeta.git_commit()
    assert sha == "unknown" or len(sha.removesuffix("-dirty")) == 40
