"""A DDP script that keeps Frenzy's checkpoint contract (submit it with ``run --checkpointable``).

    frenzy-client run --checkpointable --model tiny-llama --seq-len 64 --global-batch 8 --steps 400 \\
        -- checkpointable_ddp.py --sleep 0.2

The same small MLP fit as ``ddp_tiny.py``, plus what makes it preemptible
(``frenzyd.trainer.Checkpointable``, DESIGN.md §8): SIGTERM asks it to stop;
the ranks agree on it at the next step (an all-reduce), each host's local rank
0 saves model, optimizer, step and losses under ``$FRENZY_CHECKPOINT_DIR``
and every rank exits 143.  A later attempt finds that checkpoint and resumes
from its step; batch k is drawn from a generator seeded by (k, rank), so the
curve does not depend on where it was interrupted.  Rank 0 reports each step
to the daemon (``report``), which the scheduler counts against ``--steps``.
``--model`` only sizes the job (MARP); this script trains its own MLP.
Rank 0 writes ``result.json`` (losses, the steps each attempt resumed from)
under ``$FRENZY_OUTPUT_DIR``.  Runs under torchrun too (no checkpoints then,
unless ``FRENZY_CHECKPOINT_DIR`` is set).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from frenzyd.trainer import Checkpointable


def batch(step: int, rank: int, size: int) -> torch.Tensor:
    """Step ``step``'s inputs on ``rank``: the same wherever and whenever the step runs."""
    return torch.randn(size, 16, generator=torch.Generator().manual_seed(1_000_003 * step + rank))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=int(os.environ.get("FRENZY_STEPS", "100")),
                        help="optimizer steps (default $FRENZY_STEPS, else 100)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="also save every K steps (0: only "
                        "when stopped)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to pause per step")
    args = parser.parse_args()

    ck = Checkpointable()  # before the process group: a SIGTERM during start-up is not lost
    dist.init_process_group(os.environ.get("FRENZY_BACKEND") or "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    teacher = nn.Linear(16, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start, losses, resumed = 0, [], []
    found = ck.latest()
    if found is not None:
        state = torch.load(found.path / "state.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, losses = int(state["step"]), [float(x) for x in state["losses"]]
        resumed = [int(x) for x in state["resumed"]] + [start]
        print(f"rank {rank}: resumed from step {start} ({found.path.name})", flush=True)
    ddp = DistributedDataParallel(model)

    def save(step: int) -> None:
        if ck.local_rank == 0:
            with ck.saving(step) as d:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                            "losses": losses, "resumed": resumed}, d / "state.pt")
        dist.barrier()

    step = start
    while step < args.steps:
        x = batch(step, rank, args.batch)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        # one all-reduce: the mean loss and whether any rank was asked to stop
        t = torch.tensor([float(loss.detach()) / world, 1.0 if ck.stop_requested else 0.0])
        dist.all_reduce(t)
        step += 1
        losses.append(float(t[0]))
        if rank == 0:
            ck.report(step, losses[-1], steps=args.steps)
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
        if t[1] > 0:
            save(step)
            print(f"rank {rank}: stopped at step {step}, checkpoint saved", flush=True)
            dist.destroy_process_group()
            return ck.EXIT_STOPPED
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            save(step)
        if args.sleep:
            time.sleep(args.sleep)
    if rank == 0:
        out = Path(os.environ.get("FRENZY_OUTPUT_DIR", "output"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps({"world_size": world, "steps": step, "losses": losses,
                                                     "resumed_from_steps": resumed}, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
