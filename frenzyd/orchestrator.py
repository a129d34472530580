"""Job orchestration across the pool: submitter, coordinator and GPU-owner roles of one daemon.

Every daemon plays three roles at once (DESIGN.md §5):

* **submitter** of the jobs its users submit: keeps their authoritative records, payloads
  and logs (``JobStore``), (re)submits queued jobs to the current coordinator, receives
  output, exits and rank 0's results from the peers that run the ranks;
* **coordinator** (when elected): soft job table, MARP/HAS placement over the live peers'
  reported GPUs, lease requests, then signed, term-bound launch orders (rank 0's peer first:
  it starts the rendezvous store and answers with its port);
* **GPU owner**: the final authority over its own GPUs (``LeaseTable``), runs the ranks it is
  ordered to run through the launcher, streams their output to the submitter, reports exits.

Transport, election view, signing, GPU inventory and the launcher are injected
(``daemon.py`` wires the real ones), so this module holds the flow, not the mechanisms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frenzyd import wire
from frenzyd.errors import FrenzyError, JobStateError, LaunchError, LeaseError, WireError
from frenzyd.job_store import JobStore
from frenzyd.jobs import (
    TERMINAL,
    JobRecord,
    JobSpec,
    JobTable,
    LeaseTable,
    RankAssignment,
    new_record,
    record_exits,
    transition,
)
from frenzyd.placement import OfferedGpu, PeerOffer, Placement, QueuedJob, schedule
from frenzyd.state import merge_jobs

log = logging.getLogger(__name__)

CHUNK = 1 << 20
"""Payload and result bytes per message (well under the wire's default frame cap)."""
SEND_TIMEOUT_S = 10.0
LAUNCH_TIMEOUT_S = 120.0
OUTPUT_BATCH_BYTES = 64 * 1024
OUTPUT_BUFFER_CAP = 8 << 20
"""Unsent output kept per job while the submitter is unreachable; older chunks are dropped."""
KEEP_FINISHED = 200
STORE_LINGER_S = 120.0
"""Longest a job's rendezvous store outlives the ranks of its host when no job.finished comes."""
MAX_REPORTED_JOBS = 100
"""Unfinished jobs a node lists in its heartbeat report (the heartbeat reply is capped at 1 MiB)."""
RESUBMIT_S = 5.0
"""A submitter re-sends its unfinished jobs this often even when acknowledged (idempotent), so a
coordinator that lost its soft table (restart, new term) gets them back."""

# --- message kinds ------------------------------------------------------------------------------

_S = wire.Schema
_OPT_STR = (str, type(None))
MESSAGE_KINDS: dict[str, wire.Schema] = {
    "job.submit": _S(required={"record": dict}),
    "job.cancel": _S(required={"job_id": str}, optional={"requeue_attempts": int}),
    "job.state": _S(required={"record": dict}),
    "lease.request": _S(required={"job_id": str, "gpus": list, "term": int}),
    "lease.release": _S(required={"job_id": str, "term": int}),
    "job.launch": _S(required={"job_id": str, "term": int, "record": dict, "master_addr": str,
                               "master_port": int, "start_store": bool, "backend": str}),
    "job.stop": _S(required={"job_id": str, "term": int}),
    "payload.fetch": _S(required={"job_id": str, "offset": int, "length": int}),
    "job.output": _S(required={"job_id": str, "chunks": list}),
    "job.results": _S(required={"job_id": str, "offset": int, "total": int, "data": bytes}),
    "job.exit": _S(required={"job_id": str, "term": int, "codes": list, "peer": str},
                   optional={"record": dict, "vacated": bool, "reason": str}),
    "job.finished": _S(required={"job_id": str}),
}
for _kind, _schema in MESSAGE_KINDS.items():
    wire.register_kind(_kind, _schema)

SIGNED_KINDS = frozenset({"job.launch", "job.stop"})
"""Orders that start or stop processes: sent signed and bound to the coordinator's term."""


# --- what the daemon injects -------------------------------------------------------------------

Send = Callable[[str, str, dict[str, Any], float], Awaitable[dict[str, Any]]]
"""send(node_id, kind, body, timeout) -> reply body; raises FrenzyError when it cannot."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the election and the peer table know now."""

    coordinator: str | None
    term: int
    peers: Mapping[str, Mapping[str, Any]]
    """Live, authenticated peers (this node included) -> their latest report (``Orchestrator.report``)."""


@dataclass
class Versions:
    python: str
    torch: str


@dataclass
class _Run:
    """Ranks of one job running on this node."""

    job_id: str
    term: int
    submitter: str
    record: dict[str, Any]
    ranks: list[RankAssignment]
    master_port: int
    out: list[tuple[int, str, bytes]] = field(default_factory=list)
    out_bytes: int = 0
    dropped: int = 0
    out_event: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False
    vacated: str = ""
    """Why this node stopped the ranks itself (owner came back, daemon stopping); empty otherwise."""
    hosts_store: bool = False


class Orchestrator:
    """The job flow of one daemon; ``run()`` is its main loop, ``handlers()`` its message handlers."""

    def __init__(
        self,
        *,
        node_id: str,
        node_name: str,
        data_dir: Path,
        host: str,
        send: Send,
        send_order: Send,
        view: Callable[[], ClusterView],
        gpus: Callable[[], list[dict[str, Any]]],
        launcher: Any,
        rank_spec: Callable[..., Any],
        pack_dir: Callable[[Path, int], tuple[bytes, str]],
        unpack: Callable[[bytes, str, Path, int], Any],
        collect_results: Callable[[Path, int], bytes],
        versions: Versions,
        max_payload_bytes: int = 64 << 20,
        max_result_bytes: int = 64 << 20,
        heartbeat_s: float = 1.0,
        socket_ifname: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id, self.node_name, self.host = node_id, node_name, host
        self.data_dir = data_dir
        self._send, self._send_order, self._view, self._gpus = send, send_order, view, gpus
        self.launcher, self._rank_spec = launcher, rank_spec
        self._pack_dir, self._unpack, self._collect = pack_dir, unpack, collect_results
        self.versions = versions
        self.max_payload_bytes, self.max_result_bytes = max_payload_bytes, max_result_bytes
        self.heartbeat_s, self.socket_ifname, self.clock = heartbeat_s, socket_ifname, clock
        self.store = JobStore(data_dir)
        self.leases = LeaseTable()
        self.table = JobTable()
        self._table_term = -1
        self._reserved: dict[str, str] = {}  # gpu uuid -> job id (coordinator: placements in flight)
        self._placing: set[str] = set()
        self._acked: dict[str, tuple[str, int]] = {}  # submitter: job -> (coordinator, term) that has it
        self._runs: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._wake = asyncio.Event()
        self._results_buf: dict[str, bytearray] = {}
        self._stopping = False
        self._resend_at: dict[str, float] = {}
        self._store_done: dict[str, asyncio.Event] = {}
        self._cancelling: set[str] = set()

    # --- lifecycle --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Main loop until ``stop`` is set: coordinate when elected, (re)submit, expire leases."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                while not stop.is_set():
                    try:
                        await self.tick()
                    except FrenzyError as exc:
                        log.warning("orchestrator tick: %s", exc)
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.heartbeat_s):
                            waiters = (asyncio.ensure_future(stop.wait()),
                                       asyncio.ensure_future(self._wake.wait()))
                            try:
                                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                            finally:
                                for w in waiters:
                                    w.cancel()
            finally:
                await self._shutdown()
                self._tg = None

    async def _shutdown(self, grace_s: float = 5.0) -> None:
        """Stop this node's ranks, let their watchers report them as vacated, cancel the rest."""
        self._stopping = True
        for job_id in list(self._runs):
            with contextlib.suppress(Exception):
                await self.launcher.cancel(job_id)
        for ev in self._store_done.values():
            ev.set()
        watchers = [t for t in self._tasks if t.get_name().startswith(("watch ", "output ", "store "))]
        if watchers:
            await asyncio.wait(watchers, timeout=grace_s)
        for t in list(self._tasks):
            t.cancel()

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        if self._tg is None:
            raise FrenzyError("the orchestrator is not running")
        task = self._tg.create_task(self._guard(coro, name), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _guard(coro: Awaitable[Any], name: str) -> None:
        try:
            await coro
        except FrenzyError as exc:
            log.warning("%s: %s", name, exc)
        except Exception:  # a bug in one job's task must not take the daemon down
            log.exception("%s failed", name)

    def wake(self) -> None:
        """Re-run the scheduling pass soon (a peer report or election change arrived)."""
        self._wake.set()

    async def tick(self) -> None:
        """One pass: lease expiry, submitter duties, coordinator duties."""
        now = self.clock()
        for lease in self.leases.expire_unlaunched(now, ttl_s=max(30.0, 10 * self.heartbeat_s)):
            log.info("lease of job %s expired before its launch order came", lease.job_id)
        v = self._view()
        self.leases.observe_term(v.term)
        self._ensure_table(v)
        await self._submitter_tick(v)
        if v.coordinator == self.node_id:
            await self._coordinator_tick(v)

    def _ensure_table(self, v: ClusterView) -> None:
        """Start a fresh soft job table when this node becomes coordinator of a new term."""
        if v.coordinator == self.node_id and self._table_term != v.term:
            log.info("coordinator for term %d: rebuilding the job view from peers' reports", v.term)
            self.table, self._reserved, self._placing, self._table_term = JobTable(), {}, set(), v.term
        elif v.coordinator != self.node_id and self._table_term != -1:
            log.info("no longer coordinator; dropping the soft job table")
            self.table, self._reserved, self._placing, self._table_term = JobTable(), {}, set(), -1

    # --- report and status --------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """This node's part of its heartbeat: versions, GPUs with leases, its jobs."""
        leased = self.leases.leased_gpus()
        gpus = [{**g, "leased_to": leased.get(g["uuid"])} for g in self._gpus()]
        mine = self.store.all()
        live = [r for r in mine if not r.terminal][-MAX_REPORTED_JOBS:]
        done = [r for r in mine if r.terminal][-20:]
        return {
            "python": self.versions.python,
            "torch": self.versions.torch,
            "gpus": gpus,
            "leases": [lease.to_dict() for lease in self.leases.leases()],
            "jobs": [r.summary() for r in live + done],
        }

    def jobs_view(self, v: ClusterView | None = None) -> list[dict[str, Any]]:
        """Every job this node knows: its own, the coordinator table, and peers' reports."""
        v = v or self._view()
        return merge_jobs([
            *(rep.get("jobs") or () for rep in v.peers.values()),
            (r.summary() for r in self.table.all()),
            (r.summary() for r in self.store.all()),
        ])

    # --- submitter --------------------------------------------------------------------------

    async def submit(self, request: Mapping[str, Any]) -> JobRecord:
        """Pack ``request['workdir']``, persist a queued job and hand it to the coordinator.

        ``request`` carries the JobSpec fields except payload hash/size and versions.
        Raises ``ConfigError``/``LaunchError`` with a message for the user.
        """
        workdir = Path(str(request.get("workdir") or ""))
        if not workdir.is_absolute() or not await asyncio.to_thread(workdir.is_dir):
            raise JobStateError(f"job directory {workdir} is not an absolute path to a directory")
        payload, sha = await asyncio.to_thread(self._pack_dir, workdir, self.max_payload_bytes)
        fields = {k: v for k, v in request.items() if k != "workdir"}
        fields.update(payload_sha256=sha, payload_size=len(payload), python_version=self.versions.python,
                      torch_version=self.versions.torch)
        try:
            spec = JobSpec.from_dict(fields)
        except WireError as exc:
            raise JobStateError(str(exc).removeprefix("job spec: ")) from None
        now = self.clock()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        job_id = f"{_slug(self.node_name)}-{stamp}-{secrets.token_hex(2)}"
        rec = new_record(job_id, spec, self.node_id, self.node_name, now)
        await asyncio.to_thread(self.store.create, rec, payload)
        log.info("job %s queued (%s)", job_id, " ".join(spec.argv))
        self.wake()
        return rec

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job submitted here: queued ones at once, running ones through the coordinator."""
        rec = self.store.get(job_id)
        if rec.terminal:
            return rec
        v = self._view()
        if rec.state == "running" or (v.coordinator is not None and rec.id in self._acked):
            if v.coordinator is None:
                raise JobStateError("no coordinator right now: the cancel cannot reach the ranks; "
                                    "retry shortly")
            self._cancelling.add(job_id)  # exits of the killed ranks now mean "cancelled"
            try:
                await self._send(v.coordinator, "job.cancel", {"job_id": job_id}, SEND_TIMEOUT_S)
            except FrenzyError:
                self._cancelling.discard(job_id)
                raise
        rec = self.store.get(job_id)
        if not rec.terminal:
            rec = transition(rec, "cancelled", now=self.clock(), message="cancelled by user")
            self.store.save(rec)
        return rec

    async def _submitter_tick(self, v: ClusterView) -> None:
        now = self.clock()
        for stored in self.store.all():
            rec = stored
            if rec.terminal:
                continue
            if rec.state == "running" and now - (rec.started_at or now) > 5 * self.heartbeat_s + 10:
                lost = [p for p in rec.peers() if not self._peer_has_job(v, p, rec.id)
                        and not self._peer_exited(rec, p)]
                if lost:
                    rec = transition(rec, "queued", now=now, message=f"lost ranks on peer {lost[0][:12]}")
                    self.store.save(rec)
                    self._acked.pop(rec.id, None)
                    log.warning("job %s: %s; requeued", rec.id, rec.message)
            acked = self._acked.get(rec.id) == (v.coordinator, v.term)
            if v.coordinator is None or (acked and now < self._resend_at.get(rec.id, 0)):
                continue
            self._resend_at[rec.id] = now + RESUBMIT_S
            try:
                reply = await self._send(v.coordinator, "job.submit", {"record": rec.to_dict()},
                                         SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: coordinator unreachable (%s); will retry", rec.id, exc)
                continue
            if reply.get("ok"):
                self._acked[rec.id] = (v.coordinator, v.term)

    @staticmethod
    def _peer_has_job(v: ClusterView, peer: str, job_id: str) -> bool:
        rep = v.peers.get(peer)
        if rep is None:
            return False
        return any(isinstance(x, Mapping) and x.get("job_id") == job_id for x in rep.get("leases") or ())

    @staticmethod
    def _peer_exited(rec: JobRecord, peer: str) -> bool:
        return all(r.rank in rec.exit_codes for r in rec.ranks if r.peer == peer)

    def _apply_placement(self, rec: JobRecord, body: Mapping[str, Any]) -> JobRecord:
        """Submitter: adopt the coordinator's placement carried in a state or exit message."""
        theirs = JobRecord.from_dict(body)
        if rec.state == "running" and theirs.state == "running" and theirs.attempts > rec.attempts:
            rec = transition(rec, "queued", now=self.clock(), message="placed again by the coordinator")
        if rec.state == "queued" and theirs.state == "running" and theirs.attempts > rec.attempts:
            rec = transition(rec, "running", now=self.clock(), plan=theirs.plan, ranks=theirs.ranks,
                             term=theirs.term, message="placed")
            self.store.save(rec)
            log.info("job %s running on %d rank(s), term %d", rec.id, rec.world_size, rec.term)
        return rec

    async def _h_state(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        theirs = JobRecord.from_dict(body["record"])
        rec = self.store.get(theirs.id)
        if rec.terminal:
            return {"ok": True, "state": rec.state}
        if theirs.state == "running":
            rec = self._apply_placement(rec, body["record"])
        elif theirs.state == "failed" and rec.state == "queued":
            rec = transition(rec, "failed", now=self.clock(), message=theirs.message)
            self.store.save(rec)
        elif theirs.state == "queued" and rec.state == "running" and theirs.term == 0:
            rec = transition(rec, "queued", now=self.clock(), message=theirs.message)
            self.store.save(rec)
            self._acked.pop(rec.id, None)
        return {"ok": True, "state": rec.state}

    async def _h_output(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        rec = self.store.get(body["job_id"])
        now = self.clock()
        for ch in body["chunks"]:
            if (isinstance(ch, list) and len(ch) == 3 and isinstance(ch[0], int) and isinstance(ch[1], str)
                    and isinstance(ch[2], bytes)):
                self.store.append_output(rec.id, ch[0], ch[1][:16], ch[2], now)
        return {"ok": True}

    async def _h_results(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        job_id, off, total, data = body["job_id"], body["offset"], body["total"], body["data"]
        self.store.get(job_id)
        if total > self.max_result_bytes or off < 0:
            raise LaunchError(f"results of {total} bytes exceed the cap of {self.max_result_bytes}")
        buf = self._results_buf.setdefault(job_id, bytearray())
        if off != len(buf):
            buf.clear()
            if off != 0:
                raise LaunchError("results arrived out of order")
        buf.extend(data)
        if len(buf) >= total:
            await asyncio.to_thread(self.store.write_results, job_id, bytes(buf))
            del self._results_buf[job_id]
        return {"ok": True}

    async def _h_exit(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        """A peer's ranks of a job exited: the submitter's record and the coordinator's view learn it."""
        raw = {c[0]: c[1] for c in body["codes"]
               if isinstance(c, list) and len(c) == 2 and all(isinstance(x, int) for x in c)}
        self._submitter_exit(peer, body, raw)
        await self._coordinator_exit(peer, body, raw)
        return {"ok": True}

    def _submitter_exit(self, peer: str, body: dict[str, Any], raw: dict[int, int]) -> None:
        job_id = body["job_id"]
        mine = self.store.find(job_id)
        if mine is not None and not mine.terminal:
            if "record" in body:
                mine = self._apply_placement(mine, body["record"])
            # A peer reports only the ranks it was given.
            codes = _own_codes(raw, mine, peer)
            if mine.term == body["term"] and mine.state == "running" and body.get("vacated"):
                why = str(body.get("reason") or "it stopped")
                rec = transition(mine, "queued", now=self.clock(),
                                 message=f"vacated by peer {peer[:12]}: {why}")
                self.store.save(rec)
                self._acked.pop(rec.id, None)
                log.warning("job %s: %s; requeued", rec.id, rec.message)
            elif mine.term == body["term"]:
                rec = record_exits(mine, codes, now=self.clock())
                if rec.state == "failed" and rec.id in self._cancelling:
                    rec = replace(rec, state="cancelled", message="cancelled by user")
                if rec != mine:
                    self.store.save(rec)
                if rec.terminal:
                    log.info("job %s %s: %s", rec.id, rec.state, rec.message)
                    self._spawn(self._announce_finished(rec), f"finished {rec.id}")

    async def _coordinator_exit(self, peer: str, body: dict[str, Any], raw: dict[int, int]) -> None:
        job_id = body["job_id"]
        known = self.table.get(job_id)
        current = known is not None and known.state == "running" and known.term == body["term"]
        if known is not None and current and body.get("vacated"):
            self.table.update(transition(known, "queued", now=self.clock(),
                                         message=f"peer {peer[:12]} stopped while running ranks"))
            self._unreserve(job_id)
            others = [p for p in known.peers() if p != peer]
            await self._stop_everywhere(known, self._view().term, only=others)
            self.wake()
        elif known is not None and current:
            done = record_exits(known, _own_codes(raw, known, peer), now=self.clock())
            self.table.update(done)
            if done.terminal:
                self._unreserve(job_id)
                self.wake()

    async def _h_payload(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        length = max(0, min(int(body["length"]), CHUNK))
        data, total = await asyncio.to_thread(self.store.payload, body["job_id"], int(body["offset"]), length)
        return {"ok": True, "data": data, "total": total}

    # --- coordinator ------------------------------------------------------------------------

    async def _coordinator_tick(self, v: ClusterView) -> None:
        for rec in self.table.running():
            gone = [p for p in rec.peers() if p not in v.peers]
            if gone:
                log.warning("job %s: peer %s lost; stopping its other ranks and requeueing it",
                            rec.id, gone[0][:12])
                self.table.update(transition(rec, "queued", now=self.clock(),
                                             message=f"peer {gone[0][:12]} lost"))
                self._unreserve(rec.id)
                await self._stop_everywhere(rec, v.term)
        self.table.forget_finished(KEEP_FINISHED)
        queue = [QueuedJob(q.id, q.spec, q.created_at)
                 for q in self.table.queued() if q.id not in self._placing]
        if not queue:
            return
        sched = await asyncio.to_thread(schedule, queue, self._offers(v), now_s=self.clock())
        for job_id, reason in sched.infeasible:
            cur = self.table.get(job_id)
            if cur is None or cur.state != "queued":
                continue
            failed = transition(cur, "failed", now=self.clock(), message=reason)
            self.table.update(failed)
            log.info("job %s cannot run in this pool: %s", job_id, reason)
            self._spawn(self._tell_submitter(failed), f"tell {job_id}")
        for job_id, pl in sched.start:
            cur = self.table.get(job_id)
            if cur is None or cur.state != "queued" or job_id in self._placing:
                continue
            self._placing.add(job_id)
            for r in pl.ranks:
                self._reserved[r.gpu] = job_id
            self._spawn(self._start(cur, pl, v), f"start {job_id}")

    def _offers(self, v: ClusterView) -> list[PeerOffer]:
        offers = []
        for nid, rep in sorted(v.peers.items()):
            gpus = []
            for g in rep.get("gpus") or ():
                try:
                    gpus.append(OfferedGpu(
                        uuid=str(g["uuid"]), index=int(g["index"]), type=str(g["type"]),
                        memory_bytes=int(g["memory_bytes"]), free_bytes=int(g["free_bytes"]),
                        simulated=bool(g.get("simulated")),
                        available=bool(g.get("offered")) and g.get("leased_to") is None
                        and str(g["uuid"]) not in self._reserved,
                    ))
                except (KeyError, TypeError, ValueError):
                    continue
            offers.append(PeerOffer(nid, str(rep.get("name", nid[:12])), str(rep.get("address", "")),
                                    str(rep.get("python", "")), str(rep.get("torch", "")), tuple(gpus)))
        return offers

    def _unreserve(self, job_id: str) -> None:
        for g in [g for g, j in self._reserved.items() if j == job_id]:
            del self._reserved[g]

    async def _start(self, rec: JobRecord, pl: Placement, v: ClusterView) -> None:
        """Lease on every chosen peer, launch rank 0's peer (store), then the others."""
        term = v.term
        by_peer: dict[str, list[RankAssignment]] = {}
        for r in pl.ranks:
            by_peer.setdefault(r.peer, []).append(r)
        granted: list[str] = []
        launched: list[str] = []
        try:
            for peer, ranks in by_peer.items():
                reply = await self._send(peer, "lease.request",
                                         {"job_id": rec.id, "gpus": [r.gpu for r in ranks], "term": term},
                                         SEND_TIMEOUT_S)
                if not reply.get("ok"):
                    raise LeaseError(f"peer {peer[:12]} refused the lease: {reply.get('reason', '?')}")
                granted.append(peer)
            running = transition(rec, "running", now=self.clock(), plan={**pl.plan, "backend": pl.backend},
                                 ranks=pl.ranks, term=term, message="placed")
            rank0 = pl.ranks[0].peer
            host0 = _host(str(v.peers.get(rank0, {}).get("address", "")))
            order = {"job_id": rec.id, "term": term, "record": running.to_dict(), "master_addr": host0,
                     "master_port": 0, "start_store": True, "backend": pl.backend}
            reply = await self._send_order(rank0, "job.launch", order, LAUNCH_TIMEOUT_S)
            launched.append(rank0)
            if not reply.get("ok"):
                raise LaunchError(f"peer {rank0[:12]} refused the launch: {reply.get('reason', '?')}")
            order.update(master_port=int(reply["master_port"]), start_store=False)
            others = [p for p in by_peer if p != rank0]
            replies = await asyncio.gather(
                *(self._send_order(p, "job.launch", order, LAUNCH_TIMEOUT_S) for p in others),
                return_exceptions=True,
            )
            launched.extend(others)
            for p, rep in zip(others, replies, strict=True):
                if isinstance(rep, BaseException):
                    raise LaunchError(f"peer {p[:12]} did not take the launch: {rep}")
                if not rep.get("ok"):
                    raise LaunchError(f"peer {p[:12]} refused the launch: {rep.get('reason')}")
            current = self.table.get(rec.id)
            if current is not None and current.state == "queued":
                self.table.update(running)
                log.info("job %s placed on %s (term %d)", rec.id,
                         ", ".join(f"{r.peer_name}:{r.gpu}" for r in pl.ranks), term)
                state = await self._tell_submitter(running)
                if state in TERMINAL:  # the submitter finished it meanwhile (cancelled): undo
                    self.table.update(transition(running, "cancelled", now=self.clock(),
                                                 message=f"submitter says {state}"))
                    await self._stop_everywhere(running, term)
            else:  # cancelled while we were launching
                await self._stop_everywhere(running, term)
        except (FrenzyError, OSError) as exc:
            log.warning("job %s: placement failed (%s); it stays queued", rec.id, exc)
            stub = transition(rec, "running", now=self.clock(), ranks=pl.ranks, term=term)
            if launched:
                await self._stop_everywhere(stub, term, only=launched)
            for peer in granted:
                with contextlib.suppress(FrenzyError, OSError):
                    await self._send(peer, "lease.release", {"job_id": rec.id, "term": term}, SEND_TIMEOUT_S)
            self._unreserve(rec.id)
        finally:
            self._placing.discard(rec.id)

    async def _tell_submitter(self, rec: JobRecord) -> str | None:
        """Send the job's new state to its submitter; return the submitter's state (None: unreachable)."""
        for attempt in range(5):
            try:
                reply = await self._send(rec.submitter, "job.state", {"record": rec.to_dict()},
                                         SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: submitter unreachable (%s), retry %d", rec.id, exc, attempt + 1)
                await asyncio.sleep(self.heartbeat_s)
            else:
                state = reply.get("state")
                return state if isinstance(state, str) else None
        return None

    async def _stop_everywhere(self, rec: JobRecord, term: int, only: list[str] | None = None) -> None:
        for peer in only if only is not None else rec.peers():
            try:
                await self._send_order(peer, "job.stop", {"job_id": rec.id, "term": term}, SEND_TIMEOUT_S)
            except (FrenzyError, OSError) as exc:
                log.info("job %s: stop order to %s failed: %s", rec.id, peer[:12], exc)

    async def _h_submit(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        v = self._view()
        if v.coordinator != self.node_id:
            return {"ok": False, "reason": "not the coordinator"}
        self._ensure_table(v)
        theirs = JobRecord.from_dict(body["record"])
        if theirs.submitter != peer:
            return {"ok": False, "reason": "a job can only be submitted by its submitter"}
        known = self.table.get(theirs.id)
        if known is None:
            if theirs.state == "queued":
                self.table.submit(theirs)
            elif theirs.state == "running":
                self.table.adopt(theirs)
        elif known.state == "running" and theirs.state == "queued" and theirs.attempts >= known.attempts:
            self.table.update(theirs)  # the submitter requeued it (its ranks were lost)
            self._unreserve(theirs.id)
            await self._stop_everywhere(known, v.term)
        self.wake()
        return {"ok": True}

    async def _h_cancel(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        rec = self.table.get(body["job_id"])
        if rec is None:
            return {"ok": True, "state": "unknown"}
        if rec.submitter != peer:
            return {"ok": False, "reason": "only the submitter can cancel a job"}
        if rec.terminal:
            return {"ok": True, "state": rec.state}
        self.table.update(transition(rec, "cancelled", now=self.clock(), message="cancelled by user"))
        if rec.state == "running":
            await self._stop_everywhere(rec, self._view().term)
        self._unreserve(rec.id)
        self.wake()
        return {"ok": True, "state": "cancelled"}

    # --- GPU owner --------------------------------------------------------------------------

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
            payload = await self._fetch_payload(rec)
            await asyncio.to_thread(self._unpack, payload, rec.spec.payload_sha256, work,
                                    self.max_payload_bytes)
            outdir.mkdir(parents=True, exist_ok=True)
            port = int(body["master_port"])
            if body["start_store"]:
                port = await self.launcher.start_store(job_id, body["master_addr"])
            run = _Run(job_id, term, rec.submitter, body["record"], mine, port,
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
                    env={"FRENZY_JOB_ID": job_id, "FRENZY_PLAN": json.dumps(rec.plan or {})},
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

    def _on_output(self, run: _Run) -> Callable[[int, str, bytes], None]:
        def on_output(rank: int, stream: str, data: bytes) -> None:
            run.out.append((rank, stream, data))
            run.out_bytes += len(data)
            while run.out_bytes > OUTPUT_BUFFER_CAP and len(run.out) > 1:
                _, _, old = run.out.pop(0)
                run.out_bytes -= len(old)
                run.dropped += len(old)
            run.out_event.set()
        return on_output

    async def _pump(self, run: _Run) -> None:
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

    async def _watch(self, run: _Run, handles: list[tuple[int, Any]], outdir: Path, rank0_here: bool) -> None:
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

    async def _announce_finished(self, rec: JobRecord) -> None:
        for peer in rec.peers():
            with contextlib.suppress(FrenzyError):
                await self._send(peer, "job.finished", {"job_id": rec.id}, SEND_TIMEOUT_S)

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

    # --- handler table ------------------------------------------------------------------------

    def handlers(self) -> dict[str, Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]]:
        """kind -> async handler(peer_id, body) -> reply body (sent as an ``ok`` frame).

        ``job.launch`` and ``job.stop`` must only be called after their signature was verified.
        """
        table = {
            "job.submit": self._h_submit, "job.cancel": self._h_cancel, "job.state": self._h_state,
            "lease.request": self._h_lease, "lease.release": self._h_release,
            "job.launch": self._h_launch, "job.stop": self._h_stop, "payload.fetch": self._h_payload,
            "job.output": self._h_output, "job.results": self._h_results, "job.exit": self._h_exit,
            "job.finished": self._h_finished,
        }
        return {k: self._safe(k, h) for k, h in table.items()}

    @staticmethod
    def _safe(
        kind: str, h: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
        async def handler(peer: str, body: dict[str, Any]) -> dict[str, Any]:
            try:
                return await h(peer, body)
            except FrenzyError as exc:
                return {"ok": False, "reason": str(exc)}
        return handler


def _own_codes(raw: Mapping[int, int], rec: JobRecord, peer: str) -> dict[int, int]:
    """The exit codes of the ranks ``rec`` gave to ``peer`` (a peer reports only its own ranks)."""
    mine = {a.rank for a in rec.ranks if a.peer == peer}
    return {r: c for r, c in raw.items() if r in mine}


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "node"
    return s[:40]


def _host(address: str) -> str:
    """The host part of ``host:port`` (IPv6 in brackets allowed)."""
    if address.startswith("["):
        return address[1:address.index("]")]
    return address.rsplit(":", 1)[0] if ":" in address else address


__all__ = ["MESSAGE_KINDS", "SIGNED_KINDS", "TERMINAL", "ClusterView", "Orchestrator", "Versions"]
