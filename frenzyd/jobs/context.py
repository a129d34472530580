"""What the three job roles share: limits, the injected send/view/spawn interfaces, and run state."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from frenzyd.errors import FrenzyError
from frenzyd.jobs.model import JobRecord, RankAssignment
from frenzyd.net.wire import Body

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


Send = Callable[[str, Body, float], Awaitable[dict[str, Any]]]
"""send(node_id, message, timeout) -> the reply's body; raises FrenzyError when it cannot."""


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the election and the peer table know now."""

    coordinator: str | None
    term: int
    peers: Mapping[str, Mapping[str, Any]]
    """Live, authenticated peers (this node included) -> their latest report (``Orchestrator.report``)."""


@dataclass(frozen=True, slots=True)
class Versions:
    python: str
    torch: str


@dataclass(frozen=True, slots=True)
class RoleContext:
    """The small surface every role gets: who this node is, how to reach peers, time and tasks."""

    node_id: str
    node_name: str
    send: Send
    """Send a message to a peer; the reply body comes back."""
    send_order: Send
    """Send an order signed with this node's key (``job.launch``, ``job.stop``)."""
    view: Callable[[], ClusterView]
    spawn: Callable[[Coroutine[Any, Any, Any], str], None]
    """Run a coroutine in the orchestrator's TaskGroup (strong reference, errors logged)."""
    wake: Callable[[], None]
    """Re-run the scheduling pass soon."""
    clock: Callable[[], float] = time.time
    heartbeat_s: float = 1.0
    lease_timeout_s: float = 30.0
    """How long a node's ranks outlive its daemon's silence (their supervisor kills them then)."""
    fenced: Counter[str] = field(default_factory=Counter)
    """Messages refused because they were about another attempt than the job's current one, by kind
    (``frenzy_stale_attempts_refused_total``)."""

    def stale(self, kind: str, why: object) -> None:
        """Count and log one refusal of a stale attempt's message."""
        self.fenced[kind] += 1
        log.info("refused %s: %s", kind, why)


@dataclass
class RankRun:
    """Ranks of one attempt of a job running on this node."""

    job_id: str
    attempt: int
    term: int
    submitter: str
    record: JobRecord
    ranks: list[RankAssignment]
    master_port: int
    out: list[tuple[int, str, bytes]] = field(default_factory=list)
    out_bytes: int = 0
    dropped: int = 0
    out_event: asyncio.Event = field(default_factory=asyncio.Event)
    pumped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the output pump has delivered (or given up on) everything after the ranks exited."""
    done: bool = False
    vacated: str = ""
    """Why this node stopped the ranks itself (owner came back, daemon stopping, the scheduler
    preempted the attempt); empty otherwise."""
    preempted: bool = False
    checkpoint_sent: int = -1
    """Newest checkpoint step of this attempt the submitter has taken from this node (-1: none)."""
    """Stopped by the scheduler's order (``JobStop.preempt``): the job is requeued, nothing was lost."""
    hosts_store: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.job_id, self.attempt)


async def guard(coro: Coroutine[Any, Any, Any], name: str) -> None:
    """Await one job task; a FrenzyError is logged, a bug is logged with its traceback."""
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
