"""frenzy-client run / status / jobs / logs / cancel: talk to the local frenzyd and render the answers."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from frenzy_client.results import extract_results
from frenzyd.errors import ConfigError, FrenzyError

if TYPE_CHECKING:
    from frenzy_client.daemon_client import DaemonClient

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CANCELLED = 3
ENDED = ("succeeded", "failed", "cancelled")

_UNITS = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_bytes(text: str) -> int:
    """``4GiB``, ``512MiB``, ``2GB``, ``1.5TiB`` -> bytes (KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB
    of 1000, B bytes; case does not matter).  A number without a unit is refused (``--mem-per-rank 2``
    used to mean 2 bytes): ``ConfigError`` saying what to write."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if m and not m.group(2):
        raise ConfigError(f"size {text!r} has no unit: use e.g. {m.group(1)}GiB (or MiB, KiB, TiB; GB, MB, "
                          "KB; B for bytes)")
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read {text!r} as a size: use e.g. 4GiB or 512MiB (KiB/MiB/GiB/TiB, "
                          "KB/MB/GB/TB, B)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def size_arg(text: str) -> int:
    """:func:`parse_bytes` for argparse (which shows only an ``ArgumentTypeError``'s own message)."""
    try:
        return parse_bytes(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    p.add_argument("--daemon", metavar="ADDRESS",
                   help="frenzyd's client API: unix:/path or 127.0.0.1:PORT (default: $FRENZY_DAEMON, "
                        "else unix:/run/frenzy/client.sock)")
    p.add_argument("--token-file", metavar="PATH",
                   help="API token for a TCP address "
                        "(default: $FRENZY_TOKEN_FILE, $FRENZY_DATA_DIR/client.token)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def register(sub: Any) -> None:
    from frenzy_client.trainer_job import TRAINER_DEFAULTS as DEFAULTS

    p = sub.add_parser(
        "run", help="submit a training job to the pool and stream its output",
        description="Train with no script: --model, --data, --seq-len, --global-batch and --steps run "
                    "Frenzy's built-in trainer on the plan MARP and the scheduler choose (you never name "
                    "a GPU, a parallel degree or a micro-batch); the trained model comes back in "
                    "./frenzy-results/JOB/model/. Or submit SCRIPT (run with torchrun's environment "
                    "contract on the peers Frenzy picks; its directory is shipped): --model (+ --seq-len "
                    "...) lets MARP size it, or --nproc and --mem-per-rank say what it needs. "
                    "With --json, stdout is JSON Lines: 'state', 'step' (rank 0's progress), 'output' and "
                    "one 'final' last (also in ./frenzy-results/JOB/summary.json for a trainer job). "
                    "Exit 0 succeeded, 1 failed, 2 refused before submission, 3 cancelled.",
    )
    _common(p)
    p.add_argument("--model", help="HF config.json path or MARP preset (e.g. tiny-llama, gpt2, llama-3-8b)")
    p.add_argument("--data", metavar="PATH",
                   help="training data for the built-in trainer: UTF-8 text (byte tokens) or a nanoGPT "
                        "flat .bin (uint16 ids, uint32 above 65,536); shipped to the ranks, at most "
                        "[launcher] max_data_bytes (default 4 GiB). Not with a script")
    p.add_argument("--seq-len", type=int, help="tokens per sequence")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="per-rank micro-batch of a script job (default 1; not with --data: MARP picks it)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    p.add_argument("--dtype", choices=["fp32", "bf16", "bf16-mixed"], default="bf16-mixed",
                   help="default bf16-mixed")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw", help="default adamw")
    p.add_argument("--recompute", choices=["none", "full"], default="none", help="default none")
    p.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=None,
                   help="ZeRO stage of a script job (default 0; not with --data: MARP picks it)")
    p.add_argument("--nproc", type=int, help="number of ranks (script jobs without --model)")
    p.add_argument("--mem-per-rank", type=size_arg, metavar="SIZE",
                   help="GPU memory each rank needs, with a unit: e.g. 4GiB or 512MiB (script jobs without "
                        "--model)")
    p.add_argument("--steps", type=int, metavar="N",
                   help="optimizer steps (required with --data); for a script, its declared work: the "
                        "scheduler starts shorter work first, and the ranks get it as FRENZY_STEPS; "
                        "without it the job counts as no shorter than any job that declares its work")
    p.add_argument("--lr", type=float, help=f"peak learning rate, --data only (default {DEFAULTS['lr']}): "
                   "linear warmup, then cosine decay to 10%% at the last step")
    p.add_argument("--warmup", type=int, metavar="W",
                   help=f"warmup steps, --data only (default {DEFAULTS['warmup']})")
    p.add_argument("--checkpoint-every", type=int, metavar="K",
                   help=f"checkpoint every K steps, --data only (default {DEFAULTS['checkpoint_every']}; "
                        "0: only when stopped)")
    p.add_argument("--seed", type=int, help=f"initialisation and data-order seed, --data only "
                   f"(default {DEFAULTS['seed']})")
    p.add_argument("--stand-in", action="store_true",
                   help="--data only: on simulated GPUs, train a small stand-in of the model whose "
                        "every step takes MARP's step time for the model on the placed plan (at least "
                        "0.5 s), and fail with a simulated out-of-memory error when the plan does not fit "
                        "the device; real GPUs train the model itself")
    p.add_argument("--checkpointable", action="store_true",
                   help="script jobs: the script keeps Frenzy's checkpoint contract (on SIGTERM it saves "
                        "under $FRENZY_CHECKPOINT_DIR within $FRENZY_STOP_GRACE_S and exits; it resumes from "
                        "what it finds there; frenzyd.trainer.Checkpointable does both), so the scheduler "
                        "may stop it and start it again, on other GPUs, from its checkpoint; with --model "
                        "and --steps it reports its progress (frenzyd.trainer.report) and the scheduler "
                        "may preempt it like a built-in trainer job")
    p.add_argument("--name", default="", help="a label shown in 'jobs' and the status page "
                   "(default: the script's or the model's name)")
    p.add_argument("--detach", action="store_true",
                   help="print the job id ({\"job\": ID, ...} with --json) and return at once")
    p.add_argument("--results-dir", type=Path,
                   help="where rank 0's output files go (default ./frenzy-results/JOB)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT ARGS")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("wait", help="wait for a job to end, fetch its results, print its final summary",
                       description="Follow JOB until it ends (its output and progress, as run prints "
                                   "them), fetch rank 0's files into ./frenzy-results/JOB/ and print the "
                                   "final summary. Exit 0 succeeded, 1 failed, 3 cancelled.")
    _common(p)
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("--results-dir", type=Path, help="default ./frenzy-results/JOB")
    p.set_defaults(handler=cmd_wait)

    p = sub.add_parser("results", help="fetch a finished job's files (submitted on this peer)",
                       description="Fetch rank 0's output files of a finished JOB (kept by its submitter "
                                   "for [jobs] retention_s) into DIR; a trainer job's final summary goes "
                                   "to DIR/summary.json and its model to DIR/model/.")
    _common(p)
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("--out", type=Path, metavar="DIR", help="default ./frenzy-results/JOB")
    p.set_defaults(handler=cmd_results)

    p = sub.add_parser("status", help="the pool as this daemon sees it (peers, GPUs, coordinator, jobs)")
    _common(p)
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("jobs", help="list the jobs known to the pool")
    _common(p)
    p.set_defaults(handler=cmd_jobs)

    p = sub.add_parser("logs", help="print a job's output (submitted on this peer)")
    _common(p)
    p.add_argument("job_id", metavar="JOB")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.set_defaults(handler=cmd_logs)

    p = sub.add_parser("cancel", help="cancel a job submitted on this peer")
    _common(p)
    p.add_argument("job_id", metavar="JOB")
    p.set_defaults(handler=cmd_cancel)


def _client(args: argparse.Namespace) -> DaemonClient:
    from frenzy_client.daemon_client import client_from_args  # aiohttp only when talking to a daemon

    return client_from_args(args.daemon, args.token_file)


def _command(args: argparse.Namespace) -> list[str]:
    cmd = list(args.command)
    return cmd[1:] if cmd and cmd[0] == "--" else cmd


def build_request(args: argparse.Namespace, cwd: Path) -> dict[str, Any]:
    """The submit request of ``run``'s arguments: the built-in trainer's (``--data``; see
    ``trainer_job.build_trainer_request``) or a script's (its directory, argv, resources)."""
    from frenzy_client import trainer_job

    cmd = _command(args)
    trainer_job.check_usage(args, cmd)
    if args.data is not None:
        return trainer_job.build_trainer_request(args, cwd, trainer_job.default_max_data_bytes())
    if not cmd:
        raise ConfigError("give the script to run after '--', e.g. frenzy-client run --nproc 2 "
                          "--mem-per-rank 1GiB -- train.py --lr 3e-4")
    script = (cwd / cmd[0]).resolve()
    if not script.is_file():
        raise ConfigError(f"script {cmd[0]} not found (looked at {script})")
    req: dict[str, Any] = {
        "workdir": str(script.parent), "argv": [script.name, *cmd[1:]], "name": args.name or script.name,
        "micro_batch": args.micro_batch or 1, "global_batch": args.global_batch, "dtype": args.dtype,
        "optimizer": args.optimizer, "recompute": args.recompute, "zero": args.zero or 0,
        "nproc": args.nproc, "mem_per_rank": args.mem_per_rank, "seq_len": args.seq_len,
        "steps": args.steps,
    }
    if getattr(args, "checkpointable", False):
        req["checkpointable"] = True
    if args.model:
        path = Path(args.model)
        if path.suffix == ".json" or path.is_file():
            try:
                req["model_config"] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"--model {args.model}: cannot read it as a config.json ({exc})") from None
            req["name"] = args.name or path.stem
        else:
            _check_preset(args.model)  # before submitting: a refused job leaves no failed record
            req["model"] = args.model
        if args.seq_len is None:
            raise ConfigError("--model needs --seq-len S (tokens per sample)")
    elif args.nproc is None or args.mem_per_rank is None:
        raise ConfigError("a job without --model must say how many ranks and how much memory each needs: "
                          "add --nproc N --mem-per-rank SIZE (e.g. --nproc 2 --mem-per-rank 2GiB)")
    _check_results_dir(args.results_dir, script.parent, cwd)
    return req


def _check_preset(name: str) -> None:
    from frenzy_client.trainer_job import UsageError
    from frenzyd.marp.model import list_presets

    presets = list_presets()
    if name not in presets:
        raise UsageError(f"--model {name}: unknown preset and no such file; use a preset "
                         f"({', '.join(presets)}) or the path of a Hugging Face config.json")


def _check_results_dir(results_dir: Path | None, workdir: Path, cwd: Path) -> None:
    """Refuse a ``--results-dir`` inside the shipped directory unless it is under ``frenzy-results/``
    (which is never shipped): every later job would carry the earlier results to the peers."""
    from frenzy_client.trainer_job import UsageError

    if results_dir is None:
        return
    res = (cwd / results_dir).resolve()
    if res.is_relative_to(workdir) and "frenzy-results" not in res.relative_to(workdir).parts:
        raise UsageError(f"--results-dir {results_dir} is inside {workdir}, which is shipped with every job: "
                         "later jobs would carry these results to the peers. Put it under "
                         f"{workdir / 'frenzy-results'} (never shipped) or outside {workdir}")


class _Renderer:
    """Prints job events for a person: state changes with elapsed time, output with rank prefixes."""

    def __init__(self, out: TextIO, err: TextIO, *, final_line: bool = False) -> None:
        """``final_line``: the caller prints the job's end itself (with its results), so the state
        note of a job that ended is left out here (it printed twice)."""
        self.out, self.err = out, err
        self.final_line = final_line
        self.t0 = time.monotonic()
        self.state: str | None = None
        self.partial: dict[tuple[int, str], str] = {}
        self.last: dict[str, Any] | None = None

    def _note(self, msg: str) -> None:
        print(f"frenzy [{time.monotonic() - self.t0:6.1f}s] {msg}", file=self.err, flush=True)

    def event(self, ev: Mapping[str, Any]) -> None:
        if ev.get("type") == "state":
            job = ev["job"]
            self.last = dict(job)
            if job["state"] != self.state:
                self.state = job["state"]
                if self.final_line and job["state"] in ENDED:
                    return
                self._note(f"job {job['id']}: {job['state']}" + (f" ({job['message']})" if job.get("message")
                                                                   and job["state"] != "running" else ""))
                if job["state"] == "running":
                    self._placement(job)
        elif ev.get("type") == "output":
            rank, stream = int(ev.get("rank", 0)), str(ev.get("stream", "stdout"))
            if stream == "control":  # a checkpointable script's progress reports, not its output
                return
            text = self.partial.pop((rank, stream), "") + str(ev.get("data", ""))
            lines = text.split("\n")
            self.partial[(rank, stream)] = lines.pop()
            target = self.err if stream == "stderr" else self.out
            for line in lines:
                print(f"[rank {rank}] {line}" if rank >= 0 else line, file=target)
            target.flush()

    def _placement(self, job: Mapping[str, Any]) -> None:
        plan = job.get("plan") or {}
        if plan:
            per = plan.get("bytes_per_gpu")
            pred = f"{per / 2**30:.2f} GiB per GPU" if isinstance(per, int) else "?"
            src = "MARP prediction" if plan.get("source") == "marp" else "declared by --mem-per-rank"
            extra = ""
            if plan.get("step_time_s") is not None:
                extra = f", est. {plan['step_time_s']:.3f} s/step"
            shape = f"dp={plan.get('dp')} tp={plan.get('tp')} pp={plan.get('pp')}"
            self._note(f"plan: {plan.get('gpus')} x {plan.get('gpu_type')} ({shape}), {pred} ({src}){extra}, "
                       f"backend {plan.get('backend', '?')}")
        for r in job.get("ranks") or ():
            self._note(f"  rank {r['rank']} -> peer {str(r['peer'])[:12]} gpu {r['gpu']}")

    def flush(self) -> None:
        for (rank, stream), rest in self.partial.items():
            if rest:
                print(f"[rank {rank}] {rest}", file=self.err if stream == "stderr" else self.out)
        self.partial.clear()


def _exit_code(state: str | None) -> int:
    return {"succeeded": EXIT_OK, "cancelled": EXIT_CANCELLED}.get(state or "", EXIT_FAILED)


def _extract_results(data: bytes, dest: Path) -> int:
    """Unpack rank 0's result archive safely (no absolute paths, links or traversal; expansion and
    entry count capped, ``frenzy_client.results``); file count."""
    return extract_results(data, dest)


async def _run(args: argparse.Namespace) -> int:
    req = build_request(args, Path.cwd())
    async with _client(args) as c:
        job = await c.submit(req)  # packs the job's directory here, as you
        if args.detach:
            print(json.dumps({"job": job["id"], **job}) if args.json else job["id"])
            return EXIT_OK
        return await _follow(c, job["id"], args, args.results_dir, submitted=True)


async def _follow(c: DaemonClient, job_id: str, args: argparse.Namespace, results_dir: Path | None,
                  *, submitted: bool = False) -> int:
    """Stream a job's events until it ends (JSON Lines with ``--json``: state, step, output, one
    final last), unpack its results and print the final summary; the job's exit code."""
    from frenzy_client import trainer_job

    r = _Renderer(sys.stdout, sys.stderr, final_line=not args.json)
    if submitted:
        r._note(f"submitted job {job_id} to {c.address}")
    progress = trainer_job.Progress(job_id)
    async for ev in c.events(job_id, follow=True):
        steps = progress.event(ev)
        if args.json:
            print(json.dumps(ev), flush=True)
            for st in steps:
                print(json.dumps(st), flush=True)
        else:
            r.event(ev)
    r.flush()
    reply = await c.job(job_id)
    final, code = await _finish(c, job_id, reply, progress, results_dir)
    if args.json:
        print(json.dumps(final), flush=True)
    else:
        msg = f"job {job_id} {final['state']}" + (f": {final['message']}" if final.get("message") else "")
        if final.get("results_dir"):
            msg += f"; {final['results_files']} result file(s) in {final['results_dir']}"
        r._note(msg)
        trainer = bool(((reply.get("record") or {}).get("spec") or {}).get("trainer"))
        if trainer and final["state"] == "succeeded" and final.get("model_dir") is None:
            r._note("no trained model came back: rank 0's files may exceed the submitter's [launcher] "
                    "max_result_bytes (see its log); raise it and rerun")
        if final.get("loss_last") is not None:
            r._note(f"loss {final['loss_first']:.4f} -> {final['loss_last']:.4f} over {final['steps_done']} "
                    f"step(s); model in {final.get('model_dir')}")
    return code


async def _finish(c: DaemonClient, job_id: str, reply: Mapping[str, Any], progress: Any,
                  results_dir: Path | None) -> tuple[dict[str, Any], int]:
    """Fetch and unpack the results of an ended job; the final summary (written to the results'
    ``summary.json`` for a trainer job) and the exit code."""
    from frenzy_client import trainer_job

    job, record = reply["job"], reply.get("record")
    trainer = bool(((record or {}).get("spec") or {}).get("trainer"))
    dest = results_dir or Path.cwd() / "frenzy-results" / job_id
    data = await c.results(job_id)
    n = _extract_results(data, dest) if data else 0
    if trainer and n:
        trainer_job.settle_results(dest)
    final = trainer_job.final_summary(job, record, progress, dest if n else None)
    if trainer and n:
        (dest / "summary.json").write_text(json.dumps(final, indent=2) + "\n")
    out = dict(final)
    if n:
        out.update(results_dir=str(dest.resolve()), results_files=n)
    return out, _exit_code(job["state"])


def cmd_run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except KeyboardInterrupt:
        print("frenzy-client: detached; the job keeps running (see 'frenzy-client jobs', "
              "'frenzy-client logs JOB', 'frenzy-client cancel JOB')", file=sys.stderr)
        return 130


async def _status(args: argparse.Namespace) -> dict[str, Any]:
    async with _client(args) as c:
        return await c.status()


def render_status(st: Mapping[str, Any], out: TextIO) -> None:
    """The status JSON for a person."""
    node, coord = st["node"], st.get("coordinator")
    print(f"node {node['name']} ({node['id'][:12]}), role {node['role']}, term {node['term']}", file=out)
    who = f"{coord['name']} ({coord['id'][:12]}), term {coord['term']}" if coord else "none"
    print(f"coordinator: {who}", file=out)
    print("peers:", file=out)
    for p in st.get("peers", []):
        gpus = p.get("gpus", [])
        drivers = sorted({f"driver {g['driver_version']}, CUDA {g.get('cuda_driver_version') or '?'}"
                          for g in gpus if g.get("driver_version")})
        print(f"  {p['name']:<16} {p['address']:<22} {'alive' if p['alive'] else 'DOWN'}"
              + (f"  ({'; '.join(drivers)})" if drivers else ""), file=out)
        for g in gpus:
            sim = " simulated" if g.get("simulated") else ""
            cc = f" cc {g['compute_capability']}" if g.get("compute_capability") else ""
            lease = f" leased to {g['leased_to']}" if g.get("leased_to") else ""
            free = f"{g['free_bytes'] / 2**30:7.1f}/{g['memory_bytes'] / 2**30:.1f} GiB free"
            print(f"    {g['type']:<12} {free}  {g['uuid']}{sim}{cc}{lease}", file=out)
            if g.get("offered") is False and not g.get("leased_to"):
                print(f"      not offered: {g.get('reason') or 'the owner is using it'}", file=out)
        la = p.get("launcher") or {}
        if la.get("runs_as") == "own-user" and la.get("only_jobs_of"):
            print(f"    ranks run as {la.get('user')}, so only {la.get('only_jobs_of')}'s jobs run here: "
                  f"{la.get('reason')}", file=out)
        elif la.get("runs_as") == "own-user":
            print(f"    ranks run as {la.get('user')}, not as slot accounts: {la.get('reason')}", file=out)
        elif la.get("runs_as") == "slots":
            print(f"    ranks run as slot accounts ({la.get('slots_busy')}/{la.get('slots')} busy)", file=out)
        if la.get("accept") == "trainer-only":
            print("    accepts only built-in trainer jobs (no scripts)", file=out)
    for o in st.get("other_versions") or []:
        print(f"  WARNING: member {o['id'][:12]} speaks wire protocol {o['protocol']}, not this node's; "
              "upgrade it (README: Upgrading)", file=out)
    _render_jobs(st.get("jobs", []), out)


def _render_jobs(jobs: list[dict[str, Any]], out: TextIO) -> None:
    if not jobs:
        print("jobs: none", file=out)
        return
    width = max([4, *(len(_name(j)) for j in jobs)])
    print(f"{'JOB':<34} {'NAME':<{width}} {'STATE':<10} {'RANKS':>5}  {'PLAN':<24} SUBMITTER", file=out)
    for j in jobs:
        plan = j.get("plan") or {}
        shape = f"{plan.get('gpus')}x{plan.get('gpu_type')}" if plan else "-"
        print(f"{j['id']:<34} {_name(j):<{width}} {j['state']:<10} {len(j.get('ranks') or []):>5}  "
              f"{shape:<24} {j.get('submitter_name') or str(j.get('submitter', ''))[:12]}", file=out)
        if j["state"] == "queued" and j.get("reason"):
            where = f"#{j['queue_position']} in the queue, " if j.get("queue_position") else ""
            print(f"    {where}{j.get('phase') or 'waiting'}: {j['reason']}", file=out)


def _name(job: Mapping[str, Any]) -> str:
    """A job's ``--name`` for a table: one line, at most 32 characters, "-" when it has none."""
    name = " ".join(str(job.get("name") or "").split())
    return (name[:31] + "…" if len(name) > 32 else name) or "-"


def cmd_wait(args: argparse.Namespace) -> int:
    async def go() -> int:
        async with _client(args) as c:
            return await _follow(c, args.job_id, args, args.results_dir)

    try:
        return asyncio.run(go())
    except KeyboardInterrupt:
        print("frenzy-client: stopped waiting; the job keeps running", file=sys.stderr)
        return 130


def cmd_results(args: argparse.Namespace) -> int:
    async def go() -> tuple[dict[str, Any], int]:
        async with _client(args) as c:
            reply = await c.job(args.job_id)
            if reply["job"]["state"] not in ENDED:
                raise FrenzyError(f"job {args.job_id} is {reply['job']['state']}: its results come when it "
                                  f"ends (frenzy-client wait {args.job_id})")
            return await _finish(c, args.job_id, reply, None, args.out)

    final, _ = asyncio.run(go())
    if args.json:
        print(json.dumps(final))
    elif final.get("results_dir"):
        print(f"{final['results_files']} file(s) of job {args.job_id} in {final['results_dir']}")
    else:
        print(f"job {args.job_id} left no result files")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    st = asyncio.run(_status(args))
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        render_status(st, sys.stdout)
    return EXIT_OK


def cmd_jobs(args: argparse.Namespace) -> int:
    async def go() -> list[dict[str, Any]]:
        async with _client(args) as c:
            return await c.jobs()

    jobs = asyncio.run(go())
    if args.json:
        print(json.dumps({"jobs": jobs}, indent=2))
    else:
        _render_jobs(jobs, sys.stdout)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    async def go() -> str | None:
        r = _Renderer(sys.stdout, sys.stderr)
        state = None
        async with _client(args) as c:
            async for ev in c.events(args.job_id, follow=args.follow):
                if ev.get("type") == "state":
                    state = ev["job"]["state"]
                if args.json:
                    print(json.dumps(ev), flush=True)
                elif ev.get("type") == "output" or args.follow:
                    r.event(ev)
        r.flush()
        return state

    state = asyncio.run(go())
    return _exit_code(state) if args.follow else EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    async def go() -> dict[str, Any]:
        async with _client(args) as c:
            return await c.cancel(args.job_id)

    job = asyncio.run(go())
    print(json.dumps(job) if args.json else f"job {job['id']}: {job['state']}")
    return EXIT_OK
