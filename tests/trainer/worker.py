"""A test process group: ranks that run a list of trainer tasks in order, as torchrun would launch them.

``python tests/trainer/worker.py SCENARIO.json WORLD PORT LOGDIR`` imports torch
and transformers' model code once, then forks WORLD rank processes (no torch op
has run, no thread pool exists yet), each with torchrun's RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT and its own log file: the import cost (about 10 s
of CPU per process) is paid once per group.  Each task is a plan (dict), an output and a
checkpoint directory, and optionally ``stop_at``: after that step the last
rank sends itself SIGTERM (the trainer's own handler), so the group stops and
checkpoints exactly as under a real preemption.  Rank 0 appends each task's
summary to the results file as it finishes.  The forking is the benchmarks'
(``scripts/_trainer_group.fork_ranks``).
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from pathlib import Path


def main(path: str) -> int:
    import torch
    import torch.distributed as dist

    from frenzyd.trainer.loop import RunEnv, StopFlag, train
    from frenzyd.trainer.plan import resolve

    torch.set_num_threads(1)
    scenario = json.loads(Path(path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    results: dict[str, object] = {}
    for task in scenario["tasks"]:
        if task.get("own_loop"):
            losses = own_loop(task["plan"])
            if rank == 0:
                results[task["name"]] = {"losses": losses}
                Path(scenario["results"]).write_text(json.dumps(results))
            continue
        plan = resolve(task["plan"])
        stop = StopFlag()
        signal.signal(signal.SIGTERM, stop.set)
        env = RunEnv(rank=rank, local_rank=rank, world=world, output_dir=Path(task["output_dir"]),
                     checkpoint_dir=Path(task["checkpoint_dir"]) if task.get("checkpoint_dir") else None,
                     progress=False)
        stop_at = task.get("stop_at")

        def on_step(step: int, _loss: float, stop_at: int | None = stop_at) -> None:
            if stop_at is not None and step == stop_at and rank == world - 1:
                os.kill(os.getpid(), signal.SIGTERM)

        summary = train(plan, env, stop=stop, on_step=on_step)
        if rank == 0:
            results[task["name"]] = summary.to_json()
            Path(scenario["results"]).write_text(json.dumps(results))
    dist.destroy_process_group()
    return 0


def own_loop(raw: dict[str, object]) -> list[float]:
    """A user's script: its own loop over a model sharded by ``frenzyd.trainer.apply_plan`` (FRENZY_PLAN)."""
    import torch
    import torch.distributed as dist

    import frenzyd.trainer as ft
    from frenzyd.trainer.data import TokenData
    from frenzyd.trainer.loop import lr_at
    from frenzyd.trainer.model import build_model
    from frenzyd.trainer.plan import resolve

    plan = resolve(raw)
    os.environ["FRENZY_PLAN"] = json.dumps({k: v for k, v in raw.items() if k not in ("data", "steps")})
    model = ft.apply_plan(build_model(plan.spec(), dtype_mode="fp32", recompute="none", seed=plan.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=plan.lr, fused=True)
    data = TokenData(plan.data, vocab=plan.spec().vocab, seq_len=plan.seq_len, global_batch=plan.global_batch,
                     seed=plan.seed)
    dp_rank, losses = dist.get_rank(), []
    for step in range(plan.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(plan, step)
        ids = torch.from_numpy(data.local_batch(step, dp_rank, plan.dp))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / plan.dp)
        ft.report(step + 1, losses[-1])
    return losses


def _preload() -> None:
    import transformers.models.gpt2.modeling_gpt2
    import transformers.models.llama.modeling_llama  # noqa: F401

    from frenzyd.marp.model import load_model
    from frenzyd.trainer.model import hf_config

    hf_config(load_model("tiny-llama"))
    hf_config(load_model("tiny-gpt2"))


def launch(scenario: str, world: int, port: int, logdir: Path) -> int:
    """Import once, then fork the group's ranks with ``scripts/_trainer_group.fork_ranks`` (the
    benchmarks' runner); all of the scenario's tasks run in that one group."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from _trainer_group import fork_ranks

    _preload()
    return 0 if fork_ranks(world, logdir, lambda: main(scenario), port=port, fresh_logs=True) else 1


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])))
