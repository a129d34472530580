"""Judge a change to Frenzy's HAS on the tune or validation windows, never the test split.

Each cell (cluster × load × mapping, as ``bench_sched.py``) runs ``--windows``
windows of the chosen split.  Frenzy runs every time; the baselines (sia,
gavel, tiresias, fifo, srtf, srtf-wide) do not change with Frenzy's
constants, so their results are kept in ``--cache`` and computed once per
window.  Per cell, as ``--final`` scores it: Frenzy's average JCT over the
windows against the best baseline that completed every job (the 18 %
target: ratio ≤ 0.82) and against the better of ``srtf`` and ``srtf-wide``
(worse than it: ratio > 1), with the p99 ratio.  The last line: the
geometric means over the cells.

Constants of ``frenzyd.has.frenzy_rules`` are set for Frenzy with
``--set NAME=VALUE`` (in this process only; nothing is written).

    PYTHONPATH=. python scripts/tune_has.py --split tune --windows 12
    PYTHONPATH=. python scripts/tune_has.py --split tune --windows 12 --set SHRINK_RATIO=4.0
    PYTHONPATH=. python scripts/tune_has.py --split validation --windows 12 --json out/val.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_sched  # noqa: E402

from frenzyd.has import frenzy, frenzy_rules  # noqa: E402
from frenzyd.has.registry import load_policy  # noqa: E402
from frenzyd.sim import jobs as sim_jobs  # noqa: E402
from frenzyd.sim.mapping import map_jobs  # noqa: E402
from frenzyd.sim.model import percentile  # noqa: E402
from frenzyd.sim.run import run_policies  # noqa: E402
from frenzyd.sim.trace import parse_philly_csv, split_window  # noqa: E402

BASELINES = bench_sched.BASELINES
REFERENCES = bench_sched.REFERENCES
OTHERS = (*BASELINES, *REFERENCES)
SPLITS = ("tune", "validation")
TARGET = 0.82
"""Frenzy's average JCT at most this fraction of the best complete baseline's (≥ 18 % below)."""

CLUSTERS = ("lab-20", "alibaba-64", "alibaba-256")
LOADS = ("1", "2")
MAPPINGS = ("gpus", "gputime")


def all_cells() -> list[str]:
    """bench_sched's grid: every cluster × load × mapping."""
    return [f"{c}:{load}:{m}" for c in CLUSTERS for load in LOADS for m in MAPPINGS]


FIXED_AT_IMPORT = {"SHRINK_MIN_RUN_S": "--min-run-s"}
"""Constants read once, as a default argument, when ``frenzy`` is imported: setting them later changes
nothing, so ``--set`` refuses them and names the option that does."""

_TRACE: list[Any] = []
_CLUSTERS: dict[str, Any] = {}
_SOURCE: list[Any] = []
"""Per worker process: the parsed trace, the clusters and one MARP plan source (its fit cache shared by
every window the worker runs, as ``bench_sched`` shares one)."""

FRENZY_ONLY = ("frenzy.py", "frenzy_rules.py", "free_gpus.py", "plan_shape.py")
"""Files of ``frenzyd/has`` that only Frenzy runs: the baselines' cached results do not depend on them
(``tests/scripts/test_tune_has.py`` checks that no other simulated module imports them)."""


SIMULATED = ("frenzyd/has", "frenzyd/marp", "frenzyd/sim", "frenzyd/errors.py", "frenzyd/gpu_types.py")
"""What a simulated run imports and reads (MARP's plans, the simulator, the baselines, the speed model,
the trace and cluster data; ``tests/scripts/test_tune_has.py`` checks the imports): the daemon's
packages do not change a baseline's result, and a change to them keeps the cache."""


def baseline_fingerprint() -> str:
    """sha256 over what the baselines' results depend on (``SIMULATED``) except Frenzy's own rules.  A
    cache built under another fingerprint is stale and is dropped."""
    h = hashlib.sha256()
    paths = [p for part in SIMULATED for p in ((ROOT / part).rglob("*") if (ROOT / part).is_dir()
                                               else [ROOT / part])]
    for path in sorted(paths):
        if not path.is_file() or path.suffix not in (".py", ".csv", ".toml", ".json"):
            continue
        if path.parent.name == "has" and path.name in FRENZY_ONLY:
            continue
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def load_cache(path: Path, fingerprint: str) -> dict[str, Any]:
    """The cached baseline results for ``fingerprint``; empty when there are none or they are stale."""
    if not path.exists():
        return {"fingerprint": fingerprint, "windows": {}}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"fingerprint": fingerprint, "windows": {}}
    if not isinstance(cache, dict) or cache.get("fingerprint") != fingerprint:
        print(f"[tune_has] {path}: built for other code (MARP, simulator or baselines changed); rebuilding",
              file=sys.stderr, flush=True)
        return {"fingerprint": fingerprint, "windows": {}}
    return cache


def parse_set(items: Iterable[str]) -> dict[str, float]:
    """``NAME=VALUE`` pairs for frenzy_rules' constants; a clear error for anything else."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if name in FIXED_AT_IMPORT:
            raise SystemExit(f"--set {item!r}: {name} is bound when frenzy is imported; "
                             f"use {FIXED_AT_IMPORT[name]}")
        if not sep or not name.isupper() or not hasattr(frenzy_rules, name):
            known = sorted(n for n in vars(frenzy_rules) if n.isupper() and not n.startswith("_"))
            raise SystemExit(f"--set {item!r}: use NAME=VALUE with NAME one of {', '.join(known)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise SystemExit(f"--set {item!r}: {value!r} is not a number") from None
    return out


def apply_set(values: dict[str, float]) -> None:
    """Set the constants where the rules read them (``frenzy`` re-exports some by name)."""
    for name, value in values.items():
        current = getattr(frenzy_rules, name)
        v: float | int = int(value) if isinstance(current, int) else value
        setattr(frenzy_rules, name, v)
        if hasattr(frenzy, name):
            setattr(frenzy, name, v)


Task = tuple[str, int, str, tuple[str, ...], dict[str, float], float | None]
"""(split, window, cell, policies, frenzy_rules constants, Frenzy's min_run_s)."""


def run_window(task: Task) -> tuple[str, dict]:
    """Simulate ``policies`` on one window of one cell: {policy: {avg, p99, failed, restarts}}."""
    split, window, cell, policies, values, min_run_s = task
    apply_set(values)
    if not _TRACE:
        _TRACE.extend(parse_philly_csv((bench_sched.DATA / "philly.csv").read_text()))
        _CLUSTERS.update(bench_sched.clusters(False))
        _SOURCE.append(sim_jobs.MarpPlanSource())
    cname, load, mapping = cell.split(":")
    cluster = _CLUSTERS[cname]
    trace = split_window(_TRACE, 160, window, split)
    jobs, _ = sim_jobs.prepare_jobs(
        map_jobs(trace, mapping, window), cluster, _SOURCE[0], load=float(load)
    )
    pols = [load_policy(p, sia_time_limit_s=10.0) for p in policies]
    for p in pols:
        if isinstance(p, frenzy.FrenzyPolicy) and min_run_s is not None:
            p.min_run_s = min_run_s
    body, results = run_policies(pols, jobs, cluster, seed=window, clock=time.perf_counter)
    out = {}
    for r in results:
        done = sorted(o.end_s - o.arrival_s for o in r.outcomes if o.state == "completed")
        out[r.name] = {
            "avg": statistics.fmean(done) if done else float("inf"),
            "p99": percentile(done, 99) if done else float("inf"),
            "failed": len(r.outcomes) - len(done),
            "restarts": body["policies"][r.name].get("restarts") or 0,  # type: ignore[index, union-attr]
        }
    return f"{split}|{window}|{cell}", out


def score(cell: str, frenzy_runs: list[dict], other_runs: list[dict]) -> dict[str, Any]:
    """One cell over its windows, as ``--final`` scores it (means over the windows, then ratios)."""
    def mean(runs: list[dict], name: str, key: str) -> float:
        return statistics.fmean(r[name][key] for r in runs)

    ours = statistics.fmean(r["avg"] for r in frenzy_runs)
    ours_p99 = statistics.fmean(r["p99"] for r in frenzy_runs)
    complete = [b for b in BASELINES if all(r[b]["failed"] == 0 for r in other_runs)]
    best = min(complete, key=lambda b: mean(other_runs, b, "avg")) if complete else None
    ref = min(REFERENCES, key=lambda b: mean(other_runs, b, "avg"))
    return {
        "cell": cell,
        "frenzy_avg_h": ours / 3600,
        "best_baseline": best,
        "vs_best": ours / mean(other_runs, best, "avg") if best else None,
        "p99_vs_best": ours_p99 / mean(other_runs, best, "p99") if best else None,
        "reference": ref,
        "vs_reference": ours / mean(other_runs, ref, "avg"),
        "frenzy_restarts": sum(r["restarts"] for r in frenzy_runs),
        "reference_restarts": sum(r[ref]["restarts"] for r in other_runs),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--split", choices=SPLITS, default="tune",
                    help="trace split (the test split is for bench_sched.py --final only)")
    ap.add_argument("--windows", type=int, default=12,
                    help="windows 0..N-1 of the split per cell (default 12)")
    ap.add_argument("--cells", nargs="*", default=None,
                    help="cells as CLUSTER:LOAD:MAPPING (default: all 12 of bench_sched's grid)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE",
                    help="a frenzy_rules constant for this run (repeatable)")
    ap.add_argument("--min-run-s", type=float, default=None, help="FrenzyPolicy(min_run_s=...) for this run")
    ap.add_argument("--cache", type=Path, default=ROOT / "out" / "tune_has_cache.json",
                    help="baseline results per window, dropped when the code they depend on changes "
                         "(default out/tune_has_cache.json)")
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path, default=None, help="write the per-cell scores here")
    args = ap.parse_args(argv)
    if args.windows < 1:
        ap.error("--windows must be at least 1")
    values = parse_set(args.sets)
    cells = args.cells or all_cells()
    for c in cells:
        parts = c.split(":")
        if len(parts) != 3 or parts[0] not in CLUSTERS or parts[2] not in MAPPINGS:
            ap.error(f"cell {c!r}: use CLUSTER:LOAD:MAPPING, e.g. lab-20:1:gpus")
    store = load_cache(args.cache, baseline_fingerprint())
    cache: dict[str, dict] = store["windows"]
    keys = [(w, c) for c in cells for w in range(args.windows)]
    missing: list[Task] = [
        (args.split, w, c, OTHERS, {}, None) for w, c in keys if f"{args.split}|{w}|{c}" not in cache
    ]
    ours: list[Task] = [(args.split, w, c, ("frenzy",), values, args.min_run_s) for w, c in keys]
    t0 = time.perf_counter()
    with get_context("fork").Pool(max(1, args.processes)) as pool:
        for n, (key, out) in enumerate(pool.imap_unordered(run_window, missing), 1):
            cache[key] = out
            args.cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.cache.with_suffix(".part")
            tmp.write_text(json.dumps(store))
            tmp.replace(args.cache)
            print(f"[tune_has] baselines {n}/{len(missing)} windows ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)
        mine = dict(pool.map(run_window, ours))
    rows = []
    for c in cells:
        f_runs = [mine[f"{args.split}|{w}|{c}"]["frenzy"] for w in range(args.windows)]
        o_runs = [cache[f"{args.split}|{w}|{c}"] for w in range(args.windows)]
        rows.append(score(c, f_runs, o_runs))
    print(f"{'cell':24} {'frenzy h':>8}  {'vs best baseline':>22}  {'p99':>5}  "
          f"{'vs better srtf':>20}  restarts (frenzy / reference)")
    for r in rows:
        best = f"{r['vs_best']:.3f} ({r['best_baseline']})" if r["vs_best"] else "none complete"
        p99 = f"{r['p99_vs_best']:.2f}" if r["p99_vs_best"] else "-"
        print(f"{r['cell']:24} {r['frenzy_avg_h']:8.2f}  {best:>22}  {p99:>5}  "
              f"{r['vs_reference']:.3f} ({r['reference']:9})  "
              f"{r['frenzy_restarts']} / {r['reference_restarts']}")
    scored = [r["vs_best"] for r in rows if r["vs_best"]]
    summary = {
        "split": args.split,
        "windows": args.windows,
        "set": values,
        "min_run_s": args.min_run_s,
        "geomean_vs_best": statistics.geometric_mean(scored) if scored else None,
        "cells_meeting_18pct": sum(1 for r in rows if r["vs_best"] and r["vs_best"] <= TARGET
                                   and r["p99_vs_best"] <= 1.0),
        "geomean_vs_reference": statistics.geometric_mean([r["vs_reference"] for r in rows]),
        "cells_worse_than_reference": sum(1 for r in rows if r["vs_reference"] > 1.0),
        "cells": rows,
    }
    print(f"geometric mean vs best baseline {summary['geomean_vs_best']:.4f}, "
          f"{summary['cells_meeting_18pct']}/{len(rows)} cells >= 18 % with p99 no worse; "
          f"vs better srtf {summary['geomean_vs_reference']:.4f}, "
          f"worse in {summary['cells_worse_than_reference']} cells  {json.dumps(values)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
