"""The GPU-owner role: leases over this node's GPUs, launch/stop orders, rank output and exits."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from frenzyd.errors import FrenzyError, LaunchError, LeaseError
from frenzyd.gpu_types import cuda_device
from frenzyd.jobs import bulk
from frenzyd.jobs.context import (
    CHUNK,
    MAX_REPORTED_JOBS,
    OUTPUT_BATCH_BYTES,
    OUTPUT_BUFFER_CAP,
    SEND_TIMEOUT_S,
    STORE_LINGER_S,
    ClusterView,
    RankRun,
    RoleContext,
)
from frenzyd.jobs.messages import (
    Ack,
    JobCheckpoint,
    JobExit,
    JobFinished,
    JobLaunch,
    JobOutput,
    JobResults,
    JobStop,
    LaunchAck,
    LeaseRelease,
    LeaseRequest,
    OutputChunk,
    PayloadFetch,
)
from frenzyd.jobs.model import (
    JobRecord,
    JobSpec,
    LeaseTable,
)
from frenzyd.jobs.outbox import MAX_CHECKPOINT_TRIES, Outbox, OutboxEntry, delivery_timeout_s, timed_out

FETCH_TRIES = 3
"""Times a launch asks a slow submitter for one chunk of its payload or checkpoint before it fails."""
OUTPUT_DRAIN_S = 30.0
"""Longest an exit report waits for the attempt's remaining output to be delivered."""
MAX_DELIVERY_BACKOFF_S = 60.0
"""Longest wait between two tries to deliver an exit report to an unreachable submitter."""
COPY_SPACING = 20.0
"""A running attempt's next checkpoint copy to its submitter waits this many times as long as the
last copy took, from packing to the submitter's answer (which comes after its merge): under 5 % of
a core.  Timing the packing alone let the submitter's merge (unpack and repack, 2-3x the packing)
run beside the ranks; on a one-node pool it is their own node."""

log = logging.getLogger(__name__)


def fetch_timeout_s(nbytes: int) -> float:
    """How long a launch waits for a chunk of ``nbytes`` it fetched: sized by the chunk."""
    return delivery_timeout_s(nbytes)


def _pythonpath() -> str:
    """``frenzyd`` importable by trainer ranks even when the daemon runs from a source tree."""
    root = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    return root if not old else f"{root}{os.pathsep}{old}"


ALL_RANKS_HERE = "all-ranks-here"
"""Marks an attempt's run directory whose ranks all ran on this node: its checkpoints hold every shard."""
CONTROL_CHANNEL = "control"
"""The named pipe in an attempt's run directory that a checkpointable script's ranks report on
(``FRENZY_CONTROL_FD``, ``frenzyd.trainer.control``)."""
CONTROL_LINE_CAP = 4096
"""Longest control line kept (``frenzyd.trainer.control.MAX_LINE_BYTES``); longer ones are dropped."""


def rank_command(spec: JobSpec, plan: Mapping[str, Any], run_dir: Path, work: Path,
                 stop_grace_s: float, *, all_ranks_here: bool = False) -> tuple[list[str], dict[str, str]]:
    """The ranks' command and Frenzy variables (DESIGN.md §8) for one attempt: the user's script,
    or for a trainer job ``python -m frenzyd.trainer`` with the whole job in ``FRENZY_PLAN`` (the
    placed plan + model, seq_len, global_batch, data, steps and the trainer options) and a
    per-attempt ``FRENZY_CHECKPOINT_DIR`` under ``run_dir`` (``runs/JOB/aN``).

    Resume: before this is called the launch fetched the checkpoint the job's submitter keeps (the
    parts every host of a stopped attempt sent, merged) into the checkpoint directory; when every
    rank of this attempt runs here, the newest complete checkpoint of an earlier all-local attempt
    is hard-linked beside it too.  The trainer resumes from the newest of them (DCP reshards it
    onto this attempt's plan), so an attempt placed on other nodes resumes as well."""
    job_plan = dict(plan)
    if spec.model is not None or spec.model_config is not None:
        job_plan.update(seq_len=spec.seq_len, global_batch=spec.global_batch)
        if spec.model_config is not None:  # the trainer reads a config.json path
            cfg = run_dir / "model-config.json"
            cfg.write_text(json.dumps(spec.model_config))
            job_plan["model"] = str(cfg)
        else:
            job_plan["model"] = spec.model
    grace = str(stop_grace_s)
    if not spec.keeps_checkpoints:
        return list(spec.argv), {"FRENZY_PLAN": json.dumps(job_plan), "FRENZY_STOP_GRACE_S": grace}
    ckpt = run_dir / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    if all_ranks_here:
        (run_dir / ALL_RANKS_HERE).touch()
        _seed_checkpoint(run_dir, ckpt)
    if not spec.trainer:  # a checkpointable script: its command, with the control channel
        argv = [sys.executable, "-m", "frenzyd.trainer.control_exec", str(run_dir / CONTROL_CHANNEL), "--",
                *spec.argv]
        return argv, {"FRENZY_PLAN": json.dumps(job_plan), "FRENZY_CHECKPOINT_DIR": str(ckpt),
                      "FRENZY_STOP_GRACE_S": grace, "PYTHONPATH": _pythonpath()}
    assert spec.data_name is not None  # JobSpec.validate
    if spec.stand_in and plan.get("backend") == "gloo":
        job_plan.update(stand_in_plan(spec, plan, run_dir))
    job_plan.update(spec.trainer_options(), data=str(work / spec.data_name))
    return [sys.executable, "-m", "frenzyd.trainer"], {
        "FRENZY_PLAN": json.dumps(job_plan), "FRENZY_CHECKPOINT_DIR": str(ckpt),
        "FRENZY_STOP_GRACE_S": grace, "PYTHONPATH": _pythonpath(),
    }


STAND_IN_SEQ = 64
"""Longest sequence a stand-in trains on (its positions)."""


def stand_in_plan(spec: JobSpec, plan: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """``FRENZY_PLAN`` keys that make a trainer job on simulated GPUs run a small stand-in of its
    model (``frenzyd.trainer.plan.StandIn``): a 2-layer LLaMA with the declared model's vocabulary,
    data-parallel over the same ranks, one sequence per rank, each step paced to MARP's step time
    of the declared plan (at least 0.5 s), and MARP's bytes for that plan checked against the
    device's memory.  Rendezvous, steps, checkpoints and results stay real."""
    from frenzyd.jobs.placement import MIN_STAND_IN_STEP_S, job_model

    declared = job_model(spec)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": declared.vocab, "max_position_embeddings": STAND_IN_SEQ,
           "tie_word_embeddings": False, "attention_dropout": 0.0}
    path = run_dir / "stand-in-config.json"
    path.write_text(json.dumps(cfg))
    world = int(plan.get("gpus") or 1)
    return {
        "model": str(path), "seq_len": min(spec.seq_len or STAND_IN_SEQ, STAND_IN_SEQ), "global_batch": world,
        "dp": world, "tp": 1, "pp": 1, "zero": 0, "micro_batch": None, "grad_accum": None,
        "stand_in": {"stands_for": spec.model or spec.name or "model",
                     "pace_s": max(MIN_STAND_IN_STEP_S, float(plan.get("step_time_s") or 0.0)),
                     "bytes_per_gpu": int(plan.get("bytes_per_gpu") or 0),
                     "gpu_memory_bytes": int(plan.get("gpu_memory_bytes") or 0)},
    }


def _seed_checkpoint(run_dir: Path, ckpt: Path) -> Path | None:
    """Hard-link the newest complete checkpoint of an earlier all-local attempt of the job into
    ``ckpt`` (see :func:`rank_command`); the checkpoint used, or None."""
    try:
        current = int(run_dir.name.removeprefix("a"))
    except ValueError:
        return None
    best: tuple[int, Path] | None = None
    for prev in run_dir.parent.glob("a*"):
        try:
            k = int(prev.name.removeprefix("a"))
        except ValueError:
            continue
        if k >= current or not (prev / ALL_RANKS_HERE).is_file():
            continue
        for step in (prev / "checkpoints").glob("step-*"):
            n = step.name.removeprefix("step-")
            if n.isdigit() and (step / "COMPLETE").is_file() and (best is None or int(n) > best[0]):
                best = (int(n), step)
    if best is None or (ckpt / best[1].name).exists():
        return None
    try:
        shutil.copytree(best[1], ckpt / best[1].name, copy_function=os.link)
    except OSError as exc:
        log.warning("checkpoint %s not reused: %s", best[1], exc)
        shutil.rmtree(ckpt / best[1].name, ignore_errors=True)
        return None
    log.info("resuming from %s", best[1])
    return best[1]


def _chunk_timeout_s(offset: int, total: int) -> float:
    """The send timeout of the chunk at ``offset`` of ``total`` bytes: sized by the chunk, and for the
    last one also by the whole, which the receiver then checks and unpacks before it answers."""
    size = max(0, min(CHUNK, total - offset))
    return delivery_timeout_s(size, total if offset + CHUNK >= total else 0)


class RankHostRole:
    """The final authority over this node's GPUs; runs the ranks it is ordered to run."""

    def __init__(
        self,
        ctx: RoleContext,
        *,
        data_dir: Path,
        gpus: Callable[[], list[dict[str, Any]]],
        launcher: Any,
        rank_spec: Callable[..., Any],
        unpack: Callable[[bytes, str, Path, int], Any],
        collect_results: Callable[[Path, int], bytes],
        max_payload_bytes: int,
        max_result_bytes: int,
        socket_ifname: str | None,
        retention_s: float = 7 * 24 * 3600.0,
        max_checkpoint_bytes: int = 1 << 30,
        vacate_grace_s: float = 30.0,
    ) -> None:
        self.ctx = ctx
        self.data_dir = data_dir
        self.vacate_grace_s = vacate_grace_s
        self._gpus = gpus
        self.launcher, self._rank_spec = launcher, rank_spec
        self._unpack, self._collect = unpack, collect_results
        self.max_payload_bytes, self.max_result_bytes = max_payload_bytes, max_result_bytes
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.socket_ifname = socket_ifname
        self.leases = LeaseTable()
        self._runs: dict[tuple[str, int], RankRun] = {}
        self.outbox = Outbox(data_dir)
        self.retention_s = retention_s
        self._store_done: dict[tuple[str, int], asyncio.Event] = {}
        self._control: dict[tuple[str, int], int] = {}
        """Attempt -> the read end of its checkpointable script's control channel."""
        self._checkpoint_told: dict[tuple[str, int], asyncio.Event] = {}
        """Attempt -> set when a rank said a checkpoint is complete (the copy is made sooner)."""
        self.stopping = False
        self._run_dirs: dict[tuple[str, int], Path] = {}  # attempt -> its directory (Launcher.run_dir)

    def _check_coordinator(self, peer: str, term: int) -> None:
        v = self.ctx.view()
        self.leases.observe_term(v.term)
        if term < v.term or (term == v.term and v.coordinator not in (None, peer)):
            raise LeaseError(f"order from {peer[:12]} at term {term}: the coordinator of term {v.term} "
                             f"is {str(v.coordinator)[:12]}")

    async def on_lease(self, peer: str, msg: LeaseRequest) -> Ack:
        try:
            self._check_coordinator(peer, msg.term)
            offered = [g["uuid"] for g in self._gpus() if g.get("offered")]
            self.leases.grant(msg.job_id, msg.attempt, msg.gpus, term=msg.term, coordinator=peer,
                              now=self.ctx.clock(), offerable=offered)
        except LeaseError as exc:
            log.info("lease for job %s refused: %s", msg.job_id, exc)
            return Ack(False, str(exc))
        return Ack()

    async def on_release(self, peer: str, msg: LeaseRelease) -> Ack:
        lease = self.leases.get(msg.job_id, msg.attempt)
        if lease is not None and not lease.launched and msg.term >= lease.term:
            self.leases.release(msg.job_id, msg.attempt)
        return Ack()

    async def on_launch(self, peer: str, msg: JobLaunch) -> LaunchAck | Ack:
        """Start this node's ranks of the order's record (only after its signature was verified)."""
        job_id, attempt, term, rec = msg.job_id, msg.attempt, msg.term, msg.record
        try:
            self._check_coordinator(peer, term)
            self.leases.check_order(job_id, attempt, term)
        except LeaseError as exc:
            return Ack(False, str(exc))
        known = self._runs.get((job_id, attempt))
        if known is not None:
            return LaunchAck(known.master_port)
        mine = [r for r in rec.ranks if r.peer == self.ctx.node_id]
        lease = self.leases.get(job_id, attempt)
        if not mine or lease is None or sorted(r.gpu for r in mine) != sorted(lease.gpus):
            return Ack(False, "the order's ranks do not match this node's lease")
        try:  # a script on a trainer-only node, another user's job on a node without slot accounts
            self.launcher.admit(job_id, rec.owner, rec.spec.trainer)
            # with slot accounts a fresh directory of the attempt's own, removed when it ends here
            run_dir = self._run_dirs[(job_id, attempt)] = await asyncio.to_thread(
                self.launcher.run_dir, job_id, attempt, self.data_dir / "runs" / job_id / f"a{attempt}")
        except (FrenzyError, OSError) as exc:
            log.warning("job %s attempt %d: refused: %s", job_id, attempt, exc)
            self.leases.release(job_id, attempt)
            return Ack(False, str(exc))
        work, outdir = run_dir / "work", run_dir / "output"
        try:
            async def prepare() -> None:
                payload = await self._fetch_payload(rec)
                await bulk.run(self._unpack, payload, rec.spec.payload_sha256, work, self.max_payload_bytes)
                if rec.spec.keeps_checkpoints:  # resume from the checkpoint the submitter keeps
                    size = await self._fetch_checkpoint(rec, run_dir / "checkpoints")
                    if size is not None:
                        log.info("job %s attempt %d: fetched its checkpoint (%d bytes)", job_id, attempt,
                                 size)

            port = msg.master_port
            if msg.start_store:  # the store (a child process) starts while the payload comes
                store = asyncio.ensure_future(self.launcher.start_store(job_id, attempt, msg.master_addr))
                try:
                    await prepare()
                finally:
                    port = await store
            else:
                await prepare()
            outdir.mkdir(parents=True, exist_ok=True)
            run = RankRun(job_id, attempt, term, rec.submitter, rec, mine, port, hosts_store=msg.start_store)
            self._runs[run.key] = run
            handles = []
            local_world = len(mine)
            plan = rec.plan.to_dict() if rec.plan is not None else {}
            ordered = sorted(mine, key=lambda r: r.local_rank)
            gpu_indices = tuple(r.gpu_index for r in ordered)
            cuda_devices = tuple(cuda_device(r.gpu_index, r.gpu) for r in ordered)  # MIG: by UUID
            argv, env = await asyncio.to_thread(self._command, rec, plan, run_dir, work)
            if rec.spec.checkpointable:
                self._open_control(run, run_dir / CONTROL_CHANNEL)
            for r in mine:
                spec = self._rank_spec(
                    job_id=job_id, rank=r.rank, local_rank=r.local_rank, world_size=rec.world_size,
                    local_world_size=local_world, master_addr=msg.master_addr, master_port=port,
                    gpu_indices=gpu_indices, argv=argv, workdir=work, output_dir=outdir,
                    env={"FRENZY_JOB_ID": job_id, **env,
                         **({"FRENZY_STEPS": str(rec.spec.steps)} if rec.spec.steps else {})},
                    backend=msg.backend, socket_ifname=self.socket_ifname, attempt=attempt,
                    cuda_devices=cuda_devices,
                )
                handles.append((r.rank, await self.launcher.launch(spec, self._on_output(run))))
        except (FrenzyError, OSError) as exc:
            log.warning("job %s attempt %d: launch failed: %s", job_id, attempt, exc)
            self._runs.pop((job_id, attempt), None)
            self._close_control((job_id, attempt))
            with contextlib.suppress(Exception):
                await self.launcher.cancel(job_id, attempt)
            self._run_dirs.pop((job_id, attempt), None)
            await asyncio.to_thread(self.launcher.release, job_id, attempt)
            self.leases.release(job_id, attempt)
            return Ack(False, str(exc))
        self.leases.mark_launched(job_id, attempt)
        log.info("job %s attempt %d: started rank(s) %s", job_id, attempt, [r.rank for r in mine])
        self.ctx.spawn(self._pump(run), f"output {job_id}")
        if rec.spec.keeps_checkpoints:
            self.ctx.spawn(self._upload_checkpoints(run), f"checkpoints {job_id}")
        self.ctx.spawn(self._watch(run, handles, outdir, rank0_here=any(r.rank == 0 for r in mine)),
                    f"watch {job_id}")
        return LaunchAck(port)

    def _command(self, rec: JobRecord, plan: dict[str, Any], run_dir: Path,
                 work: Path) -> tuple[list[str], dict[str, str]]:
        here = all(r.peer == self.ctx.node_id for r in rec.ranks)
        return rank_command(rec.spec, plan, run_dir, work, self.stop_grace_s(),
                            all_ranks_here=here)

    async def _fetch(self, rec: JobRecord, fetch: PayloadFetch) -> dict[str, Any]:
        """One chunk of the job's payload or checkpoint from its submitter: the wait sized by the
        chunk (``delivery_timeout_s``), and a submitter that is only slow (busy packing, loaded) asked
        again, up to ``FETCH_TRIES`` times, before the launch fails and costs the job an attempt."""
        for tries in itertools.count(1):
            try:
                return await self.ctx.send(rec.submitter, fetch, fetch_timeout_s(fetch.length))
            except (FrenzyError, OSError) as exc:
                if tries >= FETCH_TRIES or not timed_out(exc):
                    raise
                log.info("job %s [attempt %d]: the submitter did not answer a %s fetch in time (%s); "
                         "asking again", rec.id, rec.attempt, fetch.what, exc)
        raise AssertionError("unreachable")

    async def _fetch_payload(self, rec: JobRecord) -> bytes:
        size = rec.spec.payload_size
        if size > self.max_payload_bytes:
            raise LaunchError(f"payload of {size} bytes exceeds this node's cap {self.max_payload_bytes}")
        buf = bytearray()
        while len(buf) < size:
            reply = await self._fetch(rec, PayloadFetch(rec.id, rec.attempt, len(buf), CHUNK))
            data = reply.get("data")
            if not isinstance(data, bytes) or not data:
                raise LaunchError("the submitter sent no payload bytes")
            buf.extend(data)
            if len(buf) > size:
                raise LaunchError("the submitter sent more payload bytes than announced")
        return bytes(buf)

    def _on_output(self, run: RankRun) -> Callable[[int, str, bytes], None]:
        def on_output(rank: int, stream: str, data: bytes) -> None:
            run.out.append((rank, stream, data))
            run.out_bytes += len(data)
            while run.out_bytes > OUTPUT_BUFFER_CAP and len(run.out) > 1:
                _, _, old = run.out.pop(0)
                run.out_bytes -= len(old)
                run.dropped += len(old)
            run.out_event.set()
        return on_output

    async def _pump(self, run: RankRun) -> None:
        """Send buffered rank output to the submitter in batches, in order."""
        while True:
            if not run.out:
                if run.done:
                    run.pumped.set()
                    return
                run.out_event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await run.out_event.wait()
                continue
            batch: list[OutputChunk] = []
            size = 0
            while run.out and size < OUTPUT_BATCH_BYTES:
                rank, stream, data = run.out.pop(0)
                run.out_bytes -= len(data)
                batch.append(OutputChunk(rank, stream, data))
                size += len(data)
            if run.dropped:
                note = f"[{run.dropped} bytes of output dropped]\n".encode()
                batch.insert(0, OutputChunk(-1, "frenzy", note))
                run.dropped = 0
            try:
                out = JobOutput(run.job_id, run.attempt, tuple(batch))
                await self.ctx.send(run.submitter, out, SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: output to submitter failed (%s)", run.job_id, exc)
                await asyncio.sleep(self.ctx.heartbeat_s)

    async def _wait_ranks(self, run: RankRun, handles: list[tuple[int, Any]]) -> list[tuple[int, int]]:
        """Exit codes in the order the ranks exited; the first non-zero one stops the others here
        at once (torchrun's semantics), unless this node is already stopping them."""
        pending = {asyncio.ensure_future(h.wait()): rank for rank, h in handles}
        codes: list[tuple[int, int]] = []
        stopping = False
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in sorted(done, key=lambda t: pending[t]):
                    code = int(t.result())
                    codes.append((pending.pop(t), code))
                    if code != 0 and pending and not stopping and not (run.vacated or self.stopping):
                        stopping = True
                        log.info("job %s attempt %d: rank %d exited %d; stopping its other ranks here",
                                 run.job_id, run.attempt, codes[-1][0], code)
                        self.ctx.spawn(self.launcher.cancel(*run.key), f"stop {run.job_id}")
        finally:
            for t in pending:
                t.cancel()
        return codes

    async def _watch(
        self, run: RankRun, handles: list[tuple[int, Any]], outdir: Path, rank0_here: bool
    ) -> None:
        """Wait for this node's ranks, persist the exit report (and rank 0's results) in the outbox,
        then deliver it."""
        codes = await self._wait_ranks(run, handles)
        self._close_control(run.key)
        if await self.launcher.unsupervise(*run.key) and not run.vacated:
            run.vacated = "its lease expired: this node could not confirm the attempt with its submitter"
        run.done = True
        run.out_event.set()
        if run.hosts_store and not (self.stopping or run.vacated):
            # Ranks elsewhere may still be tearing down their process group through the store:
            # it closes when the submitter says the job is over (job.finished), or after a while.
            done = self._store_done.setdefault(run.key, asyncio.Event())
            self.ctx.spawn(self._close_store_later(run.key, done), f"store {run.job_id}")
        else:
            with contextlib.suppress(Exception):
                await self.launcher.cancel(*run.key)  # closes the rendezvous store, reaps stragglers
        with contextlib.suppress(TimeoutError):  # the last output lines reach the submitter before the exit
            async with asyncio.timeout(1.0 if self.stopping else OUTPUT_DRAIN_S):
                await run.pumped.wait()
        report = JobExit(run.job_id, run.attempt, run.term, tuple(codes), self.ctx.node_id, run.record,
                         vacated=self.stopping or bool(run.vacated),
                         reason=run.vacated or ("its daemon stopped" if self.stopping else ""),
                         preempted=run.preempted and not self.stopping)
        checkpoint = None
        if run.record.spec.keeps_checkpoints and (report.vacated or any(c != 0 for _, c in codes)):
            checkpoint = await bulk.run(self._checkpoint_part, run)
            if checkpoint is not None and checkpoint[0] <= run.checkpoint_sent:
                checkpoint = None  # the submitter has it already
        results: bytes | None = None
        if rank0_here and not report.vacated:
            try:
                results = await bulk.run(self._collect, outdir, self.max_result_bytes)
            except (FrenzyError, OSError) as exc:
                log.warning("job %s attempt %d: results not collected: %s", run.job_id, run.attempt, exc)
        try:
            entry = await asyncio.to_thread(self.outbox.put, report, run.submitter, results, self.ctx.clock(),
                                            checkpoint)
        except OSError as exc:  # full disk: still try to deliver from memory
            log.error("job %s attempt %d: exit report not persisted (%s); delivering it from memory",  # noqa: TRY400
                      run.job_id, run.attempt, exc)
            entry = OutboxEntry(report, run.submitter, self.ctx.clock(), False)
        # results and checkpoint are in the outbox: the attempt's directory, cgroup and slot go
        await asyncio.to_thread(self.launcher.release, run.job_id, run.attempt)
        self._run_dirs.pop(run.key, None)
        self.leases.release(run.job_id, run.attempt)
        self._runs.pop(run.key, None)
        log.info("job %s attempt %d: rank(s) here exited %s", run.job_id, run.attempt, codes)
        self.ctx.wake()
        coord = self.ctx.view().coordinator
        if coord is not None and coord != run.submitter:  # stops a failing job's other ranks sooner
            self.ctx.spawn(self._copy_to(coord, report), f"exit copy {run.job_id}")
        await self._deliver(entry, results)

    def _open_control(self, run: RankRun, path: Path) -> None:
        """Make the attempt's control channel (a named pipe the ranks' ``control_exec`` opens for
        writing) and read it on the event loop until the ranks here have exited.  Opened read-write
        so that it never reads end-of-file between ranks."""
        path.unlink(missing_ok=True)
        os.mkfifo(path, 0o600)
        run_as = getattr(self.launcher, "run_as", None)
        if run_as:
            shutil.chown(path, user=run_as)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._control[run.key] = fd
        self._checkpoint_told[run.key] = asyncio.Event()
        buf = bytearray()
        forward = self._on_output(run)
        ranks = {r.rank for r in run.ranks}

        def readable() -> None:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                log.warning("job %s attempt %d: control channel failed: %s", run.job_id, run.attempt, exc)
                self._close_control(run.key)
                return
            buf.extend(data)
            *lines, rest = bytes(buf).split(b"\n")
            buf[:] = rest if len(rest) <= CONTROL_LINE_CAP else b""
            for line in lines:
                self._on_control(run, line, ranks, forward)

        asyncio.get_running_loop().add_reader(fd, readable)

    def _on_control(self, run: RankRun, line: bytes, ranks: set[int],
                    forward: Callable[[int, str, bytes], None]) -> None:
        """One line a rank wrote to its control channel (untrusted: malformed or foreign lines are
        dropped).  Rank 0's progress goes to the submitter with its output (stream ``control``);
        a complete checkpoint makes the next copy to the submitter come sooner."""
        try:
            msg = json.loads(line) if len(line) <= CONTROL_LINE_CAP else None
        except ValueError:
            msg = None
        rank = msg.get("rank", 0) if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or type(rank) is not int or rank not in ranks \
                or msg.get("job", run.job_id) != run.job_id or msg.get("attempt", run.attempt) != run.attempt:
            log.debug("job %s attempt %d: control line dropped: %r", run.job_id, run.attempt, line[:200])
            return
        if msg.get("type") == "step" and rank == 0 and type(msg.get("step")) is int:
            forward(rank, "control", line + b"\n")
        elif msg.get("type") == "checkpoint_complete" and (told := self._checkpoint_told.get(run.key)):
            told.set()

    def _close_control(self, key: tuple[str, int]) -> None:
        self._checkpoint_told.pop(key, None)
        fd = self._control.pop(key, None)
        if fd is None:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to remove
            asyncio.get_running_loop().remove_reader(fd)
        os.close(fd)

    def stop_grace_s(self, *, reclaim: bool = True) -> float:
        """The grace of a stop: ``launcher.stop_grace_s``, or for an owner's reclaim the shorter of it
        and ``owner.vacate_grace_s``.  Ranks get the shortest (``FRENZY_STOP_GRACE_S``)."""
        grace = float(getattr(self.launcher, "term_grace_s", 10.0))
        return min(grace, self.vacate_grace_s) if reclaim else grace

    def _checkpoints(self, run: RankRun) -> Path:
        run_dir = self._run_dirs.get(run.key, self.data_dir / "runs" / run.job_id / f"a{run.attempt}")
        return run_dir / "checkpoints"

    def _newest_complete_step(self, run: RankRun) -> int:
        """The step of the attempt's newest complete checkpoint here (0: none); a directory listing,
        no packing."""
        ckpt = self._checkpoints(run)
        steps = [int(p.name.removeprefix("step-")) for p in ckpt.glob("step-*")
                 if p.name.removeprefix("step-").isdigit() and (p / "COMPLETE").is_file()] \
            if ckpt.is_dir() else []
        return max(steps, default=0)

    def _checkpoint_part(self, run: RankRun) -> tuple[int, int, bytes, str] | None:
        """This host's part of the attempt's newest complete checkpoint, packed, as
        ``(step, hosts, archive, sha256)`` (None: the ranks here wrote none, or it is too big)."""
        ckpt = self._checkpoints(run)
        for _ in range(3):  # the ranks may save a newer one and prune this one while it is packed
            done = [p for p in ckpt.glob("step-*") if (p / "COMPLETE").is_file()] if ckpt.is_dir() else []
            if not done:
                return None
            newest = max(done, key=lambda p: p.name)
            step = newest.name.removeprefix("step-")
            if not step.isdigit():
                return None
            try:
                data = self._collect(newest, self.max_checkpoint_bytes)
            except (FrenzyError, OSError) as exc:
                if not (newest / "COMPLETE").is_file() or any(
                        p.name > newest.name for p in ckpt.glob("step-*") if (p / "COMPLETE").is_file()):
                    continue  # replaced or pruned meanwhile: pack the newest one now
                log.warning("job %s attempt %d: checkpoint %s not sent to the submitter: %s", run.job_id,
                            run.attempt, newest.name, exc)
                return None
            return int(step), len(run.record.peers()), data, hashlib.sha256(data).hexdigest()
        return None

    def _now(self) -> float:
        """The clock that times a checkpoint copy (for its spacing)."""
        return time.monotonic()

    async def _pause(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Wait ``seconds``, or less when ``wake`` is set."""
        if wake is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await wake.wait()

    async def _newer_checkpoint(self, run: RankRun, every: float, told: asyncio.Event) -> bool:
        """Wait until a checkpoint newer than the last one sent is complete here, looking every
        ``every`` seconds or when ``told``; False when the attempt ended first."""
        while not run.done:
            if await asyncio.to_thread(self._newest_complete_step, run) > run.checkpoint_sent:
                return True
            told.clear()
            await self._pause(every, told)
        return False

    async def _upload_checkpoints(self, run: RankRun) -> None:
        """While the attempt runs, send each new complete checkpoint's part to the submitter (DESIGN
        §8: "copied there after each save"), so the job survives the loss of any peer that ran its
        ranks, this one included.  A failed send is retried at the next look; the attempt's last
        checkpoint also travels with its exit report.

        A copy costs CPU the ranks compete for (packing here; hashing, unpacking and merging at the
        submitter, which answers the last chunk only once its merge is done), so the next copy
        starts ``COPY_SPACING`` times the last one's whole duration after it ended, at least
        ``max(2 s, 4 heartbeats)``: under 5 % of a core, on whichever node pays.  Between copies
        the checkpoint directory is only listed (every 2 s or 4 heartbeats, sooner when a
        checkpointable script's rank says a checkpoint is complete); nothing is packed again until
        a newer checkpoint is complete."""
        floor = max(2.0, 4 * self.ctx.heartbeat_s)
        gap = floor
        told = self._checkpoint_told.get(run.key) or asyncio.Event()
        while True:
            await self._pause(gap)
            if not await self._newer_checkpoint(run, floor, told):
                return
            t0 = self._now()
            try:
                part = await bulk.run(self._checkpoint_part, run)  # beside the ranks: at a lower priority
                if part is None or part[0] <= run.checkpoint_sent:
                    continue
                step, hosts, data, sha = part
                for off in range(0, max(len(data), 1), CHUNK):
                    chunk = JobCheckpoint(run.job_id, run.attempt, step, hosts, off, len(data), sha,
                                          data[off:off + CHUNK])
                    ack = Ack.from_body(await self.ctx.send(run.submitter, chunk,
                                                            _chunk_timeout_s(off, len(data))))
                    if not ack.ok:
                        raise LaunchError(ack.reason)
                run.checkpoint_sent = step
            except (FrenzyError, OSError) as exc:
                log.info("job %s attempt %d: checkpoint not taken yet (%s)", run.job_id, run.attempt, exc)
            finally:
                gap = max(floor, COPY_SPACING * (self._now() - t0))

    async def _send_checkpoint(self, entry: OutboxEntry) -> None:
        """This host's checkpoint part, in chunks, before the exit report: by the time the submitter
        requeues the job, the checkpoint the next attempt resumes from is whole.  A refusal (a
        stale attempt, the cap) loses only the checkpoint, never the exit report.  Each chunk is
        given time by its size, the last one also for the merge it starts (``delivery_timeout_s``)."""
        assert entry.checkpoint is not None
        job_id, attempt = entry.key
        step, hosts, sha = entry.checkpoint
        data = await asyncio.to_thread(self.outbox.checkpoint, entry)
        for off in range(0, max(len(data), 1), CHUNK):
            chunk = JobCheckpoint(job_id, attempt, step, hosts, off, len(data), sha, data[off:off + CHUNK])
            ack = Ack.from_body(await self.ctx.send(entry.submitter, chunk, _chunk_timeout_s(off, len(data))))
            if not ack.ok:
                log.info("job %s attempt %d: checkpoint step %d refused: %s", job_id, attempt, step,
                         ack.reason)
                return

    async def _fetch_checkpoint(self, rec: JobRecord, dest: Path) -> int | None:
        """Fetch the job's checkpoint kept by its submitter into ``dest`` (the attempt's
        ``FRENZY_CHECKPOINT_DIR``); its size, or None when there is none."""
        buf = bytearray()
        total, sha = 1, ""
        while len(buf) < total:
            fetch = PayloadFetch(rec.id, rec.attempt, len(buf), CHUNK, what="checkpoint")
            reply = await self._fetch(rec, fetch)
            said, sha, data = reply.get("total"), str(reply.get("sha256") or ""), reply.get("data")
            if not isinstance(said, int) or said <= 0:
                return None
            total = said
            if total > self.max_checkpoint_bytes:
                raise LaunchError(f"the job's checkpoint of {total} bytes exceeds this node's cap "
                                  f"{self.max_checkpoint_bytes}")
            if not isinstance(data, bytes) or not data:
                raise LaunchError("the submitter sent no checkpoint bytes")
            buf.extend(data)
        await bulk.run(self._unpack, bytes(buf), sha, dest, self.max_checkpoint_bytes)
        return len(buf)

    async def _copy_to(self, coordinator: str, report: JobExit) -> None:
        with contextlib.suppress(FrenzyError):
            await self.ctx.send(coordinator, report, SEND_TIMEOUT_S)

    async def _deliver(self, entry: OutboxEntry, results: bytes | None = None) -> None:
        """Send an outbox entry to its submitter (checkpoint part and results first), retrying for as
        long as ``retention_s`` lasts; remove it once acknowledged or refused as stale.

        A part that was taken is not sent again.  A submitter in the view that only answered too late
        (busy, not gone) is tried again after a heartbeat; an unreachable one with a growing backoff.
        After ``MAX_CHECKPOINT_TRIES`` timed-out tries of the checkpoint part the report goes without
        it, so a slow submitter delays the job's requeue by a bounded time."""
        job_id, attempt = entry.key
        delay = self.ctx.heartbeat_s
        checkpoint_due, results_due, checkpoint_tries = entry.checkpoint is not None, entry.has_results, 0
        while self.ctx.clock() < entry.created_at + self.retention_s:
            try:
                if checkpoint_due:
                    checkpoint_tries += 1
                    await self._send_checkpoint(entry)
                    checkpoint_due = False
                if results_due:
                    await self._send_results(entry, results)
                    results_due = False
                await self.ctx.send(entry.submitter, entry.report, SEND_TIMEOUT_S)
            except LaunchError as exc:  # refused for good (stale attempt, over the cap)
                log.warning("job %s attempt %d: %s; dropping it", job_id, attempt, exc)
                break
            except (FrenzyError, OSError) as exc:
                slow = timed_out(exc) and entry.submitter in self.ctx.view().peers
                if slow and checkpoint_due and checkpoint_tries >= MAX_CHECKPOINT_TRIES:
                    log.warning("job %s attempt %d: the submitter did not take this host's checkpoint in "
                                "%d tries (%s); the exit report goes without it", job_id, attempt,
                                checkpoint_tries, exc)
                    checkpoint_due = False
                wait = self.ctx.heartbeat_s if slow else delay
                log.info("job %s attempt %d: exit report not delivered (%s); retry in %.0fs",
                         job_id, attempt, exc, wait)
                if slow:  # alive but busy: soon again, the backoff is for a submitter that is gone
                    await asyncio.sleep(wait)
                else:
                    await self._backoff(entry.submitter, delay)
                    delay = min(delay * 2, MAX_DELIVERY_BACKOFF_S)
                continue
            break
        else:
            log.warning("job %s attempt %d: submitter %s did not take the exit report within %.0fs; "
                        "dropping it", job_id, attempt, entry.submitter[:12], self.retention_s)
        await asyncio.to_thread(self.outbox.remove, entry.key)

    async def _backoff(self, submitter: str, delay: float) -> None:
        """Wait ``delay`` before the next delivery, or less: as soon as the submitter comes back into
        the view (restarted, unfrozen, a partition healed), so a finished attempt's report reaches
        it before the pool could start the job again."""
        deadline = self.ctx.clock() + delay
        was_here = submitter in self.ctx.view().peers
        while self.ctx.clock() < deadline:
            await asyncio.sleep(min(self.ctx.heartbeat_s, max(0.0, deadline - self.ctx.clock())))
            here = submitter in self.ctx.view().peers
            if here and not was_here:
                return
            was_here = here

    async def _send_results(self, entry: OutboxEntry, results: bytes | None) -> None:
        """Rank 0's results, in chunks; ``LaunchError`` when the submitter refuses them for good."""
        job_id, attempt = entry.key
        data = results if results is not None else await asyncio.to_thread(self.outbox.results, entry)
        for off in range(0, max(len(data), 1), CHUNK):
            chunk = JobResults(job_id, attempt, off, len(data), data[off:off + CHUNK])
            ack = Ack.from_body(await self.ctx.send(entry.submitter, chunk, _chunk_timeout_s(off, len(data))))
            if not ack.ok:
                raise LaunchError(f"results refused: {ack.reason}")

    def start(self) -> None:
        """Resume delivering what a previous run of this daemon left in the outbox."""
        for entry in self.outbox.entries():
            self.ctx.spawn(self._deliver(entry), f"outbox {entry.report.job_id}")

    def renew_leases(self, v: ClusterView) -> None:
        """Extend the lease of every attempt running here that its submitter confirms (its live
        report lists the attempt as placing or running).  An attempt nobody confirms is left to
        expire: its supervisor kills the ranks ``lease_timeout_s`` after the last renewal, before
        the coordinator could place a new attempt (DESIGN.md §8)."""
        for run in list(self._runs.values()):
            if run.done or not self._confirmed(v, run):
                continue
            self.launcher.renew(run.job_id, run.attempt, self.ctx.lease_timeout_s)

    @staticmethod
    def _confirmed(v: ClusterView, run: RankRun) -> bool:
        rep = v.peers.get(run.submitter)
        if rep is None:
            return False
        for j in rep.get("jobs") or ():
            if isinstance(j, Mapping) and j.get("id") == run.job_id and j.get("attempt") == run.attempt:
                return j.get("state") == "running" or j.get("phase") == "placing"
        return False

    def outbox_report(self) -> list[dict[str, Any]]:
        """The finished attempts whose reports are not delivered yet (for the heartbeat report)."""
        return [{"job_id": e.report.job_id, "attempt": e.report.attempt}
                for e in self.outbox.entries()][-MAX_REPORTED_JOBS:]

    async def _close_store_later(self, key: tuple[str, int], done: asyncio.Event) -> None:
        # Keyed by attempt: a later attempt of the same job is never touched by this timer.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STORE_LINGER_S):
                await done.wait()
        self._store_done.pop(key, None)
        await self.launcher.cancel(*key)
        self.launcher.forget(*key)

    async def on_finished(self, peer: str, msg: JobFinished) -> Ack:
        """The submitter says a job is over: close its attempt's rendezvous store here."""
        ev = self._store_done.get((msg.job_id, msg.attempt))
        if ev is not None:
            ev.set()
        return Ack()

    async def protect_owner(self, gpus: list[dict[str, Any]]) -> list[str]:
        """Owner protection: vacate every job whose ranks share a GPU with a process that is not
        Frenzy's (the job is requeued elsewhere, not failed).  Returns the vacated job ids."""
        foreign = {g["uuid"] for g in gpus if int(g.get("foreign_processes") or 0) > 0}
        out = []
        for lease in self.leases.leases():
            run = self._runs.get((lease.job_id, lease.attempt))
            hit = sorted(foreign & set(lease.gpus))
            if run is None or run.vacated or not hit:
                continue
            run.vacated = f"the owner of GPU {hit[0]} is using it"
            log.warning("job %s: %s; stopping its ranks here so it is requeued", lease.job_id, run.vacated)
            out.append(lease.job_id)
            self.ctx.spawn(self.launcher.cancel(lease.job_id, lease.attempt, self.stop_grace_s()),
                           f"vacate {lease.job_id}")
        return out

    async def on_stop(self, peer: str, msg: JobStop) -> Ack:
        """Stop the job's ranks here (only after the order's signature was verified).  A preemption
        is the same stop (SIGTERM, the grace, SIGKILL), reported as vacated so the job is requeued."""
        key = (msg.job_id, msg.attempt)
        try:
            self._check_coordinator(peer, msg.term)
        except LeaseError as exc:
            return Ack(False, str(exc))
        run = self._runs.get(key)
        if run is not None:
            if msg.preempt:  # the ranks checkpoint within their grace: do not hold the order's reply
                if not run.vacated and not run.done:
                    run.vacated, run.preempted = f"preempted: {msg.preempt}", True
                    log.info("job %s attempt %d: %s; stopping its ranks here", msg.job_id, msg.attempt,
                             run.vacated)
                self.ctx.spawn(self.launcher.cancel(*key), f"preempt {msg.job_id}")
                return Ack()
            await self.launcher.cancel(*key)
        else:
            lease = self.leases.get(*key)
            if lease is not None and not lease.launched:
                self.leases.release(*key)
        return Ack()

    async def stop_all(self) -> None:
        """The daemon is stopping: kill every job's ranks here (their watchers report them vacated)."""
        self.stopping = True
        # Every job's ranks at once, each with its whole grace to checkpoint: N jobs take one grace.
        await asyncio.gather(*(self.launcher.cancel(*key) for key in list(self._runs)),
                             return_exceptions=True)
        for ev in self._store_done.values():
            ev.set()
