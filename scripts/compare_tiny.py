#!/usr/bin/env python3
"""Show that a change left every benchmark result alone: each ``--tiny`` benchmark before and after, compared.

    python scripts/compare_tiny.py --ref REV [--only NAME]... [--json OUT] [--keep DIR]
    python scripts/compare_tiny.py --before-dir DIR [--after-dir DIR] [--only NAME]...

"Before" is a temporary ``git worktree`` of REV (removed afterwards); "after" is
the tree this script lives in, uncommitted changes included.  Every
``scripts/bench_*.py`` runs once in each tree, one at a time, with this Python,
the tree's root as working directory and as ``PYTHONPATH`` (so each run imports
its own tree's ``frenzyd``; this is checked first):

    python scripts/bench_NAME.py --tiny [EXTRA_ARGS[NAME]] --out DIR/bench_NAME.json

``--before-dir`` / ``--after-dir`` take JSONs written that way instead of running.

The two documents of a benchmark are compared leaf by leaf.  Left out: the
top-level provenance keys (``PROVENANCE``) and the measured timings, which are
named per benchmark in ``TIMINGS`` (a leaf is a timing when a dict key on its
path is listed).  Every other leaf must be equal, exactly and of the same JSON
type, and both documents must have the same leaves.  For the timings the table
gives the after/before ratio of each timing leaf, summarised as the median over
the benchmark's timing leaves, the range, and how many fall outside ±20 %.

Exit status: 0 every benchmark identical; 1 a non-timing leaf differs (the
first differing paths are printed), or a benchmark exists in one tree only;
2 a benchmark could not be run, a JSON is missing, or the arguments are wrong
(REV no commit, no such benchmark, a tree that imports another tree's frenzyd).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent

# Top-level provenance keys: today's (benchmeta.PROVENANCE_KEYS) and the names the scripts used before
# benchmeta (argv; bench_sched's started), so that older trees and results files compare too.
PROVENANCE = frozenset({"command", "git_commit", "machine", "time", "argv", "started"})

# Arguments after --tiny, per benchmark.
EXTRA_ARGS: dict[str, tuple[str, ...]] = {
    # bench_marp caches measurements (bench-results/marp-cache.json) keyed by configuration and torch and
    # transformers versions, not by code: with the cache the after run would replay old measurements.
    "bench_marp": ("--no-cache",),
}

# Measured durations and rates, by key name.  Everything not listed is a result of the code alone and is
# compared exactly, however much its name looks like a duration.
TIMINGS: dict[str, frozenset[str]] = {
    "bench_marp": frozenset({
        # the run's wall time (top level) and each measurement's (rows[].real.wall_s, rows[].trace.wall_s)
        "wall_s",
        # speed.*: the analytic predictor's and feasible_plans' run times
        "analytic_predict_ms_median",
        "analytic_predict_ms_p95",
        "plans_llama2_70b_4x64_ms_median",
        # not timings: every byte count (measured*, peak_bytes, phases, breakdown, baselines), the
        # accuracies, the fit and the constants, speed.plans_count, speed.plans_pool
    }),
    "bench_peers": frozenset({
        # results.wire and results.orders: microseconds per operation
        "encode_us",
        "decode_us",
        "seal_us",
        "open_us",
        # results.transport.*: request latencies and throughput
        "p50_ms",
        "p99_ms",
        "mean_ms",
        "req_per_s",
        # not timings: results.wire.frame_bytes, sizes.*
    }),
    "bench_pool": frozenset({
        # results.mesh
        "start_to_full_mesh_s",
        "first_answer_to_full_mesh_s",
        # results.web.<path>
        "wall_s",
        "req_per_s",
        "p50_ms",
        "p99_ms",
        # results.client_startup_s
        "client_startup_s",
        # results.launch: the medians and launch.runs[]
        "submit_answer_s",
        "submit_to_first_rank_running_s",
        "submit_to_all_ranks_running_s",
        "submit_to_process_group_ready_s",
        # results.failover
        "failover_s",
        # not timings: heartbeat_s and peer_timeout_s (configured; in config and results.failover),
        # requests, errors, daemons, concurrency
    }),
    "bench_sched": frozenset({
        # the run's wall time (top level) and each JCT cell's (jct_cells[].wall_s)
        "wall_s",
        # jct_cells[].policies.P.decision_ms.{median,p95,max}: real time per scheduling round
        "decision_ms",
        # overhead[].policies.P: decision time on the sweep's snapshots
        "median_ms",
        "warm_median_ms",
        # not timings: *_jct_s, avg_queue_s, makespan_s, limit.* and jct_summary (simulated seconds and
        # what is computed from them), config.sia_time_limit_s (configured), solver_timeouts, placements,
        # restarts, reps
    }),
}

# Computed only from timings but not durations, so no ratio means anything: left out altogether.
TIMING_DERIVED: dict[str, frozenset[str]] = {
    "bench_sched": frozenset({"overhead_growth"}),  # exponents fitted to overhead[]'s decision times
}

# Counts of solves cut short by a time limit: a result that may then legitimately differ between two runs.
CAPPED_SOLVES = "solver_timeouts"

TOLERANCE = 0.20

Path_ = tuple[str | int, ...]


def fmt_path(path: Path_) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "(document)"


def leaves(doc: Any, path: Path_ = ()) -> dict[Path_, Any]:
    """Every leaf of a JSON document by path; an empty dict or list is a leaf itself."""
    out: dict[Path_, Any] = {}
    if isinstance(doc, dict) and doc:
        for k, v in doc.items():
            out.update(leaves(v, (*path, k)))
    elif isinstance(doc, list) and doc:
        for i, v in enumerate(doc):
            out.update(leaves(v, (*path, i)))
    else:
        out[path] = doc
    return out


def same(a: Any, b: Any) -> bool:
    """Equal and of the same JSON type (1 and 1.0 differ, NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass
class Comparison:
    name: str
    compared: int = 0
    differences: list[tuple[Path_, Any, Any]] = field(default_factory=list)
    ratios: dict[Path_, float] = field(default_factory=dict)
    timing_leaves: int = 0
    capped_solves: int = 0
    error: str | None = None

    @property
    def identical(self) -> bool:
        return self.error is None and not self.differences

    def ratio_summary(self) -> dict[str, Any]:
        rs = list(self.ratios.values())
        if not rs:
            return {"n": 0}
        return {
            "n": len(rs),
            "median": statistics.median(rs),
            "min": min(rs),
            "max": max(rs),
            "outside_20pct": sum(1 for r in rs if abs(r - 1) > TOLERANCE),
        }

    def to_json(self, show: int) -> dict[str, Any]:
        return {
            "benchmark": self.name,
            "identical": self.identical,
            "error": self.error,
            "compared_leaves": self.compared,
            "differing_leaves": len(self.differences),
            "differences": [
                {"path": fmt_path(p), "before": b, "after": a} for p, b, a in self.differences[:show]
            ],
            "timing_leaves": self.timing_leaves,
            "timing_ratio": self.ratio_summary(),
            "timing_ratios": {fmt_path(p): r for p, r in self.ratios.items()},
            "capped_solves": self.capped_solves,
        }


_MISSING = object()


def compare(name: str, before: dict[str, Any], after: dict[str, Any]) -> Comparison:
    """Compare two results documents of benchmark ``name``, provenance and timings left out."""
    timing = TIMINGS.get(name, frozenset())
    derived = TIMING_DERIVED.get(name, frozenset())
    lb = leaves({k: v for k, v in before.items() if k not in PROVENANCE})
    la = leaves({k: v for k, v in after.items() if k not in PROVENANCE})
    c = Comparison(name)
    for path in list(lb) + [p for p in la if p not in lb]:
        b, a = lb.get(path, _MISSING), la.get(path, _MISSING)
        keys = {p for p in path if isinstance(p, str)}
        if keys & derived:
            continue
        if path and path[-1] == CAPPED_SOLVES:
            c.capped_solves += sum(x for x in (a, b) if _number(x))
        if b is _MISSING or a is _MISSING:
            if not keys & timing:
                c.compared += 1
            c.differences.append((path, None if b is _MISSING else b, None if a is _MISSING else a))
            continue
        if keys & timing:
            c.timing_leaves += 1
            if _number(a) and _number(b):
                if b > 0:
                    c.ratios[path] = a / b
            elif not same(a, b):
                c.differences.append((path, b, a))
            continue
        c.compared += 1
        if not same(a, b):
            c.differences.append((path, b, a))
    return c


# --------------------------------------------------------------------------- running


def benchmarks(tree: Path) -> list[str]:
    return sorted(p.stem for p in (tree / "scripts").glob("bench_*.py"))


def fail(why: str) -> NoReturn:
    print(f"compare_tiny: {why}", file=sys.stderr)
    raise SystemExit(2)


def _env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


def check_imports_own_tree(tree: Path) -> None:
    """Fail unless ``import frenzyd`` with this Python and PYTHONPATH resolves inside ``tree``."""
    with tempfile.TemporaryDirectory() as away:
        res = subprocess.run(
            [sys.executable, "-c", "import frenzyd; print(frenzyd.__file__)"],
            cwd=away, env=_env(tree), capture_output=True, text=True, check=False,
        )
    where = Path(res.stdout.strip()).resolve() if res.returncode == 0 else None
    if where is None or not where.is_relative_to(tree.resolve()):
        fail(f"with PYTHONPATH={tree}, frenzyd is imported from {where or res.stderr.strip()}")


def run_tree(label: str, tree: Path, names: Iterable[str], out_dir: Path, timeout_s: float) -> dict[str, str]:
    """Run each benchmark once in ``tree``; return {name: why it failed}."""
    check_imports_own_tree(tree)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    for name in names:
        script = Path("scripts") / f"{name}.py"
        if not (tree / script).is_file():
            continue
        out = out_dir / f"{name}.json"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, str(script), "--tiny", *EXTRA_ARGS.get(name, ()), "--out", str(out)]
        t0 = time.monotonic()
        print(f"[{label}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        with (out_dir / f"{name}.out").open("w") as so, (out_dir / f"{name}.err").open("w") as se:
            try:
                rc = subprocess.run(
                    cmd, cwd=tree, env=_env(tree), stdout=so, stderr=se, timeout=timeout_s, check=False
                ).returncode
            except subprocess.TimeoutExpired:
                rc = None
        took = time.monotonic() - t0
        if rc != 0 or not out.is_file():
            why = f"timed out after {timeout_s:.0f} s" if rc is None else f"exit status {rc}"
            tail = (out_dir / f"{name}.err").read_text().strip().splitlines()[-15:]
            failed[name] = why
            print(f"[{label}] {name} FAILED ({why}, {took:.0f} s):", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)
        else:
            print(f"[{label}] {name} done in {took:.0f} s", file=sys.stderr, flush=True)
    return failed


def make_worktree(rev: str, where: Path) -> None:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), rev], check=True
    )


def remove_worktree(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
                   capture_output=True, check=False)
    shutil.rmtree(where, ignore_errors=True)
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True, check=False)


def resolve(rev: str) -> str:
    res = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        fail(f"{rev!r} is not a commit here")
    return res.stdout.strip()


# --------------------------------------------------------------------------- report


def _r(x: float) -> str:
    return f"{x:.2f}"


def table(rows: list[Comparison]) -> str:
    head = ["benchmark", "identical", "compared leaves", "timing leaves", "after/before median",
            "min - max", "outside ±20 %"]
    body = []
    for c in rows:
        s = c.ratio_summary()
        ident = "ERROR" if c.error else ("yes" if c.identical else f"NO ({len(c.differences)} differ)")
        if s["n"]:
            timing = [_r(s["median"]), f"{_r(s['min'])} - {_r(s['max'])}", str(s["outside_20pct"])]
        else:
            timing = ["-", "-", "-"]
        body.append([c.name, ident, str(c.compared), str(c.timing_leaves), *timing])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |" for r in body]
    return "\n".join(lines)


def _short(x: Any) -> str:
    s = json.dumps(x)
    return s if len(s) <= 80 else s[:77] + "..."


def report(rows: list[Comparison], show: int) -> None:
    print(table(rows))
    for c in rows:
        if c.error:
            print(f"\n{c.name}: {c.error}")
        elif c.differences:
            n = len(c.differences)
            print(f"\n{c.name}: {n} differing leaves, the first {min(show, n)}:")
            for p, b, a in c.differences[:show]:
                print(f"  {fmt_path(p)}: {_short(b)} -> {_short(a)}")
            if c.capped_solves:
                print(f"  ({c.capped_solves} solves hit their time limit in these runs: results that "
                      "depend on them may differ from run to run)")
        if c.name not in TIMINGS and not c.error:
            print(f"\n{c.name}: no timing keys listed in compare_tiny.TIMINGS; every leaf was compared")


# --------------------------------------------------------------------------- main


def _name(s: str) -> str:
    s = Path(s).name.removesuffix(".py")
    return s if s.startswith("bench_") else f"bench_{s}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ref", help="the revision to compare against (run in a temporary git worktree)")
    src.add_argument("--before-dir", type=Path, help="use the bench_*.json here instead of running --ref")
    ap.add_argument("--after-dir", type=Path, help="use the bench_*.json here instead of running this tree")
    ap.add_argument("--only", action="append", type=_name, metavar="NAME",
                    help="only this benchmark (bench_marp, marp, ...); repeatable")
    ap.add_argument("--json", type=Path, metavar="OUT", help="also write the comparison as JSON here")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="write the runs' JSON and output to DIR/before and DIR/after and keep them")
    ap.add_argument("--show", type=int, default=10, help="differing paths printed per benchmark")
    ap.add_argument("--timeout-s", type=float, default=1800, help="limit per benchmark run")
    args = ap.parse_args(argv)

    rev = resolve(args.ref) if args.ref else None
    tmp = Path(tempfile.mkdtemp(prefix="compare-tiny-"))
    work = args.keep.resolve() if args.keep else tmp
    before_dir = args.before_dir or work / "before"
    after_dir = args.after_dir or work / "after"
    worktree = tmp / "tree"
    failed: dict[str, str] = {}
    try:
        # What each side has: a tree's scripts, or a directory's JSONs.
        if rev is not None:
            make_worktree(rev, worktree)
            have_before = set(benchmarks(worktree))
        else:
            have_before = {p.stem for p in before_dir.glob("bench_*.json")}
        if args.after_dir is None:
            have_after = set(benchmarks(ROOT))
        else:
            have_after = {p.stem for p in after_dir.glob("bench_*.json")}
        names = sorted(have_before | have_after)
        if args.only:
            unknown = sorted(set(args.only) - set(names))
            if unknown:
                fail(f"no {', '.join(unknown)} (have {', '.join(names)})")
            names = [n for n in names if n in args.only]
        if rev is not None:
            failed.update(run_tree("before", worktree, names, before_dir, args.timeout_s))
        if args.after_dir is None:
            failed.update(run_tree("after", ROOT, names, after_dir, args.timeout_s))
        rows: list[Comparison] = []
        for name in names:
            fb, fa = before_dir / f"{name}.json", after_dir / f"{name}.json"
            if name in failed:
                rows.append(Comparison(name, error=f"run failed: {failed[name]}"))
            elif rev is not None and name not in have_before:
                rows.append(Comparison(name, differences=[((), f"no scripts/{name}.py at {rev[:12]}", "-")]))
            elif args.after_dir is None and name not in have_after:
                rows.append(Comparison(name, differences=[((), "-", f"no scripts/{name}.py in {ROOT}")]))
            elif not fb.is_file() or not fa.is_file():
                rows.append(Comparison(name, error=f"missing {fb if not fb.is_file() else fa}"))
            else:
                rows.append(compare(name, json.loads(fb.read_text()), json.loads(fa.read_text())))
    finally:
        if rev is not None:
            remove_worktree(worktree)
        shutil.rmtree(tmp, ignore_errors=True)  # the worktree's parent; the runs' output unless --keep

    print(f"before: {rev or before_dir}   after: {ROOT if args.after_dir is None else after_dir}")
    report(rows, args.show)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"ref": rev, "before": str(before_dir) if args.before_dir or args.keep else None,
               "after": str(ROOT if args.after_dir is None else after_dir), "tolerance": TOLERANCE,
               "benchmarks": [c.to_json(args.show) for c in rows]}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    if any(c.error for c in rows):
        return 2
    return 0 if all(c.identical for c in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
