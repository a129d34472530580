#!/usr/bin/env python3
"""How low could any schedule take the average JCT of a ``bench_sched.py`` run?  A lower bound per window.

The alone limit (every job on its fastest plan at once, ``sim.jobs.limit_jct_s``)
ignores that jobs share the pool: on an overloaded window it sits near a
tenth of what any policy reaches, so it cannot tell a scheduler that is near
the best possible from one that is far.  This script solves a time-indexed
linear relaxation of the scheduling problem per window of a ``bench_sched``
JSON (``--out``) and reports, per cell, the bound beside every policy's
average JCT: how much of the gain over the best baseline was there to take.

**The relaxation.**  Time from the first job's earliest progress to ``H``
(the latest completion of any policy in the run) is cut into slots at
``--slots`` even steps, at every job's earliest progress (its arrival
plus its first start-up cost, ``sim.preemption.DEFAULT``) and at the
completions of the run's best policy (short slots where jobs end), and one
tail slot runs from ``H`` to ``H`` + 10 spans.  In each slot a job time-shares
among its plans (``x``: the fraction of the slot on each; at most 1 in all);
on GPU type ``t`` the plans' GPUs, ``Σ n·x``, are at most the type's GPUs;
each job's progress, ``Σ x·Δ/(steps·step_time)``, sums to 1.  A plan runs
inside one peer (the one-peer step time) or across peers (the inter-peer
step time: the speed model's step time depends on the peers only through
whether there is more than one).  Inside one peer it needs a peer of at
least its GPUs: per type and size ``k`` of its peers, the one-peer plans
of more GPUs than the next smaller size use at most the GPUs of the peers
of ``k`` or more (a plan of 3 or 4 T4s inside one peer, where two peers
hold 4 and the rest 2, shares those two peers' 8).  The plans are those
MARP found feasible and the simulator does not fail for memory, pruned
per type to the upper concave hull of (GPUs, speed), band by band
(time-sharing plans that use no more of any peer size does at least as
well as a plan below their hull).  Relaxed:
within a slot, jobs and plans take turns on the GPUs at no cost (GPUs
divisible in time, stops and moves free; a job still runs one plan at a
time, so never faster than its fastest), and tensor groups may span peers.

**Why it bounds the average JCT.**  Let a job's progress run at most at its
fastest plan's rate ``ρ`` and end at its completion ``C``.  Its mean busy
time ``M`` (the progress-weighted mean of the times its progress happens) is
at most ``C − 1/(2ρ)`` (the latest it can be is all progress at full rate just
before ``C``), and ``C`` is at least its earliest progress plus ``1/ρ``.  The
LP counts progress at its slot's start, so its ``M`` is at most the real one;
minimising ``Σ C`` with ``C ≥ M + 1/(2ρ)`` and ``C ≥ earliest + 1/ρ`` is a
lower bound on ``Σ C`` of every schedule that places MARP's plans and ends by
the end of the tail slot (that is every policy of the run, FIFO's ZeRO-3
user plans aside: the script reports any policy below the bound as an
error).  The slot length limits how tight it is (each job's ``M`` may be
under-counted by up to one slot), not whether it holds.

**The bound reported** per window is the larger of the LP's and the alone
limit, two lower bounds.  Each job's floor in the LP (its earliest progress
plus its run on its fastest plan) is at least its time alone, so the LP is
never the smaller now; it was in 3 of the 256-GPU windows while the LP
charged every plan its one-peer step time (until 2026-12-04: on Alibaba's
2-GPU nodes most plans span peers, and the LP ran them faster than any
placement can; the peer-size rows came later the same day, before them the
LP let every plan that fits a type's largest peer run inside one, any
number at once).  ``lp_avg_jct_s`` keeps the LP's own.
``--render`` prints the table again from a saved ``--json`` (and rewrites its
cells) without solving anything.

    PYTHONPATH=. python scripts/jct_bound.py --from bench-results/sched_final.json --cells lab-20
    PYTHONPATH=. python scripts/jct_bound.py --from /tmp/bench_sched_tiny.json --json /tmp/bound.json
    PYTHONPATH=. python scripts/jct_bound.py --render bench-results/sched_final_bound.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_sched

from frenzyd.has.interface import Cluster, packed_peers
from frenzyd.sim import jobs as sim_jobs
from frenzyd.sim.mapping import map_jobs
from frenzyd.sim.model import SimJob
from frenzyd.sim.preemption import DEFAULT, PreemptionModel
from frenzyd.sim.simulator import plan_fits
from frenzyd.sim.trace import parse_philly_csv, split_window

TAIL_SPANS = 10.0
"""The tail slot's length in spans of the window (``H`` − the first earliest progress)."""
SOLVERS = ("highs-ipm", "highs-ds")
"""HiGHS' interior point first (1.5-8 min a window of the Alibaba slices here), its dual simplex where the
interior point stops on a numerical error: it did on one 64-GPU window while the peer-size rows were being
written ("HiGHS Status 4: Solve error" after minutes), and the simplex solved that LP in 24 s."""
BASELINES = bench_sched.BASELINES
"""The baselines the issue's 18 % target is measured against."""


class ReportMismatch(Exception):
    """The report's jobs are not the ones this code makes for its cells (it comes from other code)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """One plan a job may run in the relaxation: its type's index, its GPUs, its progress per second, and
    its peer band: 0 for a plan any peers of the type can hold (inside the type's smallest peer, or spread
    over several at the inter-peer step time), ``b`` ≥ 1 for a plan inside one peer of more GPUs than the
    type's ``b`` smallest peer sizes (only its larger peers hold it)."""

    type_index: int
    gpus: int
    rate: float
    band: int = 0


@dataclass(frozen=True, slots=True)
class Bound:
    """A window's lower bound and what solving it took."""

    avg_jct_s: float
    """The lower bound on the average JCT (seconds)."""
    slot_s: float
    """The even slots' length: how much a job's mean busy time may be under-counted."""
    variables: int
    solve_s: float
    solver: str = "highs-ipm"
    """The HiGHS method that solved it (``SOLVERS``)."""


def peer_sizes(cluster: Cluster) -> dict[str, list[int]]:
    """GPUs of each type in each peer that holds any, largest first."""
    out: dict[str, list[int]] = {}
    for (_, t), n in cluster.per_peer().items():
        out.setdefault(t, []).append(n)
    return {t: sorted(ns, reverse=True) for t, ns in out.items()}


def band_sizes(sizes: Sequence[int]) -> list[int]:
    """The distinct peer sizes of a type, smallest first.  Band ``b`` ≥ 1 holds the one-peer plans of more
    GPUs than entry ``b − 1``: they need a peer of entry ``b`` or more."""
    return sorted(set(sizes))


def _upper_hull(points: Iterable[tuple[int, float, int]]) -> list[tuple[int, float, int]]:
    """The vertices of the upper concave hull through the origin of (GPUs, rate) points (a third field
    rides along), rising strictly: a point on or below a chord is a mix of two others that does as well."""
    hull: list[tuple[int, float, int]] = [(0, 0.0, -1)]
    for n, r, tag in sorted(points, key=lambda q: (q[0], q[1])):
        if r <= hull[-1][1]:
            continue  # more GPUs for no more speed
        while len(hull) >= 2:
            (n1, r1, _), (n2, r2, _) = hull[-2], hull[-1]
            if (r2 - r1) * (n - n1) <= (r - r1) * (n2 - n1):
                hull.pop()
            else:
                break
        hull.append((n, r, tag))
    return hull[1:]


def _hull_at(hull: Sequence[tuple[int, float, int]], n: int) -> float:
    """The rate mixes of ``hull``'s plans reach on at most ``n`` GPUs (0 with no plan)."""
    prev = (0, 0.0)
    for hn, hr, _ in hull:
        if n <= hn:
            return prev[1] + (hr - prev[1]) * (n - prev[0]) / (hn - prev[0])
        prev = (hn, hr)
    return prev[1]


def job_rates(
    job: SimJob,
    counts: dict[str, int],
    speed_of: dict[str, float],
    sizes: dict[str, Sequence[int]],
    types: Sequence[str],
) -> list[Rate]:
    """The job's plans that could complete it, as progress rates in peer bands (``Rate``).

    A plan of ``n`` GPUs may run inside one peer of at least ``n`` GPUs at the one-peer step time (band
    of the smallest such size; band 0 when the type's smallest peer holds it) or, where a type's peers
    are not all that large, across peers at the inter-peer step time (band 0; ``JobSpeed.step_time_s``
    depends on the peers only through whether there is more than one, so every spread placement runs at
    that rate).  Pruned per type: a plan is dropped when a mix of plans of its band or lower, which uses
    no more of any band's GPUs, runs at least as fast on no more GPUs (the upper concave hull of (GPUs,
    rate) through the origin, band by band)."""
    best: dict[tuple[str, int, int], float] = {}
    steps = job.total_steps
    for p in job.plans:
        if p.gpu_type not in counts or p.gpus > counts[p.gpu_type] or not plan_fits(job, p):
            continue
        bands = band_sizes(sizes[p.gpu_type])
        variants: list[tuple[int, int]] = []  # (band, peers)
        if p.gpus <= bands[-1]:
            variants.append((next(b for b, s in enumerate(bands) if p.gpus <= s), 1))
        if p.gpus > bands[0] and len(sizes[p.gpu_type]) > 1:
            variants.append((0, max(2, packed_peers(p, bands[-1]))))
        for band, peers in variants:
            rate = 1.0 / (steps * job.speed.step_time_s(p, speed_of[p.gpu_type], peers))
            key = (p.gpu_type, p.gpus, band)
            best[key] = max(best.get(key, 0.0), rate)
    out: list[Rate] = []
    for ti, t in enumerate(types):
        mine = [(n, r, band) for (tt, n, band), r in best.items() if tt == t]
        kept: list[tuple[int, float, int]] = []
        for band in sorted({q[2] for q in mine}):
            lower = _upper_hull(kept)
            hull = _upper_hull([*kept, *(q for q in mine if q[2] == band)])
            kept.extend(q for q in hull if q[2] == band and q[1] > _hull_at(lower, q[0]) * (1 + 1e-12))
        out.extend(Rate(ti, n, r, band) for n, r, band in sorted(kept, key=lambda q: (q[2], q[0])))
    return out


def lower_bound(
    jobs: Sequence[SimJob],
    cluster: Cluster,
    *,
    horizon_s: float,
    slots: int = 300,
    marks: Sequence[float] = (),
    preemption: PreemptionModel = DEFAULT,
) -> Bound:
    """The LP bound on the average JCT of ``jobs`` on ``cluster`` (module docstring) for schedules that end by
    ``horizon_s`` plus the tail slot.  ``marks``: more slot edges (a policy's completion times: where the
    action is, the slots are short)."""
    if not jobs:
        return Bound(0.0, 0.0, 0, 0.0)
    counts = Counter(g.gpu_type for g in cluster.gpus)
    speed_of = {t.name: t.speed for t in cluster.types}
    sizes = peer_sizes(cluster)
    types = sorted(counts)
    earliest: list[float] = []
    fastest: list[float] = []
    rates: list[list[Rate]] = []
    for job in jobs:
        rs = job_rates(job, counts, speed_of, sizes, types)
        if not rs:
            raise ValueError(f"job {job.job_id} has no plan that fits the cluster: no schedule completes it")
        rates.append(rs)
        fastest.append(max(r.rate for r in rs))
        earliest.append(job.arrival_s + preemption.restart_s(job.speed.restart_cost_s, resumed=False))
    t0 = min(earliest)
    c_low = [e + 1.0 / f for e, f in zip(earliest, fastest, strict=True)]
    end = max(horizon_s, *c_low)
    even = np.linspace(t0, end, slots + 1)
    extra = np.array([m for m in marks if t0 < m < end], dtype=float)
    edges = np.unique(np.concatenate([even, np.array(earliest), extra]))
    edges = np.append(edges, end + TAIL_SPANS * (end - t0))
    starts, lengths = edges[:-1], np.diff(edges)
    n_slots, n_jobs, n_types = len(starts), len(jobs), len(types)

    job_of: list[np.ndarray] = []
    slot_of: list[np.ndarray] = []
    gpus_of: list[np.ndarray] = []
    type_of: list[np.ndarray] = []
    rate_of: list[np.ndarray] = []
    # Band rows: for band b ≥ 1 of a type, the GPUs of the one-peer plans of band b or higher are at most
    # the GPUs of the type's peers of band b's size or larger.
    block: dict[tuple[int, int], int] = {}
    band_caps: list[float] = []
    for ti, tt in enumerate(types):
        bs = band_sizes(sizes[tt])
        for b in range(1, len(bs)):
            block[(ti, b)] = len(band_caps)
            band_caps.append(float(sum(m for m in sizes[tt] if m >= bs[b])))
    band_row_of: list[np.ndarray] = []
    band_col_of: list[np.ndarray] = []
    band_val_of: list[np.ndarray] = []
    col = 0
    for k, rs in enumerate(rates):
        first = int(np.searchsorted(starts, earliest[k] - 1e-9))
        span = np.arange(first, n_slots)
        for r in rs:
            slot_of.append(span)
            job_of.append(np.full(len(span), k))
            gpus_of.append(np.full(len(span), float(r.gpus)))
            type_of.append(np.full(len(span), r.type_index))
            rate_of.append(np.full(len(span), r.rate))
            for b in range(1, r.band + 1):
                band_row_of.append(block[(r.type_index, b)] * n_slots + span)
                band_col_of.append(col + np.arange(len(span)))
                band_val_of.append(np.full(len(span), float(r.gpus)))
            col += len(span)
    s = np.concatenate(slot_of)
    j = np.concatenate(job_of)
    n = np.concatenate(gpus_of)
    t = np.concatenate(type_of)
    progress = np.concatenate(rate_of) * lengths[s]
    nx = len(s)
    x = np.arange(nx)
    c_cols = nx + np.arange(n_jobs)
    # Rows: each job's share of each slot ≤ 1; each type's GPUs in each slot; each job's M + 1/(2ρ) ≤ C;
    # each band's GPUs in each slot.
    share_rows = j * n_slots + s
    gpu_rows = n_jobs * n_slots + t * n_slots + s
    busy_base = n_jobs * n_slots + n_types * n_slots
    band_base = busy_base + n_jobs
    none = np.zeros(0, dtype=np.int64)
    band_rows = band_base + (np.concatenate(band_row_of) if band_row_of else none)
    band_cols = np.concatenate(band_col_of) if band_col_of else none
    band_vals = np.concatenate(band_val_of) if band_val_of else np.zeros(0)
    c_rows = busy_base + np.arange(n_jobs)
    a_ub = coo_matrix(
        (
            np.concatenate([np.ones(nx), n, progress * starts[s], -np.ones(n_jobs), band_vals]),
            (
                np.concatenate([share_rows, gpu_rows, busy_base + j, c_rows, band_rows]),
                np.concatenate([x, x, x, c_cols, band_cols]),
            ),
        ),
        shape=(band_base + len(band_caps) * n_slots, nx + n_jobs),
    ).tocsr()
    b_ub = np.concatenate([
        np.ones(n_jobs * n_slots),
        np.repeat(np.array([float(counts[tt]) for tt in types]), n_slots),
        -0.5 / np.array(fastest),
        np.repeat(np.array(band_caps), n_slots),
    ])
    a_eq = coo_matrix((progress, (j, x)), shape=(n_jobs, nx + n_jobs)).tocsr()
    cost = np.concatenate([np.zeros(nx), np.ones(n_jobs)])
    finish = preemption.finish_s
    bounds = [(0.0, None)] * nx + [(lo, None) for lo in c_low]
    began = time.perf_counter()
    failed: list[str] = []
    for method in SOLVERS:
        res = linprog(
            cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(n_jobs), bounds=bounds, method=method
        )
        if res.status == 0:
            break
        failed.append(f"{method}: {res.message}")
    else:
        raise RuntimeError(f"the bound's LP did not solve ({'; '.join(failed)})")
    solve_s = time.perf_counter() - began
    total = float(res.fun) + finish * n_jobs - sum(jb.arrival_s for jb in jobs)
    return Bound(total / n_jobs, (end - t0) / slots, nx, solve_s, method)


# ----------------------------------------------------------------------------- a bench_sched report


def cell_name(c: dict[str, Any]) -> str:
    return f"{c['cluster']}:{c['load']:g}:{c['mapping']}"


def cell_jobs(
    c: dict[str, Any], trace: list[Any], clusters: dict[str, Cluster], source: sim_jobs.PlanSource
) -> list[SimJob]:
    """The jobs of one cell-window of a bench_sched report, made again the way bench_sched makes them, and
    checked against the report's own job list (ids and arrivals)."""
    window = split_window(trace, c["config_jobs"], c["seed"], c["split"])
    jobs, _ = sim_jobs.prepare_jobs(
        map_jobs(window, c["mapping"], c["seed"]), clusters[c["cluster"]], source,
        load=c["load"],
    )
    listed = next(iter(c["jobs_per_policy"].values()))
    mine = sorted((jb.job_id, round(jb.arrival_s, 3)) for jb in jobs)
    theirs = sorted((o["id"], round(o["arrival_s"], 3)) for o in listed)
    if mine != theirs:
        raise ReportMismatch(
            f"{cell_name(c)} seed {c['seed']}: the jobs made now differ from the report's "
            f"({len(mine)} against {len(theirs)}): the report comes from other code; rerun bench_sched"
        )
    return jobs


@functools.cache
def _inputs() -> tuple[list[Any], dict[str, Cluster], sim_jobs.PlanSource]:
    """The trace, the clusters and MARP's plan source (its plans cached across windows), made once per
    process: a worker solves several windows."""
    trace = parse_philly_csv((bench_sched.DATA / "philly.csv").read_text())
    return trace, bench_sched.clusters(False), sim_jobs.MarpPlanSource()


def solve_cell(task: tuple[dict[str, Any], int]) -> dict[str, Any]:
    c, slots = task
    trace, clusters, source = _inputs()
    jobs = cell_jobs(c, trace, clusters, source)
    horizon = max(
        o["finish_s"] for outs in c["jobs_per_policy"].values() for o in outs if o["state"] == "completed"
    )
    best = min(
        (p for p, v in c["policies"].items() if v["failed"] == 0), key=lambda p: c["policies"][p]["avg_jct_s"]
    )
    marks = [o["finish_s"] for o in c["jobs_per_policy"][best] if o["state"] == "completed"]
    b = lower_bound(jobs, clusters[c["cluster"]], horizon_s=horizon, slots=slots, marks=marks)
    return {
        "cell": cell_name(c),
        "seed": c["seed"],
        "bound": asdict(b),
        "limit_avg_jct_s": c["limit"]["avg_jct_s"],
        "policies": {p: v["avg_jct_s"] for p, v in c["policies"].items()},
        "completed_all": {p: v["failed"] == 0 for p, v in c["policies"].items()},
    }


def window_bound_s(r: dict[str, Any]) -> float:
    """A window's lower bound on the average JCT: the larger of the LP's and the alone limit."""
    return max(r["bound"]["avg_jct_s"], r["limit_avg_jct_s"])


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell (seed means, as bench_sched scores a cell): the bound, each policy's multiple of it, and how
    much of the gain over the best complete baseline any schedule could take."""
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_cell.setdefault(r["cell"], []).append(r)
    out = []
    for cell, rs in by_cell.items():
        bound = statistics.fmean(window_bound_s(r) for r in rs)
        pols = {p: statistics.fmean(r["policies"][p] for r in rs) for p in rs[0]["policies"]}
        complete = [p for p in BASELINES if p in pols and all(r["completed_all"][p] for r in rs)]
        best = min(complete, key=lambda p: pols[p]) if complete else None
        row: dict[str, Any] = {
            "cell": cell,
            "windows": len(rs),
            "bound_avg_jct_s": bound,
            "lp_avg_jct_s": statistics.fmean(r["bound"]["avg_jct_s"] for r in rs),
            "limit_avg_jct_s": statistics.fmean(r["limit_avg_jct_s"] for r in rs),
            "policies_avg_jct_s": pols,
            "x_bound": {p: v / bound for p, v in pols.items()},
            "below_bound": sorted(
                f"{p} seed {r['seed']}" for r in rs for p, v in r["policies"].items()
                if r["completed_all"][p] and v < window_bound_s(r) * (1 - 1e-9)
            ),
            "slot_s": max(r["bound"]["slot_s"] for r in rs),
            "solve_s": sum(r["bound"]["solve_s"] for r in rs),
        }
        if best is not None:
            row["best_baseline"] = best
            row["most_any_gain"] = 1.0 - bound / pols[best]
            if "frenzy" in pols:
                row["frenzy_gain"] = 1.0 - pols["frenzy"] / pols[best]
                gap = pols[best] - bound
                row["frenzy_share_of_possible"] = (pols[best] - pols["frenzy"]) / gap if gap > 0 else None
        out.append(row)
    return out


def print_table(cells: list[dict[str, Any]]) -> None:
    print(
        "\n| cell | windows | alone limit h | LP h | bound h | frenzy (x bound) | best baseline (x bound) "
        "| srtf-wide (x bound) | most any schedule gains over it | frenzy gains | share taken |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    def cellv(r: dict[str, Any], p: str | None) -> str:
        pols = r["policies_avg_jct_s"]
        if p is None or p not in pols:
            return "—"
        return f"{p} {pols[p] / 3600:.2f} ({r['x_bound'][p]:.2f})"

    for r in cells:
        share = r.get("frenzy_share_of_possible")
        print(
            f"| {r['cell']} | {r['windows']} | {r['limit_avg_jct_s'] / 3600:.2f} "
            f"| {r['lp_avg_jct_s'] / 3600:.2f} | {r['bound_avg_jct_s'] / 3600:.2f} "
            f"| {cellv(r, 'frenzy')} | {cellv(r, r.get('best_baseline'))} | {cellv(r, 'srtf-wide')} "
            f"| {r.get('most_any_gain', float('nan')):.1%} | {r.get('frenzy_gain', float('nan')):.1%} "
            f"| {'—' if share is None else f'{share:.0%}'} |"
        )
    for r in cells:
        if r["below_bound"]:
            print(f"ERROR {r['cell']}: below the bound: {', '.join(r['below_bound'])} (a modelling mismatch)")


def report_progress(results: Iterable[dict[str, Any]], total: int) -> list[dict[str, Any]]:
    rows = []
    for k, row in enumerate(results, 1):
        rows.append(row)
        b = row["bound"]
        print(
            f"[{k}/{total}] {row['cell']} seed {row['seed']}: bound {b['avg_jct_s'] / 3600:.2f} h "
            f"({b['variables']} variables, {b['solve_s']:.0f} s)", flush=True,
        )
    return rows


def render(path: Path) -> int:
    """Summarise a saved ``--json`` again from its windows (as this code summarises), print the table and
    rewrite the file's cells; 1 if a policy is below the bound, as a solving run."""
    try:
        body = json.loads(path.read_text())
        cells = summarise(body["windows"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"--render {path}: not a jct_bound --json ({e!r})") from None
    print_table(cells)
    body["cells"] = cells
    path.write_text(json.dumps(body, indent=1))
    return 1 if any(r["below_bound"] for r in cells) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="report", type=Path, help="a bench_sched.py --out JSON")
    src.add_argument(
        "--render", type=Path, default=None,
        help="a --json this script wrote: print its table again and rewrite its cells from its windows "
        "(no LP is solved)",
    )
    ap.add_argument(
        "--cells", nargs="*", default=None,
        help="cluster names or CLUSTER:LOAD:MAPPING cells to bound (default: every cell of the report)",
    )
    ap.add_argument("--slots", type=int, default=300, help="even time slots per window (default 300)")
    ap.add_argument(
        "--processes", type=int, default=2, help="windows solved at once (default 2; 1: in this process)"
    )
    ap.add_argument("--json", type=Path, default=None, help="write the per-window bounds and the cell table")
    args = ap.parse_args(argv)
    if args.slots < 1:
        ap.error("--slots must be at least 1")
    if args.render is not None:
        return render(args.render)
    try:
        report = json.loads(args.report.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"--from {args.report}: {e}") from None
    config = report.get("config", {})
    tasks = []
    for c in report.get("jct_cells", []):
        if args.cells and c["cluster"] not in args.cells and cell_name(c) not in args.cells:
            continue
        if "jobs_per_policy" not in c:
            raise SystemExit(f"--from {args.report}: {cell_name(c)} has no per-job list; rerun bench_sched")
        task = dict(c, config_jobs=config.get("jobs", 160))
        task.setdefault("split", config.get("split", "validation"))
        tasks.append((task, args.slots))
    if not tasks:
        raise SystemExit("no cell to bound (check --cells against the report's cells)")
    began = time.perf_counter()
    try:
        if args.processes <= 1:
            results = map(solve_cell, tasks)
            rows = report_progress(results, len(tasks))
        else:
            with get_context("spawn").Pool(args.processes) as pool:
                rows = report_progress(pool.imap_unordered(solve_cell, tasks), len(tasks))
    except ReportMismatch as e:
        raise SystemExit(f"--from {args.report}: {e}") from None
    rows.sort(key=lambda r: (r["cell"], r["seed"]))
    cells = summarise(rows)
    print_table(cells)
    if args.json:
        args.json.write_text(json.dumps({
            "from": str(args.report), "report_commit": report.get("git_commit"), "split": config.get("split"),
            "slots": args.slots, "wall_s": time.perf_counter() - began, "cells": cells, "windows": rows,
        }, indent=1))
    return 1 if any(r["below_bound"] for r in cells) else 0


if __name__ == "__main__":
    raise SystemExit(main())
