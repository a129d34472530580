"""The GPU-owner role: leases over this node's GPUs, launch/stop orders, rank output and exits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frenzyd.errors import FrenzyError, LaunchError, LeaseError, WireError
from frenzyd.jobs import (
    JobRecord,
)
from frenzyd.orch_common import (
    CHUNK,
    OUTPUT_BATCH_BYTES,
    OUTPUT_BUFFER_CAP,
    SEND_TIMEOUT_S,
    STORE_LINGER_S,
    RankRun,
    RoleBase,
)

log = logging.getLogger(__name__)


class RankHostRole(RoleBase):
    """The final authority over this node's GPUs; runs the ranks it is ordered to run."""

    def _check_coordinator(self, peer: str, term: int) -> None:
        v = self._view()
        self.leases.observe_term(v.term)
        if term < v.term or (term == v.term and v.coordinator not in (None, peer)):
            raise LeaseError(f"order from {peer[:12]} at term {term}: the coordinator of term {v.term} "
                             f"is {str(v.coordinator)[:12]}")

    async def _h_lease(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        gpus = [g for g in body["gpus"] if isinstance(g, str)]
        try:
            self._check_coordinator(peer, body["term"])
            offered = [g["uuid"] for g in self._gpus() if g.get("offered")]
            self.leases.grant(body["job_id"], gpus, term=body["term"], coordinator=peer, now=self.clock(),
                              offerable=offered)
        except LeaseError as exc:
            log.info("lease for job %s refused: %s", body["job_id"], exc)
            return {"ok": False, "reason": str(exc)}
        return {"ok": True}

    async def _h_release(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        lease = self.leases.get(body["job_id"])
        if lease is not None and not lease.launched and body["term"] >= lease.term:
            self.leases.release(body["job_id"])
        return {"ok": True}

    async def _h_launch(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        job_id, term = body["job_id"], body["term"]
        try:
            self._check_coordinator(peer, term)
            self.leases.check_order(job_id, term)
            rec = JobRecord.from_dict(body["record"])
        except (LeaseError, WireError) as exc:
            return {"ok": False, "reason": str(exc)}
        known = self._runs.get(job_id)
        if known is not None:
            return {"ok": True, "master_port": known.master_port}
        mine = [r for r in rec.ranks if r.peer == self.node_id]
        lease = self.leases.get(job_id)
        if not mine or lease is None or sorted(r.gpu for r in mine) != sorted(lease.gpus):
            return {"ok": False, "reason": "the order's ranks do not match this node's lease"}
        run_dir = self.data_dir / "runs" / job_id
        work, outdir = run_dir / "work", run_dir / "output"
        try:
            async def prepare() -> None:
                payload = await self._fetch_payload(rec)
                await asyncio.to_thread(self._unpack, payload, rec.spec.payload_sha256, work,
                                        self.max_payload_bytes)

            port = int(body["master_port"])
            if body["start_store"]:  # the store (a child process) starts while the payload comes
                store = asyncio.ensure_future(self.launcher.start_store(job_id, body["master_addr"]))
                try:
                    await prepare()
                finally:
                    port = await store
            else:
                await prepare()
            outdir.mkdir(parents=True, exist_ok=True)
            run = RankRun(job_id, term, rec.submitter, body["record"], mine, port,
                       hosts_store=body["start_store"])
            self._runs[job_id] = run
            handles = []
            local_world = len(mine)
            gpu_indices = tuple(r.gpu_index for r in sorted(mine, key=lambda r: r.local_rank))
            for r in mine:
                spec = self._rank_spec(
                    job_id=job_id, rank=r.rank, local_rank=r.local_rank, world_size=rec.world_size,
                    local_world_size=local_world, master_addr=body["master_addr"], master_port=port,
                    gpu_indices=gpu_indices, argv=list(rec.spec.argv), workdir=work, output_dir=outdir,
                    env={"FRENZY_JOB_ID": job_id, "FRENZY_PLAN": json.dumps(rec.plan or {}),
                         **({"FRENZY_STEPS": str(rec.spec.steps)} if rec.spec.steps else {})},
                    backend=body["backend"], socket_ifname=self.socket_ifname,
                )
                handles.append((r.rank, await self.launcher.launch(spec, self._on_output(run))))
        except (FrenzyError, OSError) as exc:
            log.warning("job %s: launch failed: %s", job_id, exc)
            self._runs.pop(job_id, None)
            with contextlib.suppress(Exception):
                await self.launcher.cancel(job_id)
            self.leases.release(job_id)
            return {"ok": False, "reason": str(exc)}
        self.leases.mark_launched(job_id)
        log.info("job %s: started rank(s) %s", job_id, [r.rank for r in mine])
        self._spawn(self._pump(run), f"output {job_id}")
        self._spawn(self._watch(run, handles, outdir, rank0_here=any(r.rank == 0 for r in mine)),
                    f"watch {job_id}")
        return {"ok": True, "master_port": port}

    async def _fetch_payload(self, rec: JobRecord) -> bytes:
        size = rec.spec.payload_size
        if size > self.max_payload_bytes:
            raise LaunchError(f"payload of {size} bytes exceeds this node's cap {self.max_payload_bytes}")
        buf = bytearray()
        while len(buf) < size:
            reply = await self._send(rec.submitter, "payload.fetch",
                                     {"job_id": rec.id, "offset": len(buf), "length": CHUNK}, SEND_TIMEOUT_S)
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
                    return
                run.out_event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await run.out_event.wait()
                continue
            batch, size = [], 0
            while run.out and size < OUTPUT_BATCH_BYTES:
                rank, stream, data = run.out.pop(0)
                run.out_bytes -= len(data)
                batch.append([rank, stream, data])
                size += len(data)
            if run.dropped:
                batch.insert(0, [-1, "frenzy", f"[{run.dropped} bytes of output dropped]\n".encode()])
                run.dropped = 0
            try:
                await self._send(run.submitter, "job.output", {"job_id": run.job_id, "chunks": batch},
                                 SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: output to submitter failed (%s)", run.job_id, exc)
                await asyncio.sleep(self.heartbeat_s)

    async def _watch(
        self, run: RankRun, handles: list[tuple[int, Any]], outdir: Path, rank0_here: bool
    ) -> None:
        """Wait for this node's ranks, then send results (rank 0) and exit codes to the submitter."""
        codes = [[rank, int(await h.wait())] for rank, h in handles]
        run.done = True
        run.out_event.set()
        if run.hosts_store and not (self._stopping or run.vacated):
            # Ranks elsewhere may still be tearing down their process group through the store:
            # it closes when the submitter says the job is over (job.finished), or after a while.
            done = self._store_done.setdefault(run.job_id, asyncio.Event())
            self._spawn(self._close_store_later(run.job_id, done), f"store {run.job_id}")
        else:
            with contextlib.suppress(Exception):
                await self.launcher.cancel(run.job_id)  # closes the rendezvous store, reaps stragglers
        for _ in range(100):
            if not run.out:
                break
            await asyncio.sleep(0.05)
        body: dict[str, Any] = {"job_id": run.job_id, "term": run.term, "codes": codes, "peer": self.node_id,
                                "record": run.record, "vacated": self._stopping or bool(run.vacated),
                                "reason": run.vacated or ("its daemon stopped" if self._stopping else "")}
        with contextlib.suppress(FrenzyError, OSError):
            if rank0_here and not body["vacated"]:
                data = await asyncio.to_thread(self._collect, outdir, self.max_result_bytes)
                for off in range(0, max(len(data), 1), CHUNK):
                    await self._send(run.submitter, "job.results", {"job_id": run.job_id, "offset": off,
                                     "total": len(data), "data": data[off:off + CHUNK]}, SEND_TIMEOUT_S)
        for attempt in range(1 if self._stopping else 30):
            try:
                await self._send(run.submitter, "job.exit", body, SEND_TIMEOUT_S)
                break
            except FrenzyError as exc:
                log.info("job %s: exit report to submitter failed (%s), retry %d", run.job_id, exc, attempt)
                await asyncio.sleep(self.heartbeat_s)
        coord = self._view().coordinator
        if coord is not None and coord != run.submitter:
            with contextlib.suppress(FrenzyError):
                await self._send(coord, "job.exit", body, SEND_TIMEOUT_S)
        self.leases.release(run.job_id)
        self._runs.pop(run.job_id, None)
        log.info("job %s: rank(s) here exited %s", run.job_id, codes)
        self.wake()

    async def _close_store_later(self, job_id: str, done: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STORE_LINGER_S):
                await done.wait()
        self._store_done.pop(job_id, None)
        await self.launcher.cancel(job_id)
        self.launcher.forget(job_id)

    async def _h_finished(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        """The submitter says a job is over: close its rendezvous store here."""
        ev = self._store_done.get(body["job_id"])
        if ev is not None:
            ev.set()
        return {"ok": True}

    async def protect_owner(self, gpus: list[dict[str, Any]]) -> list[str]:
        """Owner protection: vacate every job whose ranks share a GPU with a process that is not
        Frenzy's (the job is requeued elsewhere, not failed).  Returns the vacated job ids."""
        foreign = {g["uuid"] for g in gpus if int(g.get("foreign_processes") or 0) > 0}
        out = []
        for lease in self.leases.leases():
            run = self._runs.get(lease.job_id)
            hit = sorted(foreign & set(lease.gpus))
            if run is None or run.vacated or not hit:
                continue
            run.vacated = f"the owner of GPU {hit[0]} is using it"
            log.warning("job %s: %s; stopping its ranks here so it is requeued", lease.job_id, run.vacated)
            out.append(lease.job_id)
            await self.launcher.cancel(lease.job_id)
        return out

    async def _h_stop(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        job_id = body["job_id"]
        try:
            self._check_coordinator(peer, body["term"])
        except LeaseError as exc:
            return {"ok": False, "reason": str(exc)}
        if job_id in self._runs:
            await self.launcher.cancel(job_id)
        else:
            lease = self.leases.get(job_id)
            if lease is not None and not lease.launched:
                self.leases.release(job_id)
        return {"ok": True}
