"""Checkpoints with torch.distributed.checkpoint (DCP): written under one plan, loaded under any other.

Layout of ``FRENZY_CHECKPOINT_DIR``::

    step-00000040/          a complete checkpoint (renamed from .tmp-step-00000040 when done)
        .metadata, *.distcp  DCP: model.<fqn>, optim.<fqn>.<state>, rng.rank<r>
        trainer_state.json   step (= data position), losses so far, plan, world size, seed
        COMPLETE             written last, before the rename

Every tensor is keyed by its Hugging Face FQN and saved as the rank holds it
(a DTensor shard under FSDP/TP, a stage's subset under pp, a ZeRO-1
partition's optimizer state), so DCP reshards on load: a checkpoint from 2
ranks with ZeRO-3 loads into 4 ranks with tp=2.  Only the newest complete
checkpoint is kept.  The directory must be the same path on every rank's host;
on hosts without rank 0, the local rank 0 finishes its own copy of the
directory the same way (each host's files are then that host's shards).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzyd.trainer.parallel import Parallel

STATE_FILE = "trainer_state.json"
MARKER = "COMPLETE"
_FORMAT = 1


@dataclass(frozen=True)
class Resumed:
    """What a loaded checkpoint says about the run."""

    step: int
    losses: list[float]
    path: Path


def latest(root: str | Path | None) -> Path | None:
    """The newest complete checkpoint under ``root`` (None when there is none)."""
    if root is None or not Path(root).is_dir():
        return None
    done = [p for p in Path(root).glob("step-*") if (p / MARKER).is_file() and (p / STATE_FILE).is_file()]
    return max(done, key=lambda p: p.name) if done else None


def _optim_state(par: Parallel, *, create: bool) -> dict[str, dict[str, Any]]:
    """FQN -> {state name: tensor} for the parameters whose optimizer state this rank holds."""
    import torch

    opt = par.local_optimizer
    owned = {id(p) for g in opt.param_groups for p in g["params"]}
    out: dict[str, dict[str, Any]] = {}
    for name, p in par.params.items():
        if id(p) not in owned:
            continue
        state = opt.state[p]
        if create and not state:
            if par.plan.optimizer == "adamw":
                state["step"] = torch.zeros((), dtype=torch.float32, device=_local(p).device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            else:
                state["momentum_buffer"] = torch.zeros_like(p)
        out[name] = {k: par.checkpoint_view(v, name) for k, v in state.items() if k != "step"}
    return out


def _local(t: Any) -> Any:
    return getattr(t, "_local_tensor", t)


def _state_dict(par: Parallel, *, rank: int, with_rng: bool, create: bool) -> dict[str, Any]:
    import torch

    sd: dict[str, Any] = {
        "model": {n: par.checkpoint_view(p, n) for n, p in par.params.items()},
        "optim": _optim_state(par, create=create),
    }
    if with_rng:
        sd["rng"] = {f"rank{rank}": torch.get_rng_state()}
    return sd


def save(par: Parallel, *, root: str | Path, step: int, losses: list[float], rank: int, local_rank: int,
         world: int) -> Path:
    """Write a complete checkpoint of ``step`` (collective: every rank calls it); return its path."""
    import torch.distributed as dist
    from torch.distributed.checkpoint import state_dict_saver

    root = Path(root)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    if local_rank == 0 and tmp.exists():
        shutil.rmtree(tmp)
    dist.barrier()
    state_dict_saver.save(_state_dict(par, rank=rank, with_rng=True, create=False), checkpoint_id=str(tmp))
    dist.barrier()
    if local_rank == 0 and tmp.is_dir():
        state = {"format": _FORMAT, "step": step, "losses": losses, "plan": par.plan.to_json(),
                 "world_size": world}
        (tmp / STATE_FILE).write_text(json.dumps(state))
        (tmp / MARKER).write_text(f"{step}\n")
        try:
            if final.exists():
                old = root / f".old-{final.name}-{os.getpid()}"
                final.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            tmp.rename(final)
        except FileNotFoundError:
            pass  # another host's local rank 0 finished the same shared directory first
        for other in root.glob("step-*"):
            if other.name < final.name:
                shutil.rmtree(other, ignore_errors=True)
    dist.barrier()
    return final


def load(par: Parallel, path: Path, *, rank: int, world: int) -> Resumed:
    """Load ``path`` into ``par`` (any plan, any world size); restore the RNG when the world size matches."""
    import torch
    from torch.distributed.checkpoint import state_dict_loader

    meta = json.loads((path / STATE_FILE).read_text())
    step = int(meta["step"])
    same_world = int(meta["world_size"]) == world
    sd = _state_dict(par, rank=rank, with_rng=same_world, create=True)
    state_dict_loader.load(sd, checkpoint_id=str(path))
    opt = par.local_optimizer
    for p in par.params.values():
        if "step" in opt.state.get(p, {}):
            opt.state[p]["step"].fill_(float(step))
    if same_world:
        torch.set_rng_state(sd["rng"][f"rank{rank}"])
    else:
        torch.manual_seed(par.plan.seed + 1_000_003 * step + rank)
    return Resumed(step=step, losses=[float(x) for x in meta["losses"]], path=path)
