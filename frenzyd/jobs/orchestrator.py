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

Each role is its own object owning its state; they share a small ``RoleContext`` (node id,
send and signed send, cluster view, spawn, wake, clock).  Transport, election view, signing,
GPU inventory and the launcher are injected (``daemon.py`` wires the real ones), so this package
holds the flow, not the mechanisms.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from frenzyd.errors import AuthError, FrenzyError
from frenzyd.jobs.context import (
    MAX_REPORTED_JOBS,
    ClusterView,
    RoleContext,
    Send,
    Versions,
    guard,
)
from frenzyd.jobs.coordinator import CoordinatorRole
from frenzyd.jobs.messages import (
    SIGNED_KINDS,
    Ack,
    JobAttempt,
    JobCancel,
    JobCheckpoint,
    JobExit,
    JobFinished,
    JobLaunch,
    JobOutput,
    JobResults,
    JobState,
    JobStop,
    JobSubmit,
    LeaseRelease,
    LeaseRequest,
    PayloadFetch,
    Reply,
)
from frenzyd.jobs.model import TERMINAL, JobRecord, JobTable, LeaseTable
from frenzyd.jobs.placement import RestartCosts
from frenzyd.jobs.rank_host import RankHostRole
from frenzyd.jobs.status import merge_jobs
from frenzyd.jobs.store import JobStore
from frenzyd.jobs.submitter import PackDir, SubmitterRole
from frenzyd.net.wire import Body

log = logging.getLogger(__name__)

Handler = Callable[[str, Any], Awaitable[dict[str, Any]]]
"""``async handler(peer_id, typed message)`` -> the ``ok`` reply's body."""


class Orchestrator:
    """The job flow of one daemon: three roles, one TaskGroup; ``run()`` is its main loop."""

    def __init__(
        self,
        *,
        node_id: str,
        node_name: str,
        data_dir: Path,
        send: Send,
        send_order: Send,
        view: Callable[[], ClusterView],
        gpus: Callable[[], list[dict[str, Any]]],
        launcher: Any,
        rank_spec: Callable[..., Any],
        pack_dir: PackDir,
        unpack: Callable[[bytes, str, Path, int], Any],
        collect_results: Callable[[Path, int], bytes],
        versions: Versions,
        max_payload_bytes: int = 64 << 20,
        max_result_bytes: int = 64 << 20,
        heartbeat_s: float = 1.0,
        lease_timeout_s: float = 30.0,
        retention_s: float = 7 * 24 * 3600.0,
        unplaceable_after_s: float = 3600.0,
        min_run_s: float = 120.0,
        policy: str = "frenzy",
        restart_costs: tuple[float, float] | None = None,
        vacate_grace_s: float = 30.0,
        socket_ifname: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self._view, self._gpus = view, gpus
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._wake = asyncio.Event()
        self.ctx = RoleContext(node_id=node_id, node_name=node_name, send=send, send_order=send_order,
                               view=view, spawn=self._spawn, wake=self.wake, clock=clock,
                               heartbeat_s=heartbeat_s, lease_timeout_s=lease_timeout_s)
        self.submitter = SubmitterRole(self.ctx, JobStore(data_dir), pack_dir=pack_dir, versions=versions,
                                       max_payload_bytes=max_payload_bytes, max_result_bytes=max_result_bytes,
                                       unplaceable_after_s=unplaceable_after_s, unpack=unpack)
        self.coordinator = CoordinatorRole(
            self.ctx, min_run_s=min_run_s, policy=policy,
            restart=None if restart_costs is None else RestartCosts(*restart_costs))
        self.rank_host = RankHostRole(self.ctx, data_dir=data_dir, gpus=gpus, launcher=launcher,
                                      rank_spec=rank_spec, unpack=unpack, collect_results=collect_results,
                                      max_payload_bytes=max_payload_bytes, max_result_bytes=max_result_bytes,
                                      socket_ifname=socket_ifname, retention_s=retention_s,
                                      vacate_grace_s=vacate_grace_s)

    # --- what the daemon, the client API and tests read ------------------------------------------

    @property
    def store(self) -> JobStore:
        """The submitter's durable job records."""
        return self.submitter.store

    @property
    def table(self) -> JobTable:
        """The coordinator's soft job table (empty unless this node coordinates)."""
        return self.coordinator.table

    @property
    def leases(self) -> LeaseTable:
        """This node's GPU leases."""
        return self.rank_host.leases

    @property
    def launcher(self) -> Any:
        return self.rank_host.launcher

    async def submit(self, request: Any) -> JobRecord:
        """Queue a job submitted on this node (see ``SubmitterRole.submit``)."""
        return await self.submitter.submit(request)

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job submitted on this node (see ``SubmitterRole.cancel``)."""
        return await self.submitter.cancel(job_id)

    async def protect_owner(self, gpus: list[dict[str, Any]]) -> list[str]:
        """Vacate jobs on GPUs the owner uses (see ``RankHostRole.protect_owner``)."""
        return await self.rank_host.protect_owner(gpus)

    # --- tasks --------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coro`` in the orchestrator's TaskGroup (strong reference kept, errors logged)."""
        if self._tg is None:
            coro.close()
            raise FrenzyError("the orchestrator is not running")
        try:
            task = self._tg.create_task(guard(coro, name), name=name)
        except RuntimeError as exc:  # the TaskGroup is shutting down
            coro.close()
            raise FrenzyError(f"cannot start {name}: the orchestrator is stopping") from exc
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A task cancelled before its first step (the daemon stopping) never awaits ``coro``;
        # closing it then is a no-op for a finished coroutine and avoids "never awaited".
        task.add_done_callback(lambda _t: coro.close())

    def wake(self) -> None:
        """Re-run the scheduling pass soon (a peer report or election change arrived)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Main loop until ``stop`` is set: coordinate when elected, (re)submit, expire leases."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            self.rank_host.start()
            tg.create_task(self._renew_leases(stop), name="renew leases")
            try:
                while not stop.is_set():
                    try:
                        await self.tick()
                    except FrenzyError as exc:
                        log.warning("orchestrator tick: %s", exc)
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.ctx.heartbeat_s):
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

    async def _renew_leases(self, stop: asyncio.Event) -> None:
        """Renew the leases of the ranks here every heartbeat, apart from the tick: a tick can wait
        ``SEND_TIMEOUT_S`` on a frozen coordinator (a resubmission), longer than a lease, and the
        supervisors would kill healthy ranks that their submitter still confirms."""
        while not stop.is_set():
            try:
                self.rank_host.renew_leases(self._view())
            except Exception:
                log.exception("lease renewal failed; retrying next heartbeat")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ctx.heartbeat_s):
                    await stop.wait()

    async def _shutdown(self, grace_s: float = 5.0) -> None:
        """Stop this node's ranks, let their watchers report them as vacated, cancel the rest."""
        await self.rank_host.stop_all()
        watchers = [t for t in self._tasks if t.get_name().startswith(("watch ", "output ", "store "))]
        if watchers:
            await asyncio.wait(watchers, timeout=grace_s)
        for t in list(self._tasks):
            t.cancel()

    async def tick(self) -> None:
        """One pass: lease expiry, submitter duties, coordinator duties."""
        now = self.ctx.clock()
        for lease in self.leases.expire_unlaunched(now, ttl_s=max(30.0, 10 * self.ctx.heartbeat_s)):
            log.info("lease of job %s attempt %d expired before its launch order came", lease.job_id,
                     lease.attempt)
        v = self._view()
        self.leases.observe_term(v.term)
        self.rank_host.renew_leases(v)
        self.coordinator.ensure_table(v)
        await self.submitter.tick(v)
        if v.coordinator == self.node_id:
            await self.coordinator.tick(v)

    def report(self) -> dict[str, Any]:
        """This node's part of its heartbeat: versions, GPUs with leases, its jobs."""
        leased = self.leases.leased_gpus()
        gpus = [{**g, "leased_to": leased.get(g["uuid"])} for g in self._gpus()]
        mine = self.store.all()
        live = [r for r in mine if not r.terminal][-MAX_REPORTED_JOBS:]
        done = [r for r in mine if r.terminal][-20:]
        return {
            "python": self.submitter.versions.python,
            "torch": self.submitter.versions.torch,
            "gpus": gpus,
            "leases": [lease.to_dict() for lease in self.leases.leases()],
            "outbox": self.rank_host.outbox_report(),
            "jobs": [self.submitter.summary(r) for r in live + done],
        }

    def jobs_view(self, v: ClusterView | None = None) -> list[dict[str, Any]]:
        """Every job this node knows: its own, the coordinator table, and peers' reports."""
        v = v or self._view()
        jobs = merge_jobs([
            *(rep.get("jobs") or () for rep in v.peers.values()),
            (r.summary() for r in self.table.all()),
            (r.summary() for r in self.store.all()),
        ])
        for j in jobs:  # the submitter alone knows a trainer job's progress and measured memory
            rec = self.store.find(j["id"])
            if rec is not None and rec.spec.keeps_checkpoints:
                mine = self.submitter.summary(rec)
                j.update(progress=mine["progress"], memory=mine["memory"])
        return jobs

    async def _on_exit(self, peer: str, msg: JobExit) -> Ack:
        """A peer's ranks of a job exited: the submitter's record and the coordinator's view learn it."""
        self.submitter.on_exit(peer, msg)
        await self.coordinator.on_exit(peer, msg)
        return Ack()

    def handlers(self) -> dict[str, Handler]:
        """kind -> async handler(peer_id, typed message) -> reply body (sent as an ``ok`` frame).

        ``job.launch`` and ``job.stop`` must only be called after their signature was verified
        (``SIGNED_KINDS``).  A FrenzyError in a handler becomes a refusal with its message.
        """
        sub, coord, host = self.submitter, self.coordinator, self.rank_host
        table: dict[type[Body], Callable[[str, Any], Awaitable[Reply]]] = {
            JobSubmit: coord.on_submit, JobCancel: coord.on_cancel, JobState: sub.on_state,
            JobAttempt: sub.on_attempt,
            LeaseRequest: host.on_lease, LeaseRelease: host.on_release, JobLaunch: host.on_launch,
            JobStop: host.on_stop, PayloadFetch: sub.on_payload, JobCheckpoint: sub.on_checkpoint,
            JobOutput: sub.on_output,
            JobResults: sub.on_results, JobExit: self._on_exit, JobFinished: host.on_finished,
        }
        return {cls.KIND: self._safe(cls, h) for cls, h in table.items()}

    @staticmethod
    def _safe(kind: type[Body], h: Callable[[str, Any], Awaitable[Reply]]) -> Handler:
        async def handler(peer: str, msg: Any) -> dict[str, Any]:
            if not isinstance(msg, kind):
                raise TypeError(f"{kind.KIND} handler got {type(msg).__name__}, not {kind.__name__}")
            try:
                return (await h(peer, msg)).to_body()
            except AuthError:
                raise  # the dispatcher refuses it and counts it (frenzy_auth_refusals_total)
            except FrenzyError as exc:
                return Ack(False, str(exc)).to_body()
        return handler


__all__ = ["SIGNED_KINDS", "TERMINAL", "ClusterView", "Orchestrator", "Versions"]
