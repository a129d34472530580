"""scripts/bench_chaos.py's ledger analysis and schedule (pure functions; no pool is started)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_chaos as bc  # noqa: E402


def line(
    job: str, attempt: int, rank: int, step: int, t: float, host: str = "n0", **extra: Any
) -> dict[str, Any]:
    return {"job": job, "attempt": attempt, "rank": rank, "host": host, "pid": 100 * attempt + rank,
            "step": step, "t": t, **extra}


def run_of(job: str, attempt: int, t0: float, steps: int, ranks: int = 1, done: bool = True,
           host: str = "n0") -> list[dict[str, Any]]:
    out = [line(job, attempt, r, s, t0 + 0.1 * s, host) for s in range(steps) for r in range(ranks)]
    if done:
        out += [line(job, attempt, r, steps, t0 + 0.1 * steps, host, done=True) for r in range(ranks)]
    return out


def test_parse_skips_torn_and_foreign_lines() -> None:
    text = "\n".join([json.dumps(line("j", 1, 0, 0, 1.0)), '{"job": "j", "att', "[1, 2]", "{}"])
    assert [e["step"] for e in bc.parse_ledger(text)] == [0]


def test_spans_per_attempt_and_rank() -> None:
    entries = run_of("j", 1, 10.0, 5, ranks=2, host="n1") + run_of("j", 2, 20.0, 3, done=False)
    spans = bc.attempt_spans(entries)
    a1, a2 = spans[("j", 1)], spans[("j", 2)]
    assert (a1.start, a1.end) == (10.0, 10.5)
    assert a1.done == {0, 1}
    assert a1.complete(2)
    assert not a1.complete(3)
    assert a1.hosts == {"n1"}
    assert a1.pids == {100, 101}
    assert abs(a1.rank_seconds() - 1.0) < 1e-9
    assert not a2.complete(1)
    assert abs(a2.rank_seconds() - 0.2) < 1e-9


def test_overlapping_attempts_are_found_and_sequential_ones_are_not() -> None:
    seq = bc.attempt_spans(run_of("a", 1, 0.0, 10, done=False) + run_of("a", 2, 2.0, 10))
    assert bc.concurrent_attempts(seq) == []
    both = bc.attempt_spans(run_of("b", 1, 0.0, 10, done=False) + run_of("b", 2, 0.5, 10))
    (job, x, y, overlap), = bc.concurrent_attempts(both)
    assert (job, x, y) == ("b", 1, 2)
    assert abs(overlap - 0.4) < 1e-9
    # two different jobs at the same time are no finding
    other = bc.attempt_spans(run_of("c", 1, 0.0, 10) + run_of("d", 1, 0.0, 10))
    assert bc.concurrent_attempts(other) == []


def test_rerun_after_success_needs_every_rank_done() -> None:
    spans = bc.attempt_spans(run_of("j", 1, 0.0, 5, ranks=2) + run_of("j", 2, 3.0, 5, ranks=2))
    assert bc.reruns_after_success(spans, {"j": 2}) == [("j", 1, 2)]
    # attempt 1 finished only one of its two ranks: starting attempt 2 is a retry, not a rerun
    partial = [e for e in run_of("k", 1, 0.0, 5, ranks=2) if not (e["rank"] == 1 and e.get("done"))]
    spans = bc.attempt_spans(partial + run_of("k", 2, 3.0, 5, ranks=2))
    assert bc.reruns_after_success(spans, {"k": 2}) == []
    assert abs(bc.lost_rank_seconds(spans, {"k": 2}) - 0.9) < 1e-9


def test_unreportable_success_only_when_its_host_was_silent() -> None:
    spans = bc.attempt_spans(run_of("j", 1, 0.0, 5, host="n2") + run_of("j", 2, 20.0, 5, host="n3"))
    rerun = ("j", 1, 2)
    frozen = [bc.Outage("n2", 0.3, 24.0)]  # frozen from before its end until after the rerun began
    assert bc.unreportable(rerun, spans, "A", frozen)
    assert not bc.unreportable(rerun, spans, "A", [bc.Outage("n3", 0.3, 24.0)])  # another host
    assert not bc.unreportable(rerun, spans, "A", [bc.Outage("n2", 0.0, 0.2)])  # over before it ended
    assert not bc.unreportable(rerun, spans, "A", [bc.Outage("n2", 0.3, 14.0)])  # back before the rerun
    assert not bc.unreportable(rerun, spans, "A", [bc.Outage("n2", 25.0, 30.0)])  # after the rerun
    cut = [bc.Outage("n2", 0.3, 22.0, side="B")]
    assert bc.unreportable(rerun, spans, "A", cut)  # cut off from its submitter's half
    assert not bc.unreportable(rerun, spans, "B", cut)  # same half as the submitter


def test_schedule_is_seeded_and_covers_the_fault_kinds() -> None:
    jobs, faults = bc.make_schedule(7, 32, 130.0, bc.FULL_FAULTS, 3.0, 10.0)
    again, faults2 = bc.make_schedule(7, 32, 130.0, bc.FULL_FAULTS, 3.0, 10.0)
    assert jobs == again
    assert faults == faults2
    assert len(jobs) == 32
    assert {j.nproc for j in jobs} == {1, 2}
    assert all(0 <= j.t <= 130.0 and 3.0 <= j.duration_s <= 10.5 for j in jobs)
    assert sorted(f.kind for f in faults) == sorted(bc.FULL_FAULTS)
    assert faults[0].kind != "submitter_down"
    assert [f.planned_t for f in faults] == sorted(f.planned_t for f in faults)
    other, _ = bc.make_schedule(8, 32, 130.0, bc.FULL_FAULTS, 3.0, 10.0)
    assert other != jobs
