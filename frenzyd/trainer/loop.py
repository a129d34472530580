"""The training loop: DESIGN.md §3's reference step on the plan's parallel form, with checkpoints and results.

:func:`train` runs in an initialised process group (every rank calls it with
the same plan) and returns a :class:`Summary`.  It resumes from the newest
complete checkpoint in ``checkpoint_dir`` (any plan, any world size), saves
every ``checkpoint_every`` steps and when a stop is requested (SIGTERM: the
ranks agree at the next step boundary), then measures ``final_eval_loss``
after the last update and, on rank 0, writes the Hugging Face model, the
summary and the progress lines.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from frenzyd.errors import ConfigError
from frenzyd.trainer import checkpoint as ckpt
from frenzyd.trainer import control
from frenzyd.trainer.data import TokenData
from frenzyd.trainer.memory import PeakMemory, live_tensor_bytes
from frenzyd.trainer.model import build_model
from frenzyd.trainer.parallel import Parallel, build_mesh, causal_lm_loss, parallelize
from frenzyd.trainer.plan import TrainerPlan

log = logging.getLogger(__name__)

EVAL_BATCH = 0
"""``final_eval_loss`` is the mean loss of global batch 0 (a fixed, seeded set of G sequences)."""


@dataclass(frozen=True)
class RunEnv:
    """Where a run writes and how it is stopped (read once from the environment by ``from_environ``)."""

    rank: int = 0
    local_rank: int = 0
    world: int = 1
    output_dir: Path | None = None
    checkpoint_dir: Path | None = None
    stop_grace_s: float | None = None
    progress: bool = True
    """Rank 0 prints one JSON progress line per step on stdout."""

    @classmethod
    def from_environ(cls, environ: dict[str, str] | os._Environ[str], *, output_dir: str | None = None,
                     checkpoint_dir: str | None = None) -> RunEnv:
        out = output_dir or environ.get("FRENZY_OUTPUT_DIR") or "frenzy-output"
        ck = checkpoint_dir or environ.get("FRENZY_CHECKPOINT_DIR")
        grace = environ.get("FRENZY_STOP_GRACE_S")
        try:
            grace_s = float(grace) if grace else None
        except ValueError:
            raise ConfigError(f"FRENZY_STOP_GRACE_S={grace!r} is not a number of seconds") from None
        rank = int(environ.get("RANK", "0"))
        return cls(rank=rank, local_rank=int(environ.get("LOCAL_RANK", str(rank))),
                   world=int(environ.get("WORLD_SIZE", "1")), output_dir=Path(out),
                   checkpoint_dir=Path(ck) if ck else None, stop_grace_s=grace_s)


@dataclass
class Summary:
    """What a run did (rank 0's ``summary.json``; every rank returns the same losses)."""

    state: str
    """``succeeded``, or ``stopped`` (a stop was requested; the checkpoint holds the state)."""
    plan: dict[str, Any]
    steps: int
    steps_done: int
    resumed_from_step: int
    losses: list[float]
    final_eval_loss: float | None = None
    tokens_per_s: float | None = None
    wall_s: float = 0.0
    model_dir: str | None = None
    checkpoint: str | None = None
    memory: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["loss_first"] = self.losses[0] if self.losses else None
        d["loss_last"] = self.losses[-1] if self.losses else None
        d["measured_peak_bytes"] = [m["peak_tensor_bytes"] for m in self.memory]
        return d


class StopFlag:
    """Set from a SIGTERM handler; the ranks agree on it at step boundaries."""

    def __init__(self) -> None:
        self.requested = False

    def set(self, *_: Any) -> None:
        self.requested = True


def lr_at(plan: TrainerPlan, step: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to 10% of ``lr`` at the last step."""
    if plan.warmup and step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    span = max(1, plan.steps - plan.warmup - 1)
    frac = min(1.0, (step - plan.warmup) / span)
    return plan.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def device_for(local_rank: int) -> Any:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _autocast(plan: TrainerPlan, device: Any) -> Any:
    import torch

    return torch.autocast(device.type, torch.bfloat16, enabled=plan.dtype == "bf16-mixed")


def _agree_loss(par: Parallel, local_sum: float, holds: bool, device: Any) -> float:
    """The global mean of per-rank losses over the ranks that hold one (last stage; all tp ranks alike)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([local_sum if holds else 0.0, 1.0 if holds else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t[0] / t[1])


def _micro_step(par: Parallel, batch: Any, device: Any) -> float:
    """One optimizer step's forward/backward over ``grad_accum`` micro-batches; this rank's mean loss."""
    import torch

    plan = par.plan
    ids = torch.from_numpy(batch).to(device)
    if par.schedule is not None:
        losses: list[Any] = []
        # return_outputs=False: the last stage keeps no logits of its micro-batches beyond their
        # backward (DESIGN.md §3: only the loss is kept), as MARP predicts.
        if par.pp_rank == 0:
            par.schedule.step(ids, return_outputs=False)
        elif par.is_last_stage:
            par.schedule.step(target=ids, losses=losses, return_outputs=False)
        else:
            par.schedule.step(return_outputs=False)
        par.sync_grads()
        return float(torch.stack([x.detach() for x in losses]).mean()) if losses else 0.0
    total = torch.zeros((), dtype=torch.float32, device=device)
    mb = plan.micro_batch
    for m in range(plan.grad_accum):
        x = ids[m * mb:(m + 1) * mb]
        with _autocast(plan, device):
            loss = par.module(input_ids=x, labels=x).loss / plan.grad_accum
        loss.backward()
        total += loss.detach()
    par.sync_grads()
    return float(total)


def _eval_loss(par: Parallel, data: TokenData, device: Any) -> float:
    """Mean loss of global batch ``EVAL_BATCH`` under the trained parallel model (no update)."""
    import torch
    import torch.distributed as dist

    plan = par.plan
    ids = torch.from_numpy(data.local_batch(EVAL_BATCH, par.dp_rank, plan.dp)).to(device)
    mb = plan.micro_batch
    chunks = [ids[i:i + mb] for i in range(0, ids.shape[0], mb)]
    par.inner.eval()
    total, holds = 0.0, True
    with torch.no_grad():
        if par.schedule is None:
            for x in chunks:
                with _autocast(plan, device):
                    total += float(par.module(input_ids=x, labels=x).loss)
        else:
            ranks = dist.get_process_group_ranks(par.mesh["pp"].get_group())
            me, last = par.pp_rank, plan.pp - 1
            holds = me == last
            for x in chunks:
                if me == 0:
                    h = par.inner(x)
                else:
                    shape = torch.empty(3, dtype=torch.int64, device=device)
                    dist.recv(shape, src=ranks[me - 1])
                    h = torch.empty(tuple(int(v) for v in shape), dtype=next(par.inner.parameters()).dtype,
                                    device=device)
                    dist.recv(h, src=ranks[me - 1])
                    h = par.inner(h)
                if me < last:
                    dist.send(torch.tensor(h.shape, dtype=torch.int64, device=device), dst=ranks[me + 1])
                    dist.send(h.contiguous(), dst=ranks[me + 1])
                else:
                    total += float(causal_lm_loss(h, x))
    par.inner.train()
    return _agree_loss(par, total / len(chunks), holds, device)


def _state_tensors(par: Parallel) -> list[Any]:
    held = list(par.params.values()) + list(par.inner.buffers())
    held += [p.grad for p in par.params.values() if p.grad is not None]
    for st in par.local_optimizer.state.values():
        held += [v for v in st.values() if hasattr(v, "untyped_storage")]
    return held


def train(plan: TrainerPlan, env: RunEnv, *, stop: StopFlag | None = None,
          on_step: Callable[[int, float], None] | None = None, data_checked: bool = False) -> Summary:
    """Run ``plan`` to ``plan.steps`` (or to a requested stop) in the current process group.

    ``data_checked``: the caller already validated the data file (skip the full read on every rank).
    """
    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    stop = stop or StopFlag()
    device = device_for(env.local_rank)
    if plan.stand_in is not None and (oom := plan.stand_in.out_of_memory()) is not None:
        raise torch.OutOfMemoryError(oom)
    pace_s = plan.stand_in.pace_s if plan.stand_in is not None else 0.0
    spec = plan.spec()
    data = TokenData(plan.data, vocab=spec.vocab, seq_len=plan.seq_len, global_batch=plan.global_batch,
                     seed=plan.seed, check=not data_checked)
    mesh = build_mesh(plan, device.type)
    par = parallelize(build_model(spec, dtype_mode=plan.dtype, recompute=plan.recompute, seed=plan.seed,
                                  stand_in=plan.stand_in is not None), plan, mesh, device)
    start, losses = 0, []
    found = ckpt.latest(env.checkpoint_dir)
    if found is not None:
        resumed = ckpt.load(par, found, rank=env.rank, world=env.world)
        start, losses = resumed.step, resumed.losses[: resumed.step]
        log.info("resumed from %s at step %d", found, start)
    meter = PeakMemory(device, env.rank)
    meter.start(_state_tensors(par))
    step_times: list[float] = []
    saved: Path | None = None
    last_save_s = 0.0
    state = "succeeded"
    step = start
    while step < plan.steps:
        ts = time.monotonic()
        lr = lr_at(plan, step)
        for g in par.optimizer.param_groups:
            g["lr"] = lr
        local = _micro_step(par, data.local_batch(step, par.dp_rank, plan.dp), device)
        par.optimizer.step()
        par.optimizer.zero_grad(set_to_none=True)
        loss = _agree_loss(par, local, par.schedule is None or par.is_last_stage, device)
        step += 1
        losses.append(loss)
        meter.step_done()
        if pace_s:  # a stand-in takes the declared model's time on this GPU type (StandIn)
            time.sleep(max(0.0, pace_s - (time.monotonic() - ts)))
        step_times.append(time.monotonic() - ts)
        if env.rank == 0:
            recent = step_times[-10:]
            per = sum(recent) / len(recent)
            line = {"step": step, "steps": plan.steps, "loss": loss, "lr": lr,
                    "tokens_per_s": plan.global_batch * plan.seq_len / per,
                    "eta_s": (plan.steps - step) * per, "step_s": step_times[-1]}
            if env.progress:
                print(json.dumps(line), flush=True)
            control.send({"type": "step", **line}, quiet=True)
        if on_step is not None:
            on_step(step, loss)
        flag = torch.tensor([1.0 if stop.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        wants_stop = bool(flag.item() > 0)
        due = plan.checkpoint_every and step % plan.checkpoint_every == 0 and step < plan.steps
        if env.checkpoint_dir is not None and (due or wants_stop):
            s0 = time.monotonic()
            saved = ckpt.save(par, root=env.checkpoint_dir, step=step, losses=losses, rank=env.rank,
                              local_rank=env.local_rank, world=env.world)
            last_save_s = time.monotonic() - s0
            control.send({"type": "checkpoint_complete", "rank": env.rank, "step": step, "path": str(saved)},
                         quiet=True)
            if env.stop_grace_s is not None and last_save_s + (step_times[-1]) > env.stop_grace_s:
                log.warning("a step plus a checkpoint take %.1f s, more than FRENZY_STOP_GRACE_S=%.1f: a "
                            "stop may be killed before its checkpoint is complete",
                            last_save_s + step_times[-1], env.stop_grace_s)
        if wants_stop:
            state = "stopped"
            break
    report = meter.stop()
    memory = _gather_memory(report.to_json())
    summary = Summary(state=state, plan=plan.to_json(), steps=plan.steps, steps_done=step,
                      resumed_from_step=start, losses=losses, memory=memory,
                      checkpoint=str(saved) if saved else None)
    if step_times:
        steady = step_times[1:] or step_times
        summary.tokens_per_s = plan.global_batch * plan.seq_len * len(steady) / sum(steady)
    if state == "succeeded":
        summary.final_eval_loss = _eval_loss(par, data, device)
        from frenzyd.trainer.export import gather_full, write_hf_dir

        full = gather_full(par)
        if full is not None and env.output_dir is not None:
            summary.model_dir = str(write_hf_dir(spec, full, env.output_dir / "model", dtype_mode=plan.dtype,
                                                 stand_in=plan.stand_in is not None).resolve())
    summary.wall_s = time.monotonic() - t0
    if env.output_dir is not None:
        _write_outputs(env, summary, report.to_json())
    dist.barrier()
    return summary


def _gather_memory(mine: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return [x for x in out if x is not None]


def _write_outputs(env: RunEnv, summary: Summary, memory: dict[str, Any]) -> None:
    assert env.output_dir is not None
    mem_dir = env.output_dir / "memory"
    mem_dir.mkdir(parents=True, exist_ok=True)
    (mem_dir / f"rank-{env.rank}.json").write_text(json.dumps(memory, indent=1) + "\n")
    if env.rank == 0:
        (env.output_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=1) + "\n")


def used_tensor_bytes(par: Parallel) -> int:
    """Bytes of the tensors a rank holds between steps (parameters, buffers, gradients, optimizer state)."""
    return live_tensor_bytes(_state_tensors(par))


def init_process_group(environ: dict[str, str] | os._Environ[str]) -> None:
    """torchrun's contract: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; gloo on CPU, nccl on CUDA."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "MASTER_ADDR" not in environ and environ.get("WORLD_SIZE", "1") == "1":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def print_error(msg: str) -> None:
    print(f"frenzyd.trainer: {msg}", file=sys.stderr, flush=True)
