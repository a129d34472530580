"""``frenzy-client simulate``: the DESIGN.md §6 JSON object, the readable table, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

POLICY_KEYS = {
    "avg_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "makespan_s",
    "utilization",
    "jobs_completed",
    "failed",
    "oom_failures",
    "restarts",
    "solver_timeouts",
    "decision_ms",
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "frenzy_client", "simulate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_json_has_the_documented_keys_for_every_policy() -> None:
    out = _cli("--jobs", "25", "--seed", "2", "--mapping", "gputime", "--load", "2", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # stdout is only the JSON (solver chatter goes to stderr)
    assert set(doc) >= {"run", "limit", "policies"}
    run = doc["run"]
    assert {k: run[k] for k in ("jobs", "seed", "load", "mapping")} == {
        "jobs": run["jobs"],
        "seed": 2,
        "load": 2.0,
        "mapping": "gputime",
    }
    assert run["jobs"] + run["dropped_infeasible"] == 25
    assert run["trace"].endswith("philly.csv")
    assert run["cluster"].endswith("lab.toml")
    assert doc["limit"]["avg_jct_s"] > 0
    assert doc["limit"]["p99_jct_s"] > 0
    assert set(doc["policies"]) == {"frenzy", "sia", "gavel", "fifo", "tiresias", "srtf", "srtf-wide"}
    assert run["split"] == "tune"
    assert "jobs" not in doc
    for name, p in doc["policies"].items():
        assert set(p) == POLICY_KEYS, name
        assert set(p["decision_ms"]) == {"median", "p95", "max"}
        assert 0.0 <= p["utilization"] <= 1.0
        assert p["jobs_completed"] + p["failed"] == run["jobs"]
        if p["jobs_completed"]:
            assert p["avg_jct_s"] >= doc["limit"]["avg_jct_s"] * 0.5  # averages over different job sets
    assert doc["policies"]["sia"]["solver_timeouts"] >= 0


def test_per_job_lists_every_job_of_every_policy() -> None:
    out = _cli("--jobs", "12", "--policy", "frenzy", "--policy", "srtf", "--per-job", "--json",
               "--split", "validation")  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["run"]["split"] == "validation"
    assert set(doc["jobs"]) == {"frenzy", "srtf"}
    for name, rows in doc["jobs"].items():
        assert len(rows) == doc["run"]["jobs"], name
        assert len({r["id"] for r in rows}) == len(rows)
        for r in rows:
            assert set(r) >= {"id", "arrival_s", "start_s", "finish_s", "jct_s", "restarts", "gpu_types"}
            if r["state"] == "completed":
                assert r["jct_s"] == pytest.approx(r["finish_s"] - r["arrival_s"])
                assert r["start_s"] >= r["arrival_s"]
                assert r["gpu_types"]
        done = [r["jct_s"] for r in rows if r["state"] == "completed"]
        assert sum(done) / len(done) == pytest.approx(doc["policies"][name]["avg_jct_s"])
    table = _cli("--jobs", "12", "--policy", "srtf", "--per-job")
    assert table.returncode == 0, table.stderr
    assert "GPU types" in table.stdout


def test_the_test_split_is_not_offered() -> None:
    out = _cli("--split", "test")
    assert out.returncode != 0
    assert "invalid choice" in out.stderr


def test_table_output_and_alibaba_cluster() -> None:
    out = _cli(
        "--jobs", "15", "--cluster", str(ROOT / "frenzyd/sim/data/alibaba-openb-gpu-nodes.csv"),
        "--policy", "frenzy", "--policy", "fifo",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "frenzy" in out.stdout
    assert "fifo" in out.stdout
    assert "limit avg JCT" in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--policy", "nope"), "unknown policy"),
        (("--cluster", "/nonexistent.toml"), "cannot read the cluster file"),
        (("--jobs", "0"), "--jobs must be at least 1"),
    ],
)
def test_bad_input_is_a_clear_error(args: tuple[str, ...], message: str) -> None:
    out = _cli(*args)
    assert out.returncode == 1
    assert message in out.stderr
    assert "Traceback" not in out.stderr
