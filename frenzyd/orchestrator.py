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
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from frenzyd.errors import FrenzyError
from frenzyd.job_coordinator import CoordinatorRole
from frenzyd.job_store import JobStore
from frenzyd.job_submitter import SubmitterRole
from frenzyd.jobs import (
    TERMINAL,
    JobTable,
    LeaseTable,
)
from frenzyd.orch_common import (
    MAX_REPORTED_JOBS,
    MESSAGE_KINDS,
    SIGNED_KINDS,
    ClusterView,
    RankRun,
    Send,
    Versions,
)
from frenzyd.rank_host import RankHostRole
from frenzyd.state import merge_jobs

log = logging.getLogger(__name__)


class Orchestrator(SubmitterRole, CoordinatorRole, RankHostRole):
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
        self._runs: dict[str, RankRun] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._wake = asyncio.Event()
        self._results_buf: dict[str, bytearray] = {}
        self._stopping = False
        self._resend_at: dict[str, float] = {}
        self._store_done: dict[str, asyncio.Event] = {}
        self._cancelling: set[str] = set()

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

    async def _h_exit(self, peer: str, body: dict[str, Any]) -> dict[str, Any]:
        """A peer's ranks of a job exited: the submitter's record and the coordinator's view learn it."""
        raw = {c[0]: c[1] for c in body["codes"]
               if isinstance(c, list) and len(c) == 2 and all(isinstance(x, int) for x in c)}
        self._submitter_exit(peer, body, raw)
        await self._coordinator_exit(peer, body, raw)
        return {"ok": True}

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


__all__ = ["MESSAGE_KINDS", "SIGNED_KINDS", "TERMINAL", "ClusterView", "Orchestrator", "Versions"]
