"""What the orchestrator's roles share: message kinds, limits, injected interfaces, run state."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frenzyd import wire
from frenzyd.errors import FrenzyError
from frenzyd.job_store import JobStore
from frenzyd.jobs import (
    JobRecord,
    JobTable,
    LeaseTable,
    RankAssignment,
)

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
class RankRun:
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


class RoleBase:
    """State the three roles share (set by ``Orchestrator.__init__``) and the task helpers."""

    node_id: str
    node_name: str
    host: str
    data_dir: Path
    _send: Send
    _send_order: Send
    _view: Callable[[], ClusterView]
    _gpus: Callable[[], list[dict[str, Any]]]
    launcher: Any
    _rank_spec: Callable[..., Any]
    _pack_dir: Callable[[Path, int], tuple[bytes, str]]
    _unpack: Callable[[bytes, str, Path, int], Any]
    _collect: Callable[[Path, int], bytes]
    versions: Versions
    max_payload_bytes: int
    max_result_bytes: int
    heartbeat_s: float
    socket_ifname: str | None
    clock: Callable[[], float]
    store: JobStore
    leases: LeaseTable
    table: JobTable
    _table_term: int
    _reserved: dict[str, str]
    _placing: set[str]
    _acked: dict[str, tuple[str, int]]
    _runs: dict[str, RankRun]
    _tasks: set[asyncio.Task[Any]]
    _tg: asyncio.TaskGroup | None
    _wake: asyncio.Event
    _results_buf: dict[str, bytearray]
    _stopping: bool
    _resend_at: dict[str, float]
    _store_done: dict[str, asyncio.Event]
    _cancelling: set[str]

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run ``coro`` in the orchestrator's TaskGroup (strong reference kept, errors logged)."""
        if self._tg is None:
            coro.close()
            raise FrenzyError("the orchestrator is not running")
        try:
            task = self._tg.create_task(_guard(coro, name), name=name)
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


async def _guard(coro: Coroutine[Any, Any, Any], name: str) -> None:
    try:
        await coro
    except FrenzyError as exc:
        log.warning("%s: %s", name, exc)
    except Exception:  # a bug in one job's task must not take the daemon down
        log.exception("%s failed", name)


def own_codes(raw: Mapping[int, int], rec: JobRecord, peer: str) -> dict[int, int]:
    """The exit codes of the ranks ``rec`` gave to ``peer`` (a peer reports only its own ranks)."""
    mine = {a.rank for a in rec.ranks if a.peer == peer}
    return {r: c for r, c in raw.items() if r in mine}


def slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "node"
    return s[:40]


def host_of(address: str) -> str:
    """The host part of ``host:port`` (IPv6 in brackets allowed)."""
    if address.startswith("["):
        return address[1:address.index("]")]
    return address.rsplit(":", 1)[0] if ":" in address else address
