"""``frenzy-client simulate``: replay a trace window on a cluster under several policies, side by side."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from frenzyd.errors import ConfigError
from frenzyd.has.interface import Cluster
from frenzyd.has.registry import BUILTIN, load_policy
from frenzyd.has.sia import DEFAULT_TIME_LIMIT_S
from frenzyd.sim.cluster import alibaba_cluster, parse_cluster_toml
from frenzyd.sim.jobs import MarpPlanSource, prepare_jobs
from frenzyd.sim.mapping import MAPPINGS, map_jobs
from frenzyd.sim.run import run_policies
from frenzyd.sim.trace import parse_philly_csv, split_window

DEFAULT_POLICIES = ("frenzy", "sia", "gavel", "fifo", "tiresias", "srtf", "srtf-wide")
OPEN_SPLITS = ("tune", "validation")
"""Trace splits ``simulate`` draws from; the test split is for ``scripts/bench_sched.py --final`` only."""


def data_path(name: str) -> str:
    """Path of a data file shipped in ``frenzyd/sim/data``."""
    return str(resources.files("frenzyd.sim").joinpath("data", name))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="compare scheduling policies on a trace window and a cluster (offline)",
        description=(
            "Sample a busy window of a job trace, turn its jobs into LLM training jobs, and run every "
            "--policy on the same jobs and cluster in a discrete-event simulator. Defaults use the data "
            "shipped in frenzyd/sim/data (Philly trace, lab pool)."
        ),
    )
    p.add_argument(
        "--trace", default=data_path("philly.csv"), help="Philly-format trace CSV (default: the shipped one)"
    )
    p.add_argument(
        "--cluster",
        default=data_path("lab.toml"),
        help="cluster TOML, or Alibaba's GPU node list CSV (default: shipped lab.toml, 20 GPUs)",
    )
    p.add_argument(
        "--policy",
        action="append",
        metavar="NAME_OR_MODULE:ATTR",
        help=f"policy to run (repeatable): {', '.join(BUILTIN)} or module:attr (default: all seven)",
    )
    p.add_argument("--jobs", type=int, default=200, help="jobs sampled from a busy window (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the window, the mapping and the policies")
    p.add_argument("--load", type=float, default=1.0, help="multiplies the arrival rate (default 1.0)")
    p.add_argument("--mapping", default="gpus", choices=sorted(MAPPINGS), help="trace job -> LLM job rule")
    p.add_argument(
        "--alibaba-gpus",
        type=int,
        default=64,
        help="for an Alibaba CSV: GPUs in the seeded subsample with the real type mix (0 = all nodes)",
    )
    p.add_argument(
        "--sia-time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        help=f"seconds per Sia ILP solve before the incumbent is taken (default {DEFAULT_TIME_LIMIT_S:g})",
    )
    p.add_argument(
        "--split",
        default="tune",
        choices=OPEN_SPLITS,
        help="trace part to draw the window from: tune (first 60 %% by time, default) or validation "
        "(next 20 %%); the last 20 %% is the test split, run only by scripts/bench_sched.py --final",
    )
    p.add_argument(
        "--per-job",
        action="store_true",
        help="also list every job per policy: id, arrival, start, finish, JCT, restarts, GPU types "
        "(the JSON gets a 'jobs' list per policy)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (DESIGN.md §6)")
    p.set_defaults(handler=_run)


def read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} {path!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the {what} {path!r} is not UTF-8 text: {exc}") from exc


def load_cluster(path: str, *, alibaba_gpus: int, seed: int) -> Cluster:
    """A cluster from a TOML file or an Alibaba node-list CSV (subsampled to ``alibaba_gpus``)."""
    text = read_text(path, "cluster file")
    if path.endswith(".csv") or text.startswith("sn,"):
        return alibaba_cluster(text, target_gpus=alibaba_gpus or None, seed=seed)
    return parse_cluster_toml(text)


def simulate_command(args: argparse.Namespace, *, progress: bool) -> dict[str, object]:
    """Everything ``simulate`` does, returning the JSON object (also used by the benchmark)."""
    if args.jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    cluster = load_cluster(args.cluster, alibaba_gpus=args.alibaba_gpus, seed=args.seed)
    trace = parse_philly_csv(read_text(args.trace, "trace"))
    window = split_window(trace, args.jobs, args.seed, args.split)
    llm = map_jobs(window, args.mapping, args.seed)
    jobs, dropped = prepare_jobs(llm, cluster, MarpPlanSource(), load=args.load)
    if not jobs:
        raise ConfigError("no sampled job fits this cluster's memory: try another --cluster or --mapping")
    policies = [load_policy(s, sia_time_limit_s=args.sia_time_limit) for s in args.policy or DEFAULT_POLICIES]

    def report(msg: str) -> None:
        print(f"simulate: {msg}", file=sys.stderr, flush=True)

    body, results = run_policies(
        policies,
        jobs,
        cluster,
        seed=args.seed,
        clock=time.perf_counter,
        progress=report if progress else None,
    )
    out: dict[str, object] = {
        "run": {
            "trace": args.trace,
            "cluster": args.cluster,
            "jobs": len(jobs),
            "seed": args.seed,
            "load": args.load,
            "mapping": args.mapping,
            "split": args.split,
            "gpus": len(cluster.gpus),
            "dropped_infeasible": dropped,
        },
        **body,
    }
    if getattr(args, "per_job", False):
        out["jobs"] = {r.name: [o.as_json() for o in r.outcomes] for r in results}
    return out


def render(result: dict[str, Any]) -> str:
    """A readable table of the ``simulate`` JSON object."""
    run = result["run"]
    limit = result["limit"]["avg_jct_s"]
    lines = [
        f"{run['jobs']} jobs (seed {run['seed']}, load {run['load']:g}, mapping {run['mapping']}) "
        f"on {run['gpus']} GPUs; limit avg JCT {limit / 3600:.2f} h"
        + (f", p99 {result['limit']['p99_jct_s'] / 3600:.2f} h" if "p99_jct_s" in result["limit"] else "")
        + (f"; {run['dropped_infeasible']} sampled jobs fit nowhere" if run["dropped_infeasible"] else ""),
        f"{'policy':<16}{'avg JCT h':>10}{'x limit':>8}{'p50 h':>8}{'p99 h':>8}{'queue h':>8}"
        f"{'makespan h':>11}{'util':>6}{'done':>6}{'fail':>5}{'OOM':>5}{'restarts':>9}{'timeouts':>9}"
        f"{'dec ms p50':>11}{'p95':>8}{'max':>8}",
    ]
    for name, p in result["policies"].items():
        d = p["decision_ms"]
        lines.append(
            f"{name:<16}{p['avg_jct_s'] / 3600:>10.2f}{p['avg_jct_s'] / limit if limit else 0:>8.2f}"
            f"{p['p50_jct_s'] / 3600:>8.2f}{p['p99_jct_s'] / 3600:>8.2f}{p['avg_queue_s'] / 3600:>8.2f}"
            f"{p['makespan_s'] / 3600:>11.2f}{p['utilization']:>6.2f}{p['jobs_completed']:>6}{p['failed']:>5}"
            f"{p['oom_failures']:>5}{p['restarts']:>9}{p['solver_timeouts']:>9}"
            f"{d['median']:>11.2f}{d['p95']:>8.2f}{d['max']:>8.2f}"
        )
    if "jobs" in result:
        lines += ["", render_jobs(result["jobs"])]
    return "\n".join(lines)


def render_jobs(jobs: dict[str, list[dict[str, Any]]]) -> str:
    """One line per job and policy: arrival, start, finish and JCT in hours, restarts, GPU types."""

    def h(x: float | None) -> str:
        return "-" if x is None else f"{x / 3600:.2f}"

    lines = [
        f"{'policy':<12}{'job':<10}{'state':<11}{'arrive h':>9}{'start h':>9}{'finish h':>9}{'JCT h':>8}"
        f"{'restarts':>9}  GPU types"
    ]
    for name, rows in jobs.items():
        for j in rows:
            lines.append(
                f"{name:<12}{j['id']:<10}{j['state']:<11}{h(j['arrival_s']):>9}{h(j['start_s']):>9}"
                f"{h(j['finish_s']):>9}{h(j['jct_s']):>8}{j['restarts']:>9}  {','.join(j['gpu_types'])}"
            )
    return "\n".join(lines)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr meanwhile: HiGHS prints solver chatter straight to fd 1."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no real stdout (embedded use): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _run(args: argparse.Namespace) -> int:
    with stdout_to_stderr():
        result = simulate_command(args, progress=not args.json or sys.stderr.isatty())
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
    return 0
