#!/usr/bin/env python3
"""What Frenzy costs a training job: ``frenzy-client run --model --data`` on a one-node pool vs torchrun.

Both sides run the built-in trainer (``python -m frenzyd.trainer``) on the same
plan with the same checkpointing: the pool's side is a real ``frenzyd``
(started through ``scripts/_pool``) and ``frenzy-client run --json``; the
plan it chose is read from rank 0's ``trainer-summary.json`` (the
``TrainerPlan`` the ranks resolved) and given unchanged, as ``FRENZY_PLAN``
(data path replaced), to ``python -m torch.distributed.run --standalone
--nproc-per-node W -m frenzyd.trainer`` with its own ``FRENZY_CHECKPOINT_DIR``.
Pacing is off (no stand-in); both get the same ``OMP_NUM_THREADS``.

Per repetition and side:

* ``tokens_per_s``: the steady state, rank 0's last progress line
  (``global_batch x seq_len`` over the mean time of the last 10 steps; the
  run has enough steps that these exclude the first step and the memory
  window), the same trainer code on both sides;
* ``submit_to_summary_s``: from starting ``frenzy-client run`` (or torchrun)
  to its exit, the summary written;
* ``launched_cpu_s``: CPU seconds of the processes each side launched, once
  reaped: for the pool, what the daemon's children used (ranks, their exec
  wrapper, rendezvous store, lease supervisor: ``/proc/PID/stat`` cutime +
  cstime); for torchrun, the bench's children (the agent and its ranks);
  ``daemon_cpu_s``: the daemon's own CPU meanwhile (its checkpoint copies,
  output, heartbeats), and ``checkpoint_copies``: how many copies of the
  job's checkpoint the daemon kept while it ran (its log);
* ``load_start``/``load_end``: the 1-minute load average around the run.

The machine is shared: with ``--max-load L`` each run waits (up to
``--load-wait-s``) until the 1-minute load average is at most ``L``, so that
both sides of a repetition start in similar conditions; the waits are
recorded.

Repetitions are interleaved, the order alternating (F T, T F, F T, ...); the
first repetition's Frenzy run picks the plan.  Target: tokens/s >= 0.97 x
torchrun's (ratio of the medians; also per repetition).

    python scripts/bench_trainer_overhead.py [--tiny] [--out PATH] [--reps N] [--steps N] [--gpus N]
        [--max-load L --load-wait-s S]

``--tiny`` (CI) runs one repetition of 4 steps: its steps are too few for a
steady state and too short for the 0.5 s rule, it only proves the path works.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, env, make_pool, wait_until  # noqa: E402
from benchmeta import provenance, write_results  # noqa: E402

from frenzyd.trainer.corpus import write_corpus  # noqa: E402

TARGET_RATIO = 0.97
MIN_STEP_S = 0.5
GPU_TYPE = "A100-80GB"
"""Simulated: the ranks run on the CPU with gloo; the type only sizes MARP's plans."""


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def last_progress(lines: list[dict[str, Any]]) -> dict[str, Any]:
    if not lines:
        raise RuntimeError("no progress lines")
    return lines[-1]


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` itself (``/proc/PID/stat``), or with ``children``
    of its children that it has reaped (cutime + cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def own_children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_for_load(max_load: float | None, limit_s: float) -> float:
    """Wait until the 1-minute load average is at most ``max_load`` (or ``limit_s`` passed); the
    seconds waited."""
    t0 = time.monotonic()
    while max_load is not None and os.getloadavg()[0] > max_load and time.monotonic() - t0 < limit_s:
        time.sleep(5.0)
    return time.monotonic() - t0


def checkpoint_copies(d: Daemon, job: str) -> int:
    """Copies of ``job``'s checkpoint the daemon kept as its submitter (its log)."""
    try:
        text = d.log_path.read_text(errors="replace")
    except OSError:
        return 0
    return sum(1 for ln in text.splitlines() if job in ln and "keeps the checkpoint" in ln)


def run_frenzy(d: Daemon, workdir: Path, train: list[str], timeout: float) -> dict[str, Any]:
    """One ``frenzy-client run --json``: its final object, steady tokens/s, wall time and the CPU
    seconds the daemon process itself spent meanwhile."""
    assert d.proc is not None
    cpu0, kids0 = cpu_seconds(d.proc.pid), cpu_seconds(d.proc.pid, children=True)
    res_dir = workdir / "results"
    cmd = [sys.executable, "-m", "frenzy_client", "run", "--daemon", d.address, *train, "--json",
           "--results-dir", str(res_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=workdir, timeout=timeout,
                          check=False)
    wall = time.perf_counter() - t0
    daemon_cpu = cpu_seconds(d.proc.pid) - cpu0
    launched_cpu = cpu_seconds(d.proc.pid, children=True) - kids0
    if proc.returncode != 0:
        raise RuntimeError(f"frenzy-client run exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}\n--- daemon log\n{d.log_tail(40)}")
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
    final = lines[-1]
    if final.get("type") != "final" or final.get("state") != "succeeded":
        raise RuntimeError(f"the job did not succeed: {final}")
    steps = [ln for ln in lines if ln.get("type") == "step"]
    trainer = json.loads((res_dir / "trainer-summary.json").read_text())
    return {
        "job": final["job"],
        "tokens_per_s": float(last_progress(steps)["tokens_per_s"]),
        "summary_tokens_per_s": final.get("tokens_per_s"),
        "submit_to_summary_s": wall,
        "daemon_cpu_s": daemon_cpu,
        "launched_cpu_s": launched_cpu,
        "checkpoint_copies": checkpoint_copies(d, final["job"]),
        "job_wall_s": final.get("wall_s"),
        "queued_s": final.get("queued_s"),
        "steps_done": final.get("steps_done"),
        "loss_last": final.get("loss_last"),
        "plan": final.get("plan"),
        "trainer_plan": trainer["plan"],
    }


def run_torchrun(plan: dict[str, Any], data: str, workdir: Path, threads: int,
                 timeout: float) -> dict[str, Any]:
    """torchrun on the very TrainerPlan the pool's ranks ran (data path replaced), with checkpoints."""
    p = dict(plan, data=data)
    p.pop("stand_in", None)
    world = int(p["dp"]) * int(p["tp"]) * int(p["pp"])
    ck, out = workdir / "checkpoints", workdir / "output"
    ck.mkdir(parents=True)
    e = env()
    e.update(FRENZY_PLAN=json.dumps(p), FRENZY_CHECKPOINT_DIR=str(ck), FRENZY_OUTPUT_DIR=str(out),
             OMP_NUM_THREADS=str(threads), TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "frenzyd.trainer"]
    kids0 = own_children_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=e, cwd=workdir, timeout=timeout,
                          check=False)
    wall = time.perf_counter() - t0
    launched_cpu = own_children_cpu_s() - kids0
    if proc.returncode != 0:
        raise RuntimeError(f"torchrun exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")
    steps = []
    for ln in proc.stdout.splitlines():
        if ln.startswith("{"):
            try:
                steps.append(json.loads(ln))
            except ValueError:
                continue
    summary = json.loads((out / "summary.json").read_text())
    return {
        "tokens_per_s": float(last_progress([s for s in steps if "tokens_per_s" in s])["tokens_per_s"]),
        "summary_tokens_per_s": summary.get("tokens_per_s"),
        "submit_to_summary_s": wall,
        "launched_cpu_s": launched_cpu,
        "steps_done": summary.get("steps_done"),
        "loss_last": summary.get("loss_last"),
        "checkpoints": sorted(x.name for x in ck.iterdir()),
    }


def start_daemon(base: Path, gpus: int, threads: int) -> Daemon:
    creds = make_pool(base / "pool", ["bench"])
    peer, web, rdzv = free_ports(3)
    conf = NodeConf(name="bench", base=base / "bench", credentials=creds["bench"], devices=[(GPU_TYPE, gpus)],
                    listen=f"127.0.0.1:{peer}", web=f"127.0.0.1:{web}", interfaces=["lo"], mdns=False,
                    rendezvous_ports=(rdzv, rdzv + 9))
    d = Daemon(conf)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # the daemon passes OMP_* to its ranks (launcher.ENV_ALLOW)
    d.start()
    try:
        wait_until(lambda: (d.status() or {}).get("coordinator"), 120,
                   "the daemon to elect itself coordinator")
    except TimeoutError:
        d.stop()
        raise RuntimeError(f"the daemon did not come up:\n{d.log_tail(40)}") from None
    return d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="CI size: 1 repetition of 4 steps (< 2 min)")
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    ap.add_argument("--reps", type=int, help="interleaved repetitions (default 5; --tiny: 1)")
    ap.add_argument("--steps", type=int, help="optimizer steps per run (default 16; --tiny: 4)")
    ap.add_argument("--gpus", type=int, default=1, help="simulated GPUs of the node (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every rank (default 1)")
    ap.add_argument("--model", default="tiny-llama", help="preset or config.json (default tiny-llama)")
    ap.add_argument("--seq-len", type=int, help="default 128 (--tiny: 64)")
    ap.add_argument("--global-batch", type=int, help="default 12 (--tiny: 2)")
    ap.add_argument("--checkpoint-every", type=int, help="default 5 (--tiny: 2)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "bf16-mixed"), help="default fp32")
    ap.add_argument("--max-load", type=float,
                    help="wait before each run until the 1-minute load average is at most L (default: none)")
    ap.add_argument("--load-wait-s", type=float, default=300.0,
                    help="longest wait for --max-load before a run starts anyway (default 300)")
    args = ap.parse_args(argv)
    reps = args.reps if args.reps is not None else (1 if args.tiny else 5)
    steps = args.steps if args.steps is not None else (4 if args.tiny else 16)
    seq = args.seq_len or (64 if args.tiny else 128)
    g = args.global_batch or (2 if args.tiny else 12)
    ck_every = args.checkpoint_every if args.checkpoint_every is not None else (2 if args.tiny else 5)
    if reps < 1 or steps < 2 or args.gpus < 1 or args.threads < 1:
        ap.error("--reps, --gpus and --threads must be >= 1 and --steps >= 2")
    prov = provenance()
    t_start = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="bench-trainer-overhead-"))
    data = base / "corpus.txt"
    write_corpus(data, max(1 << 20, 4 * seq * g * (steps + 2)))
    train = ["--model", args.model, "--data", str(data), "--seq-len", str(seq), "--global-batch", str(g),
             "--steps", str(steps), "--dtype", args.dtype, "--checkpoint-every", str(ck_every)]
    timeout = 600.0
    runs: list[dict[str, Any]] = []
    plan: dict[str, Any] | None = None
    d = start_daemon(base, args.gpus, args.threads)
    try:
        for rep in range(reps):
            order = ("frenzy", "torchrun") if rep % 2 == 0 else ("torchrun", "frenzy")
            for side in order:
                wd = base / f"rep{rep}-{side}"
                wd.mkdir()
                waited = wait_for_load(args.max_load, args.load_wait_s)
                load0 = os.getloadavg()[0]
                if side == "frenzy":
                    r = run_frenzy(d, wd, train, timeout)
                    if plan is None:
                        plan = r["trainer_plan"]
                    elif {k: r["trainer_plan"][k] for k in ("dp", "tp", "pp", "zero", "micro_batch")} != \
                            {k: plan[k] for k in ("dp", "tp", "pp", "zero", "micro_batch")}:
                        raise RuntimeError(f"the pool chose another plan in repetition {rep}: "
                                           f"{r['trainer_plan']} vs {plan}")
                else:
                    assert plan is not None
                    r = run_torchrun(plan, str(data), wd, args.threads, timeout)
                step_s = g * seq / r["tokens_per_s"]
                load1 = os.getloadavg()[0]
                r.update(rep=rep, side=side, step_s=step_s, loadavg_1m=load1, load_start=load0,
                         load_end=load1, load_wait_s=waited)
                runs.append(r)
                extra = f"  daemon CPU {r['daemon_cpu_s']:5.1f} s, {r['checkpoint_copies']} copies" \
                    if side == "frenzy" else ""
                print(f"  rep {rep} {side:8s} {r['tokens_per_s']:9.1f} tokens/s  step {step_s:5.2f} s  "
                      f"submit->summary {r['submit_to_summary_s']:6.1f} s  "
                      f"ranks CPU {r['launched_cpu_s']:5.1f} s  "
                      f"load {load0:5.1f} -> {load1:5.1f}{extra}", flush=True)
                shutil.rmtree(wd / "results" / "model", ignore_errors=True)
                shutil.rmtree(wd / "output" / "model", ignore_errors=True)
    finally:
        d.stop()
    shutil.rmtree(base, ignore_errors=True)

    def side(name: str, key: str) -> list[float]:
        return [float(r[key]) for r in runs if r["side"] == name]

    f_tps, t_tps = side("frenzy", "tokens_per_s"), side("torchrun", "tokens_per_s")
    f_wall, t_wall = side("frenzy", "submit_to_summary_s"), side("torchrun", "submit_to_summary_s")
    paired = [f / t for f, t in zip(f_tps, t_tps, strict=True)]
    ratio = statistics.median(f_tps) / statistics.median(t_tps)
    step_min = min(float(r["step_s"]) for r in runs)
    loads = [float(r[k]) for r in runs for k in ("load_start", "load_end")]
    summ = {
        "tokens_per_s_ratio_of_medians": ratio,
        "tokens_per_s_ratio_per_rep": paired,
        "frenzy_tokens_per_s_median": statistics.median(f_tps),
        "torchrun_tokens_per_s_median": statistics.median(t_tps),
        "frenzy_submit_to_summary_s_median": statistics.median(f_wall),
        "torchrun_submit_to_summary_s_median": statistics.median(t_wall),
        "submit_to_summary_extra_s_median": statistics.median(f_wall) - statistics.median(t_wall),
        "daemon_cpu_s_median": statistics.median(side("frenzy", "daemon_cpu_s")),
        "frenzy_launched_cpu_s_median": statistics.median(side("frenzy", "launched_cpu_s")),
        "torchrun_launched_cpu_s_median": statistics.median(side("torchrun", "launched_cpu_s")),
        "checkpoint_copies_median": statistics.median(side("frenzy", "checkpoint_copies")),
        "load_waited_s": sum(float(r["load_wait_s"]) for r in runs),
        "loadavg_1m_range": [min(loads), max(loads)],
        "shortest_step_s": step_min,
        "steps_long_enough": step_min >= MIN_STEP_S,
        "target_ratio": TARGET_RATIO,
        "target_met": ratio >= TARGET_RATIO,
    }
    assert plan is not None
    shape = {k: plan[k] for k in ("dp", "tp", "pp", "zero", "micro_batch", "grad_accum")}
    print()
    print(f"plan chosen by the pool and given to torchrun: {shape}, model {args.model}, seq {seq}, "
          f"global batch {g}, {steps} steps, checkpoint every {ck_every}, {args.dtype}, "
          f"OMP_NUM_THREADS={args.threads}")
    print(f"{'':24s} {'frenzy-client run':>18s} {'torchrun':>12s} {'ratio':>7s}")
    print(f"{'tokens/s (median)':24s} {statistics.median(f_tps):18.1f} {statistics.median(t_tps):12.1f} "
          f"{ratio:7.3f}")
    print(f"{'submit -> summary s':24s} {statistics.median(f_wall):18.1f} {statistics.median(t_wall):12.1f} "
          f"{statistics.median(f_wall) / statistics.median(t_wall):7.3f}")
    print(f"per-repetition tokens/s ratios: {', '.join(f'{x:.3f}' for x in paired)}")
    print(f"{'launched CPU s (median)':24s} {summ['frenzy_launched_cpu_s_median']:18.1f} "
          f"{summ['torchrun_launched_cpu_s_median']:12.1f}")
    print(f"daemon CPU per job (median): {summ['daemon_cpu_s_median']:.1f} s, checkpoint copies "
          f"{summ['checkpoint_copies_median']:g}; 1-minute load average around the runs: "
          f"{min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs"
          + (f" (waited {summ['load_waited_s']:.0f} s for load <= {args.max_load:g})"
             if args.max_load is not None else ""))
    long_enough = ">=" if summ["steps_long_enough"] else "UNDER"
    print(f"shortest step {step_min:.2f} s ({long_enough} {MIN_STEP_S} s); "
          f"target tokens/s >= {TARGET_RATIO} x torchrun: {'met' if summ['target_met'] else 'NOT met'}")
    wall = time.perf_counter() - t_start
    print(f"wall time: {wall:.1f}s")
    if args.out:
        doc = {
            "config": {"model": args.model, "seq_len": seq, "global_batch": g, "steps": steps,
                       "checkpoint_every": ck_every, "dtype": args.dtype, "gpus": args.gpus,
                       "gpu_type": GPU_TYPE, "threads": args.threads, "reps": reps, "tiny": args.tiny,
                       "max_load": args.max_load, "load_wait_s": args.load_wait_s},
            "plan": plan,
            "summary": summ,
            "runs": [{k: v for k, v in r.items() if k != "trainer_plan"} for r in runs],
            "wall_s": wall,
        }
        write_results(args.out, doc, prov)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
