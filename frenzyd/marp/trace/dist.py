"""Data-parallel and ZeRO runs of the reference step: real gloo ranks in subprocesses, or fake process groups.

Part of MARP's torch boundary, built on the one-process step of
``frenzyd.marp.trace.step`` (the only module of the package it imports);
torch is imported lazily.
``dp`` ranks run the reference step of DESIGN.md §3 wrapped in torch's own
parallel forms: DDP(gradient_as_bucket_view=True) for ZeRO-0, plus
``ZeroRedundancyOptimizer`` for ZeRO-1, FSDP2 ``fully_shard`` per decoder
layer for ZeRO-2 (``reshard_after_forward=False``) and ZeRO-3 (``True``) and at
the root (FSDP2's default), as the built-in trainer wraps them.  Real mode
spawns ``dp`` processes on loopback with gloo and a tracker in each; fake mode
runs one rank at a time in this process under
``FakeTensorMode`` with torch's fake process group.  The worst rank is reported.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from frenzyd.errors import ConfigError, TraceError
from frenzyd.marp.spec import TrainingSetup
from frenzyd.marp.trace.step import (
    Measurement,
    ModelLike,
    StepResult,
    build_hf_config,
    build_optimizer,
    hf_dict,
    model_name,
    run_reference_step,
    to_measurement,
    torch_errors,
)

RANK_TIMEOUT_S = 900.0
"""Wall-clock limit for a real multi-process run (all ranks)."""


def _decoder_layers(model: Any) -> list[Any]:
    base = getattr(model, "model", None) or getattr(model, "transformer", None)
    layers = getattr(base, "layers", None) if base is not None else None
    if layers is None and base is not None:
        layers = getattr(base, "h", None)
    if layers is None:
        raise TraceError(f"cannot find the decoder layers of {type(model).__name__} to shard with FSDP")
    return list(layers)


def make_wrap(setup: TrainingSetup, *, ddp: bool = True, fake: bool = False) -> Any:
    """``wrap(model) -> (train_model, optimizer)`` applying the setup's data-parallel form.

    Call it with the process group initialised and outside ``FakeTensorMode``
    (the FSDP device mesh is built here, from real rank ids).  ``ddp=False``
    leaves out the DDP wrapper for ZeRO-0/1 (an experiment only).  ``fake=True``
    adapts DDP to fake tensors without changing what it allocates: the two
    start-up checks that read parameter data are skipped, and the gradient
    all-reduce is the default hook's in-place ``div_`` + ``all_reduce`` on the
    bucket returned as a completed future (the fake process group's own
    future carries no tensor).
    """
    mesh = None
    if setup.zero >= 2:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (setup.dp,))

    def wrap(model: Any) -> tuple[Any, Any]:
        if setup.zero >= 2:
            from torch.distributed.fsdp import fully_shard

            for layer in _decoder_layers(model):
                fully_shard(layer, mesh=mesh, reshard_after_forward=setup.zero == 3)
            # as the built-in trainer wraps it (frenzyd.trainer.parallel): the root (embeddings, final
            # norm, head) at FSDP2's default, kept after forward since backward gathers it again at once.
            # (The trainer also reduce-scatters in place on gloo; the tracker here never sees gloo's
            # private copy of the input, a C++ allocation, so the truth is the same either way.)
            fully_shard(model, mesh=mesh)
            return model, build_optimizer(model.parameters(), setup)
        if not ddp:
            return model, build_optimizer(model.parameters(), setup, zero1=setup.zero == 1)
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = _fake_ddp(model) if fake else DDP(model, gradient_as_bucket_view=True)
        return wrapped, build_optimizer(model.parameters(), setup, zero1=setup.zero == 1)

    return wrap


def _fake_ddp(model: Any) -> Any:
    import torch
    import torch.distributed as dist
    import torch.nn.parallel.distributed

    ddp_mod: Any = torch.nn.parallel.distributed

    def allreduce_hook(_state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
        buf = bucket.buffer()
        buf.div_(dist.get_world_size())
        dist.all_reduce(buf)
        fut: Any = torch.futures.Future()
        fut.set_result(buf)
        return fut

    saved = (ddp_mod._verify_param_shape_across_processes, ddp_mod._sync_module_states)
    ddp_mod._verify_param_shape_across_processes = lambda *a, **k: None
    ddp_mod._sync_module_states = lambda *a, **k: None
    try:
        wrapped: Any = ddp_mod.DistributedDataParallel(model, gradient_as_bucket_view=True)
    finally:
        ddp_mod._verify_param_shape_across_processes, ddp_mod._sync_module_states = saved
    wrapped.register_comm_hook(None, allreduce_hook)
    wrapped.reducer = _NoRebuildReducer(wrapped.reducer)
    return wrapped


class _NoRebuildReducer:
    """DDP's C++ reducer without the one-time bucket rebuild (it broadcasts bucket indices by value).

    The rebuilt buckets hold the same gradients, so the bytes are the same; the
    real run frees the first buckets and allocates the rebuilt ones at the start
    of the second iteration's forward, far from the step's peak.
    """

    def __init__(self, reducer: Any) -> None:
        object.__setattr__(self, "_reducer", reducer)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_reducer"), name)

    def _rebuild_buckets(self) -> bool:
        return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _combine(name: str, results: list[StepResult], method: Literal["real", "trace"], wall_s: float, *,
             world: int, notes: tuple[str, ...] = ()) -> Measurement:
    per_rank = [to_measurement(name, r, method, wall_s) for r in results]
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i].peak_bytes)
    return to_measurement(
        name, results[worst], method, wall_s, world=world,
        rank_peaks=tuple(m.peak_bytes for m in per_rank), notes=notes,
    )


def measure_distributed(
    model: ModelLike, setup: TrainingSetup, *, mode: Literal["real", "fake"], threads: int = 1, seed: int = 0
) -> Measurement:
    """Run ``setup.dp`` ranks of the reference step and report the worst rank's peak (see module doc)."""
    if setup.zero > 0 and setup.dp < 2:
        raise ConfigError(f"ZeRO stage {setup.zero} needs dp >= 2 to shard anything; use dp >= 2 or zero=0")
    name = model_name(model)
    if mode == "real":
        return _run_real(name, hf_dict(model), setup, threads=threads, seed=seed)
    return _run_fake(name, model, setup, seed=seed)


# --------------------------------------------------------------------------- real: gloo subprocesses


def _run_real(
    name: str, hf: dict[str, Any], setup: TrainingSetup, *, threads: int, seed: int, ddp: bool = True
) -> Measurement:
    world = setup.dp
    port = _free_port()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="frenzy-marp-") as tmp:
        job = Path(tmp) / "job.json"
        payload = {"hf": hf, "setup": asdict(setup), "seed": seed, "threads": threads, "ddp": ddp}
        job.write_text(json.dumps(payload))
        procs = []
        for rank in range(world):
            env = dict(os.environ)
            # The ranks import this very package, installed or not (this file is
            # ROOT/frenzyd/marp/trace/dist.py).
            pkg_root = str(Path(__file__).resolve().parents[3])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
            env.update(
                RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads),
                GLOO_SOCKET_IFNAME="lo",
            )
            out = Path(tmp) / f"rank{rank}.json"
            log = (Path(tmp) / f"rank{rank}.log").open("w")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "frenzyd.marp.trace.dist", str(job), str(out)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            ), out, log))
        deadline = time.monotonic() + RANK_TIMEOUT_S
        failed: list[str] = []
        try:
            for p, result, _log in procs:
                left = max(1.0, deadline - time.monotonic())
                try:
                    rc = p.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    failed.append(f"rank pid {p.pid} timed out after {RANK_TIMEOUT_S:.0f}s")
                    break
                if rc != 0 and not result.exists():  # a result written means the step and barrier passed
                    failed.append(f"rank exited with {rc}")
        finally:
            for p, _out, log in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log.close()
        if failed:
            tails = []
            for rank in range(world):
                text = (Path(tmp) / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
                if text:
                    tails.append(f"rank {rank}: {text[-1]}")
            raise TraceError(
                f"real {world}-rank run of {name} (zero={setup.zero}) failed: {'; '.join(failed)}; "
                + " | ".join(tails[:3])
            )
        results = [_result_from_json(json.loads(out.read_text())) for _p, out, _l in procs]
    return _combine(name, results, "real", time.perf_counter() - t0, world=world)


def _result_to_json(r: StepResult) -> dict[str, Any]:
    return {"phase_peak": r.phase_peak, "phase_snap": r.phase_snap, "params": r.params}


def _result_from_json(d: dict[str, Any]) -> StepResult:
    return StepResult(
        phase_peak={str(k): int(v) for k, v in d["phase_peak"].items()},
        phase_snap={str(k): {str(a): int(b) for a, b in v.items()} for k, v in d["phase_snap"].items()},
        params=int(d["params"]),
    )


def _worker(job_path: str, out_path: str) -> int:
    """One real rank: join the gloo group from the environment, run the step, write its result."""
    import torch
    import torch.distributed as dist

    job = json.loads(Path(job_path).read_text())
    setup = TrainingSetup(**job["setup"])
    torch.set_num_threads(int(job["threads"]))
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    try:
        cfg = build_hf_config(job["hf"])
        wrap = make_wrap(setup, ddp=bool(job.get("ddp", True)))
        res = run_reference_step(cfg, setup, mode="real", wrap=wrap, seed=int(job["seed"]) + rank)
        dist.barrier()
        # Written whole before the group's teardown: gloo now and then aborts the process there
        # ("terminate called without an active exception"), after the measurement is complete.
        tmp = Path(out_path).with_suffix(".part")
        tmp.write_text(json.dumps(_result_to_json(res)))
        tmp.replace(out_path)
    finally:
        dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- fake: fake process group


def _run_fake(name: str, model: ModelLike, setup: TrainingSetup, *, seed: int) -> Measurement:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise TraceError(
            "a torch.distributed process group already exists in this process; trace in a fresh one"
        )
    cfg = build_hf_config(model)
    world = setup.dp
    # DDP and FSDP2 allocate the same on every rank (FSDP2 pads every shard to the
    # same size); ZeroRedundancyOptimizer partitions unevenly, so trace each rank.
    ranks = range(world) if setup.zero == 1 else range(1)
    results = []
    t0 = time.perf_counter()
    for rank in ranks:
        dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
        try:
            with torch_errors(f"trace of {name} (dp={world}, zero={setup.zero}, rank {rank})"):
                wrap = make_wrap(setup, fake=True)
                results.append(run_reference_step(cfg, setup, mode="fake", wrap=wrap, seed=seed))
        finally:
            dist.destroy_process_group()
    notes = () if setup.zero == 1 else ("rank 0 traced; ranks allocate alike",)
    return _combine(name, results, "trace", time.perf_counter() - t0, world=world, notes=notes)


def main(argv: list[str]) -> int:
    """Entry point of a real rank subprocess: ``python -m frenzyd.marp.trace.dist JOB.json OUT.json``."""
    if len(argv) != 2:
        print("usage: python -m frenzyd.marp.trace.dist JOB.json OUT.json", file=sys.stderr)
        return 2
    return _worker(argv[0], argv[1])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
