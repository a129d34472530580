"""One rank of a test process group: runs a list of trainer tasks in order, as torchrun would launch it.

``python tests/trainer/worker.py SCENARIO.json`` with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT set.  Each task is a plan (dict), an output and a
checkpoint directory, and optionally ``stop_at``: after that step the last
rank sends itself SIGTERM (the trainer's own handler), so the group stops and
checkpoints exactly as under a real preemption.  Rank 0 appends each task's
summary to the results file as it finishes.
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

    from frenzyd.trainer.plan import resolve
    from frenzyd.trainer.train import RunEnv, StopFlag, train

    torch.set_num_threads(1)
    scenario = json.loads(Path(path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    results: dict[str, object] = {}
    for task in scenario["tasks"]:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
