"""A tiny torchrun-style DDP job: fits a small MLP to a fixed random teacher, printing the loss.

Nothing Frenzy-specific: it reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* from the
environment (``init_process_group`` via ``env://``), as under ``torchrun``.
Backend: ``$FRENZY_BACKEND`` if set, else nccl with CUDA, else gloo.  Rank 0
writes ``result.json`` (losses, world size, parameter checksum) under
``$FRENZY_OUTPUT_DIR`` (default ``./output``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to pause per step")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available() and os.environ.get("FRENZY_BACKEND", "") != "gloo"
    backend = os.environ.get("FRENZY_BACKEND") or ("nccl" if use_cuda else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world} on {socket.gethostname()} device={device} backend={backend}", flush=True)

    torch.manual_seed(0)  # same teacher everywhere; DDP broadcasts rank 0's student anyway
    teacher = nn.Linear(16, 1).to(device)
    model = nn.Sequential(nn.Linear(16, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data shard

    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=gen).to(device)
        with torch.no_grad():
            y = teacher(x)
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        losses.append(float(mean))
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    if rank == 0:
        out = Path(os.environ.get("FRENZY_OUTPUT_DIR", "output"))
        out.mkdir(parents=True, exist_ok=True)
        result = {"world_size": world, "backend": backend, "steps": args.steps, "losses": losses,
                  "param_checksum": checksum}
        (out / "result.json").write_text(json.dumps(result, indent=1))
        print(f"done: loss {losses[0]:.4f} -> {losses[-1]:.4f}; wrote {out / 'result.json'}", flush=True)
    dist.barrier()
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Seen about once in 40 runs on a loaded 2-core box: a rank that finished and passed the
    # final barrier aborts in C++ teardown ("terminate called without an active exception",
    # SIGABRT) while gloo's threads are destroyed at interpreter exit. Everything is written
    # and flushed by now, so leave without running the static destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
