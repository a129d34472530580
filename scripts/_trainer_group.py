"""Run built-in trainer plans in one real gloo process group on loopback (for benchmarks).

``run_group(world, tasks, workdir)`` starts ``python scripts/_trainer_group.py
SCENARIO WORLD WORKDIR``, which imports torch and transformers' model code
once, then for each task forks WORLD fresh rank processes with torchrun's
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the parent never runs a torch
op, so forking is safe): the import cost is paid once per world size, and
every trainer run has a process of its own, as under torchrun or the daemon.
Each rank runs ``frenzyd.trainer.loop.train`` (one torch thread per rank);
rank 0's summary (``Summary.to_json()``, with every rank's ``memory`` record)
is added to the results file as each task finishes.  A rank that fails ends
its task (the others would wait for it until the gloo timeout); the next task
still runs.  ``fork_ranks`` is the forking itself, shared with the trainer
tests' process groups (tests/trainer/worker.py).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class GroupResult:
    summaries: dict[str, dict[str, Any]]
    """Task name -> rank 0's summary, for the tasks that finished."""
    error: str | None
    """Why the group stopped early (log tails), or None."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_group(world: int, tasks: list[dict[str, Any]], workdir: Path, *,
              timeout: float = 1800) -> GroupResult:
    """Run ``tasks`` (each ``{"name", "plan"}``, plan = trainer plan keys) in one group of ``world`` ranks."""
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / f"results-ws{world}.json"
    results.unlink(missing_ok=True)
    scenario = workdir / f"scenario-ws{world}.json"
    scenario.write_text(json.dumps({"tasks": tasks, "results": str(results)}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(Path(__file__)), str(scenario), str(world), str(workdir)]
    error = None
    with subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                error = f"group of {world} exited {proc.returncode}: {out[-1000:]}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it forked
            proc.communicate()
            error = f"group of {world} timed out after {timeout:.0f} s"
    if error is not None:
        tails = "\n".join(f"--- rank {r}\n" + (workdir / f"ws{world}-rank{r}.log").read_text()[-1500:]
                          for r in range(world) if (workdir / f"ws{world}-rank{r}.log").exists())
        error += "\n" + tails
    summaries = json.loads(results.read_text()) if results.is_file() else {}
    return GroupResult(summaries=summaries, error=error)


def _rank_main(task: dict[str, Any], results_path: str) -> int:
    import torch
    import torch.distributed as dist

    from frenzyd.trainer.loop import RunEnv, train
    from frenzyd.trainer.plan import resolve

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    print(f"{time.monotonic():.1f} task {task['name']}", flush=True)
    env = RunEnv(rank=rank, local_rank=rank, world=world, output_dir=None, checkpoint_dir=None,
                 progress=False)
    summary = train(resolve(task["plan"]), env)
    if rank == 0:
        Path(results_path).write_text(json.dumps(summary.to_json()))
    print(f"{time.monotonic():.1f} done", flush=True)
    dist.destroy_process_group()
    return 0


def _preload() -> None:
    import torch  # noqa: F401
    import transformers.models.gpt2.modeling_gpt2
    import transformers.models.llama.modeling_llama  # noqa: F401

    import frenzyd.trainer.loop  # noqa: F401


def fork_ranks(world: int, logdir: Path, rank_main: Callable[[], int], *, port: int | None = None,
               fresh_logs: bool = False) -> bool:
    """Fork ``world`` rank processes, each with torchrun's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
    and MASTER_PORT and its stdout/stderr in ``LOGDIR/ws{world}-rank{r}.log`` (appended to, or
    truncated when ``fresh_logs``), that run ``rank_main()`` and exit with what it returns (1 and
    the traceback in the log when it raises).  The caller must not have run a torch op (forking
    is safe then).  A rank that fails gets the others killed (they would wait for it until the
    gloo timeout).  True when every rank exited 0.  Also the test suite's runner
    (tests/trainer/worker.py)."""
    port = free_port() if port is None else port
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fresh_logs else os.O_APPEND)
    pids = {}
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            fd = os.open(logdir / f"ws{world}-rank{rank}.log", flags)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = 1
            try:
                code = rank_main()
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids[pid] = rank
    failed = 0
    for _ in range(world):
        _pid, status = os.wait()
        if os.waitstatus_to_exitcode(status) != 0:
            failed += 1
            for other in pids:
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    os.kill(other, signal.SIGKILL)
    return failed == 0


def _run_task(task: dict[str, Any], world: int, logdir: Path, results_path: Path) -> bool:
    """Fork ``world`` fresh rank processes for one task; True when every rank exited 0."""
    return fork_ranks(world, logdir, lambda: _rank_main(task, str(results_path)))


def _launch(scenario_path: str, world: int, logdir: Path) -> int:
    """Import once, then run each task in its own fresh ranks: the CPU profiler's allocation
    bookkeeping is per process, and an earlier run's leftovers in the same process change what a
    later run's window counts (measured: the same DDP plan read 126.7 MiB as a process's first run
    and 111.0 MiB on one rank as its fourth)."""
    t0 = time.monotonic()
    _preload()
    print(f"{time.monotonic():.1f} imports took {time.monotonic() - t0:.1f} s", flush=True)
    scenario = json.loads(Path(scenario_path).read_text())
    for r in range(world):
        (logdir / f"ws{world}-rank{r}.log").unlink(missing_ok=True)
    results: dict[str, Any] = {}
    failed = []
    for task in scenario["tasks"]:
        out = logdir / f"task-ws{world}.json"
        out.unlink(missing_ok=True)
        if _run_task(task, world, logdir, out) and out.is_file():
            results[task["name"]] = json.loads(out.read_text())
            Path(scenario["results"]).write_text(json.dumps(results))
        else:
            failed.append(task["name"])
            print(f"task {task['name']} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_launch(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
