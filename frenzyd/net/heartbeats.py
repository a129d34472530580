"""Heartbeats and liveness: who is in the pool, heard how recently, and the election ticked on it.

Every ``timing.heartbeat_s`` this node sends its heartbeat to every address it knows (static
peers, discovery, peers' reports) and gets the peer's heartbeat back; a heartbeat a peer sends
us is answered with ours.  Liveness is "heard within ``timing.peer_timeout_s``", and the
election is ticked after each round.  A slow address keeps its beat in flight and is skipped
until it finishes, so one unreachable peer never delays the others or the election; a bug in a
round is logged and the loop goes on.  :meth:`Heartbeats.wait_until` wakes on every round and
every heartbeat heard, so tests and callers wait on events, not sleeps.

With ``[network] membership = "swim"`` the membership protocol (``frenzyd.net.membership_net``)
keeps the pool's liveness, and a heartbeat -- this node's full report -- goes only where it is
needed (``targets``): to the coordinator, to the peers this node's jobs run on, and to addresses
whose node is not known yet (how a member first finds the pool).  Each answer brings that peer's
report back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from frenzyd.config import Config
from frenzyd.errors import AuthError, ElectionError, PeerError
from frenzyd.net import auth, wire
from frenzyd.net.dispatch import Counters
from frenzyd.net.election import Change, ElectionState, PeerView
from frenzyd.net.messages import Heartbeat, HeartbeatReport
from frenzyd.net.peer_table import AddressBook, PeerRecord, PeerTable
from frenzyd.net.transport import Transport

log = logging.getLogger(__name__)

MAX_HEARTBEAT_REPLY = wire.HEARTBEAT_MAX
"""Cap on a peer's heartbeat reply (bytes)."""


class Heartbeats:
    """This node's heartbeats: build, send, hear, and the liveness and election they drive.

    ``rounds`` counts the heartbeat rounds sent.  ``report_provider()`` adds to the report this
    node sends (a failing provider is logged, the heartbeat goes without it); ``on_change`` hears
    every election change, ``on_peer(record, revived)`` every heartbeat heard.
    """

    def __init__(
        self,
        config: Config,
        creds: auth.Credentials,
        election: ElectionState,
        *,
        table: PeerTable,
        book: AddressBook,
        transport: Transport,
        counters: Counters,
        report_provider: Callable[[], dict[str, Any]] | None = None,
        on_change: Callable[[Change], None] | None = None,
        on_peer: Callable[[PeerRecord, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.creds = creds
        self.election = election
        self.table = table
        self.book = book
        self.transport = transport
        self.counters = counters
        self._report_provider = report_provider
        self._on_change = on_change
        self._on_peer = on_peer
        self._clock = clock
        self.targets: Callable[[HeartbeatReport], set[str]] | None = None
        """Set by the membership layer: the nodes to heartbeat, given this node's report (None: all)."""
        self.view_listeners: list[Callable[[Change], None]] = []
        """Told of every election change before ``on_change`` (the membership layer gossips the view)."""
        self.unreachable_listeners: list[Callable[[str], None]] = []
        """Told the node id of a known peer whose heartbeat found nothing listening (the connection
        refused: the process is gone).  A timeout or a connection closed by the peer is not told: a
        loaded peer does both while alive.  The membership layer suspects it."""
        self.rounds = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._was_live: set[str] = set()
        self._progress: asyncio.Event | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the heartbeat loop (the transport must be started)."""
        self._loop_task = asyncio.create_task(self._loop(), name="frenzy-heartbeats")

    async def stop(self) -> None:
        """Stop the heartbeat loop (idempotent)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None

    def add_address(self, address: str, hints: Mapping[str, str] | None = None, source: str = "mdns") -> None:
        """Learn an address to dial (discovery's ``on_found``).  A hint naming another pool is
        skipped (counted); membership is still proved by TLS, hints are only hints."""
        if hints and hints.get("pool") and hints.get("pool") != self.creds.pool_id:
            self.counters.auth_refusals["foreign_pool_hint"] += 1
            return
        if hints and hints.get("id") == self.creds.node_id:
            self.book.succeeded(address, self.creds.node_id, is_self=True)
            return
        if self.book.add(address, source):
            log.debug("learned address %s from %s", address, source)

    # --- one heartbeat -----------------------------------------------------------------------

    def build(self) -> Heartbeat:
        """This node's heartbeat; its report is this node's Python version and what the report
        provider adds (a provider that fails, or gives a report of the wrong shape, is logged and
        left out)."""
        v = self.election.view()
        python = ".".join(str(v) for v in sys.version_info[:3])
        report = HeartbeatReport(python=python)
        if self._report_provider is not None:
            try:
                report = HeartbeatReport.from_dict({"python": python, **self._report_provider()})
            except Exception:
                log.exception("report provider failed; sending a heartbeat without its report")
        return Heartbeat(
            node_id=self.creds.node_id,
            name=self.creds.node_name,
            address=self.transport.address,
            priority=v.priority,
            term=v.term,
            coordinator=v.coordinator,
            report=report,
        )

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """A peer's heartbeat body (its node id matched to its certificate): record it, return ours.
        Raises :class:`~frenzyd.net.wire.FrameRejected` (``schema``) for a report of the wrong shape."""
        self.heard(Heartbeat.from_body(body))
        return self.build().to_body()

    def heard(self, hb: Heartbeat) -> None:
        """Record an authenticated heartbeat: the peer table, the election's view, its address."""
        self.election.check_term(hb.term)  # ElectionError: refused before anything is recorded
        now = self._clock()
        rec, revived = self.table.heard(hb, now)
        self.election.observe(PeerView(rec.node_id, rec.priority, rec.term, rec.coordinator))
        if rec.address and rec.address != self.transport.address:
            self.book.add(rec.address, "report")
        self._announce(rec, revived, "")

    def member_seen(self, rec: PeerRecord, revived: bool) -> None:
        """The membership protocol changed what it says of a peer: tell ``on_peer`` and the waiters."""
        self._announce(rec, revived, " (membership)")

    def _announce(self, rec: PeerRecord, revived: bool, how: str) -> None:
        if revived:
            log.info("peer %s (%s) at %s is live%s", rec.name, rec.node_id[:12], rec.address, how)
        if self._on_peer is not None:
            try:
                self._on_peer(rec, revived)
            except Exception:
                log.exception("on_peer callback failed")
        self._notify()

    def changed(self, change: Change) -> None:
        """Log an election change and pass it on (also for changes a signed order causes)."""
        log.info(
            "election: %s -> %s, coordinator %s, term %d (%s)",
            change.before.role.value,
            change.after.role.value,
            change.after.coordinator,
            change.after.term,
            change.reason,
        )
        for listener in self.view_listeners:
            listener(change)
        if self._on_change is not None:
            try:
                self._on_change(change)
            except Exception:
                log.exception("on_change callback failed")

    # --- rounds ------------------------------------------------------------------------------

    def tick(self) -> Change | None:
        """Re-evaluate liveness and the election now (also run after every heartbeat round)."""
        now = self._clock()
        live = set(self.table.live(now))
        for gone in self._was_live - live:
            rec = self.table.get(gone)
            log.warning(
                "peer %s (%s) is not live: no heartbeat for %.1fs",
                rec.name if rec else "?",
                gone[:12],
                self.config.timing.peer_timeout_s,
            )
        self._was_live = live
        change = self.election.tick(now, live)
        if change is not None:
            self.changed(change)
        return change

    async def once(self, *, wait_s: float | None = None) -> None:
        """One round: heartbeat every due address concurrently, then tick the election.

        Waits for this round's replies at most ``wait_s`` (None: until all are done);
        a slow address keeps its beat in flight and is skipped until it finishes, so
        one unreachable peer never delays the others' heartbeats or the election.
        """
        hb = self.build()
        frame = wire.encode_message(hb)
        started: list[asyncio.Task[None]] = []
        for address in self._due(hb.report):
            beat = functools.partial(self._beat, address, frame)
            task = self.transport.begin(address, beat, f"heartbeat to {address}")
            if task is not None:
                started.append(task)
        if started:
            await asyncio.wait(started, timeout=wait_s)
        self.rounds += 1
        self.tick()
        self._notify()

    def _due(self, report: HeartbeatReport) -> list[str]:
        """Addresses to heartbeat now: every due one, or (with ``targets``) those of the target nodes
        and those whose node is not known yet."""
        now = self._clock()
        if self.targets is None:
            return self.book.due(now)
        wanted = self.targets(report) - {self.creds.node_id}
        known = self.book.addresses()
        dialled = {n for n in known.values() if n is not None}
        for node_id in wanted - dialled:  # a target learnt by gossip: dial where it says it is
            rec = self.table.get(node_id)
            if rec is not None and rec.address:
                self.book.add(rec.address, "member")
        known = self.book.addresses()
        # An address no heartbeat has answered yet is dialled to learn its node, unless the membership
        # protocol already knows a member there (mDNS finds every member: at start that would be a
        # heartbeat from each member to each other, the mesh's n^2 on a pool that just formed).
        members_at = {r.address: r.node_id for r in self.table.records() if r.member}
        due = []
        for a in self.book.due(now):
            who = known.get(a) or members_at.get(a)
            if who is None or who in wanted:
                due.append(a)
        return due

    async def _beat(self, address: str, frame: bytes) -> None:
        timeout_s = self.config.timing.request_timeout_s
        try:
            peer_id, reply = await self.transport.post(address, frame, timeout_s, MAX_HEARTBEAT_REPLY)
        except PeerError as exc:
            self.book.failed(address, self._clock())
            log.debug("heartbeat to %s failed: %s", address, exc)
            node_id = self.book.addresses().get(address)
            if node_id is not None and exc.reason == "unreachable":  # refused to connect: nothing listens
                for listener in self.unreachable_listeners:
                    listener(node_id)
            return
        if peer_id == self.creds.node_id:
            self.book.succeeded(address, peer_id, is_self=True)
            return
        if reply.kind != "heartbeat" or reply.body.get("node_id") != peer_id:
            self.book.failed(address, self._clock())
            self.counters.auth_refusals["identity_mismatch"] += 1
            return
        try:
            hb = Heartbeat.from_body(reply.body)
        except wire.FrameRejected as exc:
            self.book.failed(address, self._clock())
            self.counters.dropped[exc.reason] += 1
            log.debug("heartbeat reply from %s dropped: %s", address, exc)
            return
        try:
            self.heard(hb)
        except ElectionError as exc:  # a term out of range or too far ahead
            self.book.failed(address, self._clock())
            self.counters.dropped[str(exc).split(":", 1)[0]] += 1
            log.warning("refused the heartbeat reply from %s: %s", address, exc)
            return
        except AuthError as exc:  # the same node id is live at another address
            self.book.failed(address, self._clock())
            self.counters.auth_refusals[exc.reason] += 1
            log.warning("refused the heartbeat reply from %s: %s", address, exc)
            return
        self.book.succeeded(address, peer_id)

    async def _loop(self) -> None:
        period = self.config.timing.heartbeat_s
        while True:
            started = self._clock()
            try:
                await self.once(wait_s=period)
            except Exception:  # a bug here must not end liveness for the whole node
                log.exception("heartbeat round failed")
            await asyncio.sleep(max(0.0, period - (self._clock() - started)))

    # --- waiting and views -------------------------------------------------------------------

    def _notify(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = asyncio.Event()

    async def wait_until(self, predicate: Callable[[], bool], within_s: float) -> bool:
        """Wait (at most ``within_s``) until ``predicate()`` holds; it is re-checked after every
        heartbeat round and every heartbeat received.  Returns whether it came true."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._progress is None:
                self._progress = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), remaining)
        return True

    def live_peers(self) -> list[str]:
        """Node ids of the peers heard within the timeout."""
        return self.table.live(self._clock())

    def reports(self) -> dict[str, dict[str, Any]]:
        """Live peers' latest heartbeat reports by node id, this node's own included."""
        now = self._clock()
        live = (rec for p in self.table.live(now) if (rec := self.table.get(p)) is not None)
        out = {rec.node_id: rec.report.to_dict() for rec in live}
        out[self.creds.node_id] = self.build().report.to_dict()
        return out

    def peers_status(self) -> list[dict[str, Any]]:
        """Every peer ever heard (this node first) as ``{"id", "name", "address", "alive", "report"}``
        for the status JSON (DESIGN.md §6); ``report`` is the peer's latest heartbeat report."""
        now = self._clock()
        me = {
            "id": self.creds.node_id,
            "name": self.creds.node_name,
            "address": self.transport.address,
            "alive": True,
            "report": self.build().report.to_dict(),
        }
        others = [
            {
                "id": r.node_id,
                "name": r.name,
                "address": r.address,
                "alive": self.table.is_alive(r.node_id, now),
                "report": r.report.to_dict(),
            }
            for r in sorted(self.table.records(), key=lambda r: r.name)
        ]
        return [me, *others]
