"""Built-in trainer jobs on the client side: refuse bad input before submitting, ship the data file,
turn the job's events into JSON Lines (state, step, output, final) and write ./frenzy-results/JOB/."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from frenzyd.errors import ConfigError, FrenzyError
from frenzyd.jobs.model import JobPlan, JobSpec
from frenzyd.jobs.placement import predicted_rank_peaks

TRAINER_OPTIONS = ("lr", "warmup", "checkpoint_every", "seed")
"""Flags that only a built-in trainer job (``--data``) takes; None on the command line = the trainer's
default (``frenzyd.trainer.plan.DEFAULTS``)."""


TRAINER_DEFAULTS = {"lr": 3e-4, "warmup": 0, "checkpoint_every": 50, "seed": 0}
"""``frenzyd.trainer.plan.DEFAULTS`` of the options above, for ``--help`` (the client may not import
the trainer package; tests/daemon/test_trainer_jobs.py checks that they agree)."""


class UsageError(ConfigError):
    """A command line ``frenzy-client run`` refuses before submitting anything (exit status 2)."""


def check_usage(args: Any, command: list[str]) -> None:
    """Flags that do not go together; ``UsageError`` with what to change."""
    if args.data is None:
        if getattr(args, "checkpointable", False) and not command:
            raise UsageError("--checkpointable declares that a script checkpoints: give the script after "
                             "'--'")
        given = [f"--{k.replace('_', '-')}" for k in TRAINER_OPTIONS if getattr(args, k) is not None]
        given += ["--stand-in"] if getattr(args, "stand_in", False) else []
        if given:
            raise UsageError(f"{', '.join(given)} only apply to the built-in trainer: add --data PATH "
                             "(and drop the script), or set them in your script")
        return
    wrong = [flag for flag, v in (("a script after '--'", command), ("--micro-batch", args.micro_batch),
                                  ("--checkpointable (the built-in trainer always checkpoints)",
                                   getattr(args, "checkpointable", False)),
                                  ("--zero", args.zero), ("--nproc", args.nproc),
                                  ("--mem-per-rank", args.mem_per_rank)) if v]
    if wrong:
        raise UsageError(f"--data runs the built-in trainer on the plan MARP chooses: drop "
                         f"{', '.join(wrong)} (the pool picks the GPUs, the parallel degrees and the "
                         "micro-batch)")
    missing = [f for f, v in (("--model", args.model), ("--seq-len", args.seq_len),
                              ("--global-batch", args.global_batch), ("--steps", args.steps)) if v is None]
    if missing:
        raise UsageError(f"--data needs {', '.join(missing)}, e.g. --model tiny-llama --seq-len 64 "
                         "--global-batch 8 --steps 100")


def default_max_data_bytes() -> int:
    """``[launcher] max_data_bytes``' default (the client does not read the daemon's config)."""
    from frenzyd.config import LauncherSection

    return LauncherSection().max_data_bytes


def build_trainer_request(args: Any, cwd: Path, max_data_bytes: int) -> dict[str, Any]:
    """The submit request of a ``run --data`` command line, every refusal checked here first
    (``UsageError``).  ``data_file`` is the data file: the client packs it, as the user
    (``DaemonClient.submit``), the job's only shipped file."""
    from frenzyd.marp.model import list_presets, load_model

    data = (cwd / args.data).resolve()
    if not data.is_file():
        raise UsageError(f"--data {args.data}: no such file (looked at {data})")
    size = data.stat().st_size
    if size > max_data_bytes:
        raise UsageError(f"--data {args.data} is {size} bytes, over the pool's cap of {max_data_bytes} "
                         "([launcher] max_data_bytes): use a smaller file")
    req: dict[str, Any] = {"trainer": True, "argv": []}
    path = cwd / args.model
    if args.model in list_presets():
        req["model"] = args.model
        name = args.model
    elif path.suffix == ".json" or path.is_file():
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--model {args.model}: cannot read it as a config.json ({exc})") from None
        if not isinstance(cfg, dict):
            raise UsageError(f"--model {args.model}: a config.json holds a JSON object")
        req["model_config"] = cfg
        name = path.stem if path.name != "config.json" else path.parent.name or "model"
    else:
        raise UsageError(f"--model {args.model}: unknown preset and no such file; use a preset "
                         f"({', '.join(list_presets())}) or the path of a Hugging Face config.json")
    if args.seq_len < 2 or args.global_batch < 1 or args.steps < 1:
        raise UsageError("--seq-len must be >= 2, --global-batch and --steps >= 1")
    try:
        spec = load_model(str(path) if "model_config" in req else args.model)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if args.seq_len > spec.max_positions:
        raise UsageError(f"--seq-len {args.seq_len} exceeds the model's {spec.max_positions} positions")
    check_data(data, vocab=spec.vocab, seq_len=args.seq_len, global_batch=args.global_batch)
    req.update(
        name=args.name or name, data_name=data.name, seq_len=args.seq_len, global_batch=args.global_batch,
        steps=args.steps, dtype=args.dtype, optimizer=args.optimizer, recompute=args.recompute,
        **{k: getattr(args, k) for k in TRAINER_OPTIONS},
    )
    if getattr(args, "stand_in", False):
        req["stand_in"] = True
    req["data_file"] = str(data)
    return req


_CHUNK = 1 << 24


def check_data(path: Path, *, vocab: int, seq_len: int, global_batch: int) -> None:
    """Refuse (``UsageError``) what the trainer's ``TokenData`` would refuse on the ranks: a file
    that is empty, not whole tokens, not UTF-8 (text), holds an id >= ``vocab``, or is shorter than
    one global batch.  Text is bytes (ids 0-255); ``*.bin`` is nanoGPT's uint16 (vocabulary <= 65,536)
    or uint32 ids.  (The client may not import the trainer package; tests check the two agree.)"""
    import codecs

    import numpy as np

    is_text = path.suffix != ".bin"
    dtype = np.dtype(np.uint8 if is_text else np.uint16 if vocab <= 65536 else np.uint32)
    size = path.stat().st_size
    if size == 0:
        raise UsageError(f"--data {path} is empty")
    if size % dtype.itemsize:
        raise UsageError(f"--data {path} has {size} bytes, not a whole number of {dtype.name} tokens (a .bin "
                         f"for a vocabulary of {vocab} holds {dtype.name}); is it the right file?")
    tokens = np.memmap(path, dtype=dtype, mode="r")
    n = len(tokens)
    if n // seq_len < global_batch:
        raise UsageError(f"--data {path} holds {n} tokens = {n // seq_len} sequences of {seq_len}, shorter "
                         f"than one global batch of {global_batch} sequences: give more data or a smaller "
                         "--global-batch/--seq-len")
    decoder = codecs.getincrementaldecoder("utf-8")()
    top = 0
    for start in range(0, n, _CHUNK):
        chunk = tokens[start:start + _CHUNK]
        if is_text:
            try:
                decoder.decode(chunk.tobytes(), final=False)
            except UnicodeDecodeError:
                raise UsageError(f"--data {path} is not UTF-8 text: give a UTF-8 file, or token ids as a "
                                 "nanoGPT .bin (name it *.bin)") from None
        top = max(top, int(chunk.max()))
    if is_text:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise UsageError(f"--data {path} ends inside a UTF-8 character") from None
    if top >= vocab:
        what = "byte value" if is_text else "token id"
        raise UsageError(f"--data {path} holds {what} {top} >= the model's vocabulary of {vocab}: tokenize "
                         f"for this model, or use a model with vocab_size > {top}")


class Progress:
    """Follows a job's events: the plan of each attempt and rank 0's JSON step lines (per attempt)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.job: dict[str, Any] | None = None
        self.plans: dict[int, dict[str, Any]] = {}
        self.losses: dict[int, dict[int, float]] = {}
        self.last_step: dict[str, Any] | None = None
        self._partial: dict[tuple[int, int, str], str] = {}

    def event(self, ev: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Take one event; return the step events it completes."""
        if ev.get("type") == "state":
            self.job = dict(ev["job"])
            if self.job.get("plan") and self.job.get("attempt"):
                self.plans[int(self.job["attempt"])] = dict(self.job["plan"])
            return []
        stream = ev.get("stream")
        if ev.get("type") != "output" or ev.get("rank") != 0 or stream not in ("stdout", "control"):
            return []  # "control": a checkpointable script's reports (frenzyd.trainer.report)
        attempt = int(ev.get("attempt") or 0)
        key = (attempt, 0, str(stream))
        lines = (self._partial.pop(key, "") + str(ev.get("data", ""))).split("\n")
        self._partial[key] = lines.pop()
        out = []
        for line in lines:
            step = self._step(line, attempt)
            if step is not None:
                out.append(step)
        return out

    def _step(self, line: str, attempt: int) -> dict[str, Any] | None:
        if not line.startswith("{"):
            return None
        try:
            d = json.loads(line)
        except ValueError:
            return None
        if not isinstance(d, dict) or not isinstance(d.get("step"), int) or "loss" not in d:
            return None
        step = {"type": "step", "job": self.job_id, "attempt": attempt,
                **{k: d.get(k) for k in ("step", "steps", "loss", "lr", "tokens_per_s", "eta_s", "step_s")}}
        if isinstance(d["loss"], int | float):
            self.losses.setdefault(attempt, {})[d["step"]] = float(d["loss"])
        self.last_step = step
        return step


def final_summary(job: Mapping[str, Any], record: Mapping[str, Any] | None, progress: Progress | None,
                  results_dir: Path | None) -> dict[str, Any]:
    """The ``final`` object (issue 12's output contract) from the job's summary and record, the
    followed progress, and rank 0's ``summary.json`` when the results were unpacked."""
    trainer: dict[str, Any] = {}
    if results_dir is not None:
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads((results_dir / "trainer-summary.json").read_text())
            trainer = loaded if isinstance(loaded, dict) else {}
    spec = (record or {}).get("spec") or {}
    attempt = int(job.get("attempt") or 0)
    plans = dict(progress.plans) if progress else {}
    if job.get("plan") and attempt:
        plans.setdefault(attempt, dict(job["plan"]))
    followed = progress.losses.get(attempt, {}) if progress else {}
    losses = trainer.get("losses")
    if not isinstance(losses, list):
        losses = [followed[s] for s in sorted(followed)]
    steps_done = trainer.get("steps_done")
    if steps_done is None and followed:
        steps_done = max(followed)
    resumed = trainer.get("resumed_from_step")
    model_dir = results_dir / "model" if results_dir is not None else None
    started, finished, created = (record or {}).get("started_at"), (record or {}).get("finished_at"), \
        (record or {}).get("created_at")
    return {
        "type": "final",
        "job": job.get("id"),
        "state": job.get("state"),
        "message": job.get("message") or "",
        "failed_rank": job.get("failed_rank"),
        "plan": job.get("plan"),
        "plans": [plans[a] for a in sorted(plans)],
        "attempts": attempt,
        "steps": spec.get("steps", trainer.get("steps")),
        "steps_done": steps_done,
        "resumed_from_steps": [resumed] if isinstance(resumed, int) and resumed > 0 else [],
        "losses": losses,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "final_eval_loss": trainer.get("final_eval_loss"),
        "tokens_per_s": trainer.get("tokens_per_s"),
        "wall_s": finished - started if isinstance(finished, float) and isinstance(started, float) else None,
        "queued_s": started - created if isinstance(started, float) and isinstance(created, float) else None,
        "predicted_peak_bytes": _predicted(spec, job.get("plan")),
        "measured_peak_bytes": trainer.get("measured_peak_bytes"),
        "model_dir": str(model_dir.resolve()) if model_dir is not None and model_dir.is_dir() else None,
    }


def _predicted(spec: Mapping[str, Any], plan: Any) -> list[int] | None:
    """MARP's tensor peak of each rank of the plan, on the device the ranks ran on (None: not a
    model job, no plan, or a record this client cannot read)."""
    if not isinstance(plan, Mapping) or not (spec.get("model") or spec.get("model_config")):
        return None
    try:
        return predicted_rank_peaks(JobSpec.from_dict(spec), JobPlan.from_dict(plan))
    except FrenzyError:
        return None


def settle_results(dest: Path) -> None:
    """Rank 0's ``summary.json`` becomes ``trainer-summary.json`` (``summary.json`` is the final)."""
    src = dest / "summary.json"
    if src.is_file():
        src.replace(dest / "trainer-summary.json")
