"""Benchmark HAS against Sia, Gavel and FIFO: a JCT grid and a decision-overhead sweep.

JCT grid: seeds × clusters (the shipped lab pool; a seeded 64-GPU slice of
Alibaba's node list with its real type mix) × loads × mapping rules; every
policy runs on the same jobs in one process.  Every cell is printed, the
losses too, each policy's average JCT also as a multiple of the ``limit``
(every job alone on its fastest feasible plan).

Overhead sweep: one decision of every policy (a fresh instance) on the very
same cluster snapshot, pool 16 → 4096 GPUs and queue 10 → 1000 jobs, half the
pool busy with running jobs.  Sia's solve is capped (``--sia-time-limit``);
cap hits are reported, not skipped.

    PYTHONPATH=. python scripts/bench_sched.py --out bench_sched.json
    PYTHONPATH=. python scripts/bench_sched.py --tiny --out /tmp/bench_sched_tiny.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchmeta import provenance, write_results  # noqa: E402

from frenzyd.gpu_types import GPU_TYPES  # noqa: E402
from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, RunningJob, Snapshot  # noqa: E402
from frenzyd.has.registry import load_policy  # noqa: E402
from frenzyd.sim import jobs as sim_jobs  # noqa: E402
from frenzyd.sim.cluster import alibaba_cluster, parse_cluster_toml  # noqa: E402
from frenzyd.sim.mapping import map_jobs  # noqa: E402
from frenzyd.sim.model import percentile  # noqa: E402
from frenzyd.sim.run import run_policies  # noqa: E402
from frenzyd.sim.simulator import _State  # noqa: E402
from frenzyd.sim.trace import busy_window, parse_philly_csv  # noqa: E402

DATA = ROOT / "frenzyd" / "sim" / "data"
POLICIES = ("frenzy", "sia", "gavel", "fifo")
BASELINES = ("sia", "gavel", "fifo")
TUNING_SEEDS = frozenset({0, *range(13, 19), *range(31, 51)})
"""Seeds Frenzy was tuned on (its constants on 0, its rules on 0 and 13-18, the starvation move also checked
on 31-50); the others are held out."""
SWEEP_TYPES = ("T4", "RTX-3090", "RTX-A6000", "A100-40GB", "A100-80GB")


def log(msg: str) -> None:
    print(f"[bench_sched {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- JCT grid


def clusters(tiny: bool) -> dict[str, Cluster]:
    lab = parse_cluster_toml((DATA / "lab.toml").read_text())
    ali = alibaba_cluster((DATA / "alibaba-openb-gpu-nodes.csv").read_text(), target_gpus=64, seed=0)
    return {"lab-20": lab, "alibaba-64": ali}


def jct_grid(args: argparse.Namespace, source: Any) -> list[dict[str, Any]]:
    trace = parse_philly_csv((DATA / "philly.csv").read_text())
    cells: list[dict[str, Any]] = []
    for cname, cluster in clusters(args.tiny).items():
        for load in args.loads:
            for mapping in args.mappings:
                for seed in args.seed_list:
                    t0 = time.perf_counter()
                    window = busy_window(trace, args.jobs, seed)
                    jobs, dropped = sim_jobs.prepare_jobs(
                        map_jobs(window, mapping, seed), cluster, source, load=load
                    )
                    policies = [load_policy(p, sia_time_limit_s=args.sia_time_limit) for p in POLICIES]
                    body, results = run_policies(policies, jobs, cluster, seed=seed, clock=time.perf_counter)
                    # Average JCT over the jobs every policy completed (FIFO drops jobs it cannot fit).
                    done = [
                        {o.job_id: o.end_s - o.arrival_s for o in r.outcomes if o.state == "completed"}
                        for r in results
                    ]
                    common_ids = set.intersection(*(set(d) for d in done)) if done else set()
                    common: dict[str, float] = {"jobs": len(common_ids)}
                    for r, d in zip(results, done, strict=True):
                        common[r.name] = statistics.fmean(d[k] for k in common_ids) if common_ids else 0.0
                    # Frenzy against each baseline on the jobs both completed: a baseline that fails
                    # jobs (FIFO, out of memory) is not credited with dropping its longest jobs.
                    ours = done[POLICIES.index("frenzy")]
                    paired = {
                        r.name: paired_stats(ours, d)
                        for r, d in zip(results, done, strict=True)
                        if r.name != "frenzy"
                    }
                    cell = {
                        "cluster": cname,
                        "gpus": len(cluster.gpus),
                        "load": load,
                        "mapping": mapping,
                        "seed": seed,
                        "jobs": len(jobs),
                        "dropped_infeasible": dropped,
                        "wall_s": time.perf_counter() - t0,
                        **body,
                        "common_completed_avg_jct_s": common,
                        "paired": paired,
                    }
                    cells.append(cell)
                    pol = cell["policies"]
                    log(
                        f"{cname} load={load:g} {mapping} seed={seed}: "
                        + ", ".join(f"{n} {pol[n]['avg_jct_s'] / 3600:.2f}h" for n in POLICIES)
                        + f" ({cell['wall_s']:.0f}s)"
                    )
    return cells


def paired_stats(ours: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    """Average and p99 JCT of Frenzy and one baseline over the jobs both completed."""
    ids = sorted(set(ours) & set(theirs))
    a = sorted(ours[k] for k in ids)
    b = sorted(theirs[k] for k in ids)
    return {
        "jobs": len(ids),
        "frenzy_avg_jct_s": statistics.fmean(a) if a else 0.0,
        "base_avg_jct_s": statistics.fmean(b) if b else 0.0,
        "frenzy_p99_jct_s": percentile(a, 99),
        "base_p99_jct_s": percentile(b, 99),
    }


def paired_summary(cs: list[dict[str, Any]]) -> dict[str, Any]:
    """Seed means of :func:`paired_stats` per baseline; the target must hold against every one."""
    per: dict[str, dict[str, float]] = {}
    for b in BASELINES:
        f_avg = statistics.fmean(c["paired"][b]["frenzy_avg_jct_s"] for c in cs)
        b_avg = statistics.fmean(c["paired"][b]["base_avg_jct_s"] for c in cs)
        f_p99 = statistics.fmean(c["paired"][b]["frenzy_p99_jct_s"] for c in cs)
        b_p99 = statistics.fmean(c["paired"][b]["base_p99_jct_s"] for c in cs)
        per[b] = {
            "jobs": statistics.fmean(c["paired"][b]["jobs"] for c in cs),
            "frenzy_gain": 1.0 - f_avg / b_avg if b_avg else 0.0,
            "frenzy_p99_ratio": f_p99 / b_p99 if b_p99 else 0.0,
        }
    hardest = min(BASELINES, key=lambda b: per[b]["frenzy_gain"])
    worst_p99 = max(BASELINES, key=lambda b: per[b]["frenzy_p99_ratio"])
    return {
        "per_baseline": per,
        "hardest": hardest,
        "min_gain": per[hardest]["frenzy_gain"],
        "worst_p99": worst_p99,
        "max_p99_ratio": per[worst_p99]["frenzy_p99_ratio"],
        "meets_18pct": per[hardest]["frenzy_gain"] >= 0.18 and per[worst_p99]["frenzy_p99_ratio"] <= 1.0,
    }


def as_worded(cs: list[dict[str, Any]]) -> dict[str, Any]:
    """The target as the issue words it, over seed means: Frenzy against the baseline with the lowest
    average JCT (each policy averaged over the jobs it completed), and against that baseline's p99."""
    mean = {
        p: {k: statistics.fmean(c["policies"][p][k] for c in cs) for k in ("avg_jct_s", "p99_jct_s")}
        for p in POLICIES
    }
    best = min(BASELINES, key=lambda p: mean[p]["avg_jct_s"])
    gain = 1.0 - mean["frenzy"]["avg_jct_s"] / mean[best]["avg_jct_s"]
    p99 = mean["frenzy"]["p99_jct_s"] / mean[best]["p99_jct_s"]
    out = {
        "best_baseline": best,
        "frenzy_gain_vs_best": gain,
        "frenzy_p99_vs_best": p99,
        "meets_18pct": gain >= 0.18 and p99 <= 1.0,
    }
    if all("p99_jct_s" in c["limit"] for c in cs):
        # The least p99 ratio any policy that completes every job can reach: each job's JCT is at
        # least its time alone on its fastest plan, so the p99 is at least the limit's p99.
        floor = statistics.fmean(c["limit"]["p99_jct_s"] for c in cs)
        out["limit_p99_s"] = floor
        out["p99_floor_vs_best"] = floor / mean[best]["p99_jct_s"]
    return out


def summarise_grid(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seed means per (cluster, load, mapping) and Frenzy's gain over the best baseline."""
    groups: dict[tuple[str, float, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["cluster"], c["load"], c["mapping"]), []).append(c)
    rows = []
    for (cname, load, mapping), cs in groups.items():
        row: dict[str, Any] = {"cluster": cname, "load": load, "mapping": mapping, "seeds": len(cs)}
        for p in POLICIES:
            row[p] = {
                k: statistics.fmean(c["policies"][p][k] for c in cs)
                for k in ("avg_jct_s", "p99_jct_s", "makespan_s", "utilization", "failed", "restarts")
            }
            row[p]["x_limit"] = statistics.fmean(
                c["policies"][p]["avg_jct_s"] / c["limit"]["avg_jct_s"] for c in cs
            )
        row.update(as_worded(cs))
        # The same comparison on the jobs every policy completed (a baseline that fails jobs drops them).
        common = {p: statistics.fmean(c["common_completed_avg_jct_s"][p] for c in cs) for p in POLICIES}
        best_c = min(BASELINES, key=lambda p: common[p])
        row["common_completed"] = {
            "jobs": statistics.fmean(c["common_completed_avg_jct_s"]["jobs"] for c in cs),
            **common,
            "best_baseline": best_c,
            "frenzy_gain_vs_best": 1.0 - common["frenzy"] / common[best_c] if common[best_c] else 0.0,
        }
        row["paired"] = paired_summary(cs)
        # The same comparison on the seeds Frenzy was not tuned on (TUNING_SEEDS).
        held = [c for c in cs if c["seed"] not in TUNING_SEEDS]
        if held:
            row["held_out"] = {"seeds": sorted(c["seed"] for c in held), **as_worded(held)}
            row["held_out_paired"] = paired_summary(held)
        rows.append(row)
    return rows


def print_grid(rows: list[dict[str, Any]]) -> None:
    print("\nJCT grid (seed means; avg JCT in hours, x = multiple of the limit; p99 in hours)")
    head = f"{'cluster':<11}{'load':>5} {'mapping':<8}"
    for p in POLICIES:
        head += f"{p + ' avg':>12}{'x':>6}{'p99':>7}"
    head += f"{'best base':>10}{'gain':>7}{'p99 ratio':>10}{'fail f/s/g/fifo':>17}{'common gain':>12}"
    head += f"{'held-out gain, p99':>20}{'paired: min gain, max p99':>27}"
    print(head)
    for r in rows:
        line = f"{r['cluster']:<11}{r['load']:>5g} {r['mapping']:<8}"
        for p in POLICIES:
            line += (
                f"{r[p]['avg_jct_s'] / 3600:>12.2f}{r[p]['x_limit']:>6.2f}{r[p]['p99_jct_s'] / 3600:>7.2f}"
            )
        fails = "/".join(f"{r[p]['failed']:.0f}" for p in POLICIES)
        line += (
            f"{r['best_baseline']:>10}{r['frenzy_gain_vs_best'] * 100:>6.1f}%{r['frenzy_p99_vs_best']:>10.2f}"
        )
        line += f"{fails:>17}"
        cc = r["common_completed"]
        line += f"{cc['frenzy_gain_vs_best'] * 100:>7.1f}% {cc['best_baseline']}"
        if "held_out" in r:
            ho = r["held_out"]
            line += f"{ho['frenzy_gain_vs_best'] * 100:>9.1f}% {ho['frenzy_p99_vs_best']:.2f}"
        pr = r["paired"]
        line += f"{pr['min_gain'] * 100:>9.1f}% {pr['hardest']:<5}"
        line += f" {pr['max_p99_ratio']:.2f} {pr['worst_p99']}"
        print(line)
    print(
        "gain = 1 - frenzy avg JCT / best baseline avg JCT (seed means); p99 ratio = frenzy p99 / that "
        "baseline's p99;\ncommon gain = the same on the jobs every policy completed (FIFO fails jobs it "
        "cannot fit, which shortens its own average);\nheld-out = the same over the seeds Frenzy was not "
        f"tuned on (not {seed_ranges(TUNING_SEEDS)});\n"
        "paired = Frenzy against each baseline on the jobs both completed: the smallest gain and the "
        "largest p99 ratio over the baselines."
    )
    n = len(rows)
    met = sum(r["meets_18pct"] for r in rows)
    met_p = sum(r["paired"]["meets_18pct"] for r in rows)
    line = f"target (>= 18 % lower avg JCT, p99 no worse): {met}/{n} cells vs the best baseline, "
    line += f"{met_p}/{n} paired"
    if all("held_out" in r for r in rows):
        met_h = sum(r["held_out"]["meets_18pct"] for r in rows)
        met_hp = sum(r["held_out_paired"]["meets_18pct"] for r in rows)
        line += f"; held-out seeds: {met_h}/{n} and {met_hp}/{n}"
    print(line)
    for r in rows:
        if r.get("p99_floor_vs_best", 0.0) > 1.0:
            print(
                f"  {r['cluster']} load {r['load']:g} {r['mapping']}: no policy that completes every job can "
                f"match {r['best_baseline']}'s p99 ({r[r['best_baseline']]['p99_jct_s'] / 3600:.2f} h): "
                f"the jobs alone on their fastest plans already have a p99 of {r['limit_p99_s'] / 3600:.2f} h"
            )


# ----------------------------------------------------------------------------- overhead sweep


def sweep_cluster(n_gpus: int) -> Cluster:
    """``n_gpus`` GPUs on 4-GPU peers, types cycling over five lab types."""
    gpus = []
    used: dict[str, GpuTypeSpec] = {}
    for k in range(max(1, n_gpus // 4)):
        t = SWEEP_TYPES[k % len(SWEEP_TYPES)]
        info = GPU_TYPES[t]
        used[t] = GpuTypeSpec(t, info.memory_bytes, info.speed)
        gpus += [Gpu(f"peer-{k:04d}", i, t) for i in range(4)]
    return Cluster(types=tuple(used[t] for t in sorted(used)), gpus=tuple(sorted(gpus)))


def sweep_snapshot(cluster: Cluster, queue: int, source: Any, trace: Any, seed: int) -> Snapshot:
    """Half the pool busy with running jobs (placed by first fit on their fastest plan), ``queue`` queued."""
    window = busy_window(trace, 200, seed)
    llm = map_jobs(window, "gputime", seed)
    need = queue + len(cluster.gpus)  # enough jobs to fill half the pool and the queue
    many = [
        type(j)(
            f"s{i:05d}", float(i), j.requested_gpus, j.model, j.seq_len, j.global_batch, j.trace_duration_s
        )
        for i, j in zip(range(need), (llm[k % len(llm)] for k in range(need)), strict=False)
    ]
    jobs, _ = sim_jobs.prepare_jobs(many, cluster, source, max_gpus=64)
    free = {g.gpu_type: sorted(g2 for g2 in cluster.gpus if g2.gpu_type == g.gpu_type) for g in cluster.gpus}
    target = len(cluster.gpus) // 2
    busy = 0
    running: list[RunningJob] = []
    rest = []
    for j in jobs:
        placed = False
        if busy < target:
            for p in sorted(j.plans, key=lambda p: p.gpus):
                pool = free[p.gpu_type]
                if p.tp == 1 and len(pool) >= p.gpus and p.gpus <= 8:
                    gs = tuple(pool[: p.gpus])
                    del pool[: p.gpus]
                    busy += p.gpus
                    st = _State(job=j, remaining=j.total_steps / 2, requested=j.requested_gpus)
                    speed = cluster.type_spec(p.gpu_type).speed
                    step = j.speed.step_time_s(p, speed, len({g.peer for g in gs}))  # as the simulator
                    running.append(RunningJob(st.view(), p, gs, j.arrival_s, step_time_s=step))
                    placed = True
                    break
        if not placed:
            rest.append(j)
    queued = tuple(
        _State(job=j, remaining=j.total_steps, requested=j.requested_gpus).view() for j in rest[:queue]
    )
    free_all = tuple(sorted(g for pool in free.values() for g in pool))
    now = float(need) + 3600.0
    return Snapshot(now, "arrival", cluster, free_all, queued, tuple(running))


def overhead_sweep(args: argparse.Namespace, source: Any) -> list[dict[str, Any]]:
    trace = parse_philly_csv((DATA / "philly.csv").read_text())
    out = []
    # Warm every policy's code path once (first calls pay interpreter and import warm-up).
    warm = sweep_snapshot(sweep_cluster(16), 10, source, trace, seed=0)
    for p in POLICIES:
        load_policy(p, sia_time_limit_s=args.sia_time_limit).decide(warm, random.Random(0))
    for n_gpus in args.pool_sizes:
        cluster = sweep_cluster(n_gpus)
        for queue in args.queue_sizes:
            snap = sweep_snapshot(cluster, queue, source, trace, seed=0)
            row: dict[str, Any] = {
                "gpus": len(cluster.gpus),
                "queued": len(snap.queued),
                "running": len(snap.running),
                "policies": {},
            }
            for p in POLICIES:
                reps = args.reps  # the same for every policy (Sia's largest solves add ~30 s in all)
                times = []
                timeouts = 0
                placed = 0
                warm_times = []
                for _ in range(reps):
                    pol = load_policy(p, sia_time_limit_s=args.sia_time_limit)
                    t0 = time.perf_counter()
                    d = pol.decide(snap, random.Random(0))
                    times.append(time.perf_counter() - t0)
                    timeouts += d.solver_timeouts
                    placed = len(d.placements)
                    # The same snapshot again on the same object: what a policy that keeps state between
                    # events (Frenzy caches each job's plan ranking) pays per round in the simulator.
                    t0 = time.perf_counter()
                    d2 = pol.decide(snap, random.Random(0))
                    warm_times.append(time.perf_counter() - t0)
                    timeouts += d2.solver_timeouts
                row["policies"][p] = {
                    "median_ms": statistics.median(times) * 1e3,
                    "warm_median_ms": statistics.median(warm_times) * 1e3,
                    "reps": reps,
                    "solver_timeouts": timeouts,
                    "placements": placed,
                }
            out.append(row)
            log(
                f"overhead {row['gpus']} GPUs, {row['queued']} queued, {row['running']} running: "
                + ", ".join(f"{p} {row['policies'][p]['median_ms']:.1f}ms" for p in POLICIES)
            )
    return out


def growth(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Least-squares exponents a, b of ``time ≈ c · gpus^a · queue^b`` per policy."""
    out = {}
    for p in POLICIES:
        pts = [
            (
                math.log(r["gpus"]),
                math.log(max(1, r["queued"])),
                math.log(max(r["policies"][p]["median_ms"], 1e-6)),
            )
            for r in rows
        ]
        if len(pts) < 3:
            out[p] = {"gpus_exponent": float("nan"), "queue_exponent": float("nan")}
            continue
        import numpy as np

        a = np.array([[x, y, 1.0] for x, y, _ in pts])
        b = np.array([z for _, _, z in pts])
        coef, *_ = np.linalg.lstsq(a, b, rcond=None)
        out[p] = {"gpus_exponent": float(coef[0]), "queue_exponent": float(coef[1])}
    return out


def print_sweep(rows: list[dict[str, Any]], grow: dict[str, dict[str, float]]) -> None:
    print(
        "\nDecision time per round on identical snapshots (ms, median, a fresh policy object; "
        "warm = the same snapshot again on that object; Sia: solver cap hits in brackets)"
    )
    head = (
        f"{'GPUs':>6}{'queued':>8}{'running':>8}"
        + "".join(f"{p:>14}" for p in POLICIES)
        + f"{'sia/frenzy':>12}"
    )
    print(head)
    for r in rows:
        line = f"{r['gpus']:>6}{r['queued']:>8}{r['running']:>8}"
        for p in POLICIES:
            cell = f"{r['policies'][p]['median_ms']:.2f}"
            if r["policies"][p]["solver_timeouts"]:
                cell += f" [{r['policies'][p]['solver_timeouts']}]"
            line += f"{cell:>14}"
        ratio = r["policies"]["sia"]["median_ms"] / max(r["policies"]["frenzy"]["median_ms"], 1e-9)
        line += f"{ratio:>11.0f}x"
        fw, sw = r["policies"]["frenzy"]["warm_median_ms"], r["policies"]["sia"]["warm_median_ms"]
        line += f"{fw:>13.2f}{sw:>10.2f}{sw / max(fw, 1e-9):>16.0f}x"
        print(line)
    print(
        "growth exponents (time ~ gpus^a * queue^b): "
        + ", ".join(f"{p} a={g['gpus_exponent']:.2f} b={g['queue_exponent']:.2f}" for p, g in grow.items())
    )


def _worded_cells(w: dict[str, Any]) -> tuple[str, str]:
    """'x % vs B' and the p99 ratio of an :func:`as_worded` result (a miss in italics)."""
    gain = f"{w['frenzy_gain_vs_best'] * 100:.1f} % vs {w['best_baseline']}"
    gain = gain if w["frenzy_gain_vs_best"] >= 0.18 else f"*{gain}*"
    ratio = f"{w['frenzy_p99_vs_best']:.2f}"
    if w["frenzy_p99_vs_best"] > 1.0:
        ratio = f"*{ratio}*"
        if "p99_floor_vs_best" in w:  # the least ratio a policy that completes every job can reach
            ratio += f" (≥ {w['p99_floor_vs_best']:.2f} for any)"
    return gain, ratio


def _paired_cell(pr: dict[str, Any]) -> str:
    """'x % vs B, y vs C': the least gain and worst p99 ratio over the baselines (a miss in italics)."""
    gain = f"{pr['min_gain'] * 100:.1f} % vs {pr['hardest']}"
    gain = gain if pr["min_gain"] >= 0.18 else f"*{gain}*"
    ratio = f"{pr['max_p99_ratio']:.2f} vs {pr['worst_p99']}"
    ratio = ratio if pr["max_p99_ratio"] <= 1.0 else f"*{ratio}*"
    return f"{gain}, {ratio}"


def markdown(result: dict[str, Any]) -> str:
    """The README's tables from a result object (a miss of a target in italics)."""
    out: list[str] = []
    if "jct_summary" in result:
        out += [
            "| cluster | load | mapping | frenzy (×L) | sia (×L) | gavel (×L) | fifo (×L) "
            "| p99 frenzy / sia / gavel / fifo | failed f/s/g/fifo | gain vs best baseline | p99 ratio "
            "| gain on jobs all completed | held-out seeds: gain, p99 ratio "
            "| paired: least gain, worst p99 ratio | paired, held-out |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in result["jct_summary"]:
            best_avg = min(r[p]["avg_jct_s"] for p in POLICIES)
            cells = []
            for p in POLICIES:
                v = f"{r[p]['avg_jct_s'] / 3600:.2f}"
                cells.append(
                    (f"**{v}**" if r[p]["avg_jct_s"] == best_avg else v) + f" ({r[p]['x_limit']:.2f})"
                )
            p99 = " / ".join(f"{r[p]['p99_jct_s'] / 3600:.2f}" for p in POLICIES)
            fails = "/".join(f"{r[p]['failed']:.0f}" for p in POLICIES)
            gain, ratio = _worded_cells(r)
            cc = r["common_completed"]
            common = f"{cc['frenzy_gain_vs_best'] * 100:.1f} % vs {cc['best_baseline']}"
            held = ", ".join(_worded_cells(r["held_out"])) if "held_out" in r else "–"
            paired = [_paired_cell(r[k]) if k in r else "–" for k in ("paired", "held_out_paired")]
            out.append(
                f"| {r['cluster']} | {r['load']:g} | {r['mapping']} | "
                + " | ".join(cells)
                + f" | {p99} | {fails} | {gain} | {ratio} | {common} | {held} | {paired[0]} | {paired[1]} |"
            )
        out.append("")
    if "overhead" in result:
        out += [
            "| GPUs | queued | running | frenzy | sia | gavel | fifo | sia / frenzy | frenzy warm "
            "| sia / frenzy warm |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["overhead"]:
            pol = r["policies"]
            need = {64: 10, 1024: 100}.get(r["gpus"], 0)  # the targets: 10x at 64 GPUs, 100x at 1,024
            ratio = pol["sia"]["median_ms"] / max(pol["frenzy"]["median_ms"], 1e-9)
            warm = pol["sia"]["warm_median_ms"] / max(pol["frenzy"]["warm_median_ms"], 1e-9)

            def mark(x: float, need: int = need) -> str:
                return f"{x:.0f}x" if x >= need else f"*{x:.0f}x*"

            times = []
            for p in POLICIES:
                t = f"{pol[p]['median_ms']:.2f}"
                if pol[p]["solver_timeouts"]:
                    t += f" [{pol[p]['solver_timeouts']}]"
                times.append(t)
            out.append(
                f"| {r['gpus']} | {r['queued']} | {r['running']} | "
                + " | ".join(times)
                + f" | {mark(ratio)} | {pol['frenzy']['warm_median_ms']:.2f} | {mark(warm)} |"
            )
        out.append("")
    return "\n".join(out)


def seed_ranges(seeds: Iterable[int]) -> str:
    """``0, 13-18, 31-50``: sorted seeds, runs of consecutive ones as ranges (the inverse of parse_seeds)."""
    runs: list[list[int]] = []
    for s in sorted(seeds):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_seeds(text: str) -> list[int]:
    """'19-30' or '1,4,7' (or both, '0,19-21') as a sorted list of distinct seeds."""
    seeds: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            seeds.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give seeds as 19-30 or 1,4,7") from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least one seed, none negative")
    return sorted(seeds)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tiny", action="store_true", help="CI size: one seed, one load and mapping, small sweep"
    )
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    ap.add_argument("--jobs", type=int, default=None, help="jobs per simulation (default 160; tiny 30)")
    ap.add_argument(
        "--sia-time-limit", type=float, default=None, help="seconds per Sia solve (default 10; tiny 2)"
    )
    ap.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="seeds 0..N-1 per cell (default 13; tiny 1)",
    )
    ap.add_argument(
        "--seed-list",
        type=parse_seeds,
        default=None,
        metavar="LIST",
        help="these seeds instead, e.g. 19-30 or 1,4,7 (Frenzy was tuned on 0 and 13-18)",
    )
    ap.add_argument("--markdown", type=Path, help="also write the README's two tables (markdown) here")
    ap.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS",
        help="run nothing: summarise a saved --out file again and write --markdown from it",
    )
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args(argv)
    if args.render is not None:
        saved = json.loads(args.render.read_text())
        if "jct_cells" in saved:
            saved["jct_summary"] = summarise_grid(saved["jct_cells"])
        text = markdown(saved)
        if args.markdown:
            args.markdown.write_text(text)
            log(f"wrote {args.markdown} from {args.render}")
        else:
            print(text)
        return 0
    if args.tiny:
        args.seeds, args.loads, args.mappings = args.seeds or 1, [1.0], ["gpus"]
        args.jobs = args.jobs or 30
        args.pool_sizes, args.queue_sizes, args.reps = [16, 64], [10, 100], 1
        args.sia_time_limit = args.sia_time_limit or 2.0
    else:
        args.seeds, args.loads, args.mappings = args.seeds or 13, [1.0, 2.0], ["gpus", "gputime"]
        args.jobs = args.jobs or 160
        args.pool_sizes, args.queue_sizes, args.reps = [16, 64, 256, 1024, 4096], [10, 100, 1000], 5
        args.sia_time_limit = args.sia_time_limit or 10.0
    if args.seed_list is None:
        args.seed_list = list(range(args.seeds))
    prov = provenance()
    source = sim_jobs.MarpPlanSource()
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "config": {
            "tiny": args.tiny,
            "jobs": args.jobs,
            "seeds": args.seed_list,
            "tuning_seeds": sorted(TUNING_SEEDS),
            "loads": args.loads,
            "mappings": args.mappings,
            "sia_time_limit_s": args.sia_time_limit,
            "pool_sizes": args.pool_sizes,
            "queue_sizes": args.queue_sizes,
        },
    }
    if not args.skip_grid:
        cells = jct_grid(args, source)
        rows = summarise_grid(cells)
        print_grid(rows)
        result["jct_cells"] = cells
        result["jct_summary"] = rows
    if not args.skip_sweep:
        sweep = overhead_sweep(args, source)
        grow = growth(sweep)
        print_sweep(sweep, grow)
        result["overhead"] = sweep
        result["overhead_growth"] = grow
    result["wall_s"] = time.perf_counter() - t0
    print(f"\ntotal {result['wall_s']:.0f} s")
    if args.out:
        write_results(args.out, result, prov)
        log(f"wrote {args.out}")
    if args.markdown:
        args.markdown.write_text(markdown(result))
        log(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
