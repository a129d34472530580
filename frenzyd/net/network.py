"""Peer transport: the mutual-TLS aiohttp server and client, heartbeats, the peer table and handlers.

Every daemon serves ``POST /v1/msg`` on ``[network] listen``: the request body is one
wire frame, the reply is one wire frame.  The TLS layer admits only certificates of
the pool CA; the handler then derives the sender's node id from its certificate, so
every message is attributed to an authenticated node.  Undecodable or oversized
frames, unknown kinds, bad signatures and stale terms are dropped (an ``error``
frame goes back), counted by reason, and logged rate-limited; nothing a peer sends
can raise into the server or the heartbeat loop.

Heartbeats: every ``timing.heartbeat_s`` this node sends its heartbeat to every
address it knows (static peers, discovery, peers' reports) and gets the peer's
heartbeat back; liveness is "heard within ``timing.peer_timeout_s``", and the
election is ticked after each round.  Orders that start or stop processes travel as
``signed`` envelopes (``send_signed``): verified against the pool CA and the TLS
sender, their ``term`` checked by the election, before the handler runs.  A message
addressed to this node itself goes through the same decode and checks without the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from frenzyd.config import Config
from frenzyd.errors import PeerError
from frenzyd.net import auth, wire
from frenzyd.net.dispatch import Counters, Dispatcher, FallbackHandler, Handler, Reply
from frenzyd.net.election import Change, ElectionState, PeerView
from frenzyd.net.peer_table import AddressBook, PeerRecord, PeerTable
from frenzyd.net.transport import CONNECTIONS_PER_PEER, CONTENT_TYPE, FRAME_OVERHEAD, MSG_PATH, Transport

log = logging.getLogger(__name__)

__all__ = ["CONNECTIONS_PER_PEER", "CONTENT_TYPE", "FRAME_OVERHEAD", "MSG_PATH", "FallbackHandler", "Handler",
           "PeerNetwork", "Reply"]


class PeerNetwork:
    """This node's side of the pool mesh: server, client, heartbeats, peer table, handlers.

    Counters for metrics (plain values): ``dropped`` (frames dropped, by reason),
    ``auth_refusals`` (by reason), ``send_failures`` (by reason), ``received`` and
    ``sent`` (by kind).  ``table`` is the peer table, ``book`` the address book.
    """

    def __init__(
        self,
        config: Config,
        creds: auth.Credentials,
        election: ElectionState,
        on_message: FallbackHandler | None = None,
        *,
        report_provider: Callable[[], dict[str, Any]] | None = None,
        on_change: Callable[[Change], None] | None = None,
        on_peer: Callable[[PeerRecord, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_frame_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.creds = creds
        self.election = election
        self._report_provider = report_provider
        self._on_change = on_change
        self._on_peer = on_peer
        self._clock = clock
        t = config.timing
        self.counters = Counters()
        self.dispatch = Dispatcher(
            creds,
            election,
            self.counters,
            max_frame_bytes=max_frame_bytes or config.launcher.max_payload_bytes + FRAME_OVERHEAD,
            fallback=on_message,
            clock=clock,
        )
        self.dispatch.bind(self._answer_heartbeat, self._changed)
        self.table = PeerTable(t.peer_timeout_s)
        self.book = AddressBook(base_s=t.heartbeat_s, max_s=max(8 * t.heartbeat_s, t.peer_timeout_s))
        for p in config.network.peers:
            self.book.add(str(p), "static", pinned=True)
        self.heartbeat_rounds = 0
        self.transport = Transport(config, creds, self.dispatch, self.table, clock=clock)
        self._loop_task: asyncio.Task[None] | None = None
        self._was_live: set[str] = set()
        self._progress: asyncio.Event | None = None

    @property
    def port(self) -> int | None:
        """The port the server listens on (None before :meth:`start`)."""
        return self.transport.port

    @property
    def address(self) -> str:
        """This node's advertised ``host:port`` for peers."""
        return self.transport.address

    # --- counters ----------------------------------------------------------------------------

    @property
    def max_frame_bytes(self) -> int:
        """The cap on one incoming frame (bytes)."""
        return self.dispatch.max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self.dispatch.max_frame_bytes = value

    @property
    def dropped(self) -> Counter[str]:
        return self.counters.dropped

    @property
    def auth_refusals(self) -> Counter[str]:
        return self.counters.auth_refusals

    @property
    def send_failures(self) -> Counter[str]:
        return self.counters.send_failures

    @property
    def received(self) -> Counter[str]:
        return self.counters.received

    @property
    def sent(self) -> Counter[str]:
        return self.counters.sent

    # --- registration ------------------------------------------------------------------------

    def on(self, kind: str, handler: Handler, *, signed: bool = False) -> None:
        """Handle messages of ``kind``.  ``signed=True``: accept it only inside a verified
        ``signed`` envelope whose ``term`` the election accepts (orders that start/stop work)."""
        self.dispatch.on(kind, handler, signed=signed)

    def add_address(self, address: str, hints: Mapping[str, str] | None = None, source: str = "mdns") -> None:
        """Learn an address to dial (discovery's ``on_found``).  A hint naming another pool is
        skipped (counted); membership is still proved by TLS, hints are only hints."""
        if hints and hints.get("pool") and hints.get("pool") != self.creds.pool_id:
            self.auth_refusals["foreign_pool_hint"] += 1
            return
        if hints and hints.get("id") == self.creds.node_id:
            self.book.succeeded(address, self.creds.node_id, is_self=True)
            return
        if self.book.add(address, source):
            log.debug("learned address %s from %s", address, source)

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the server, open the client session and start the heartbeat loop."""
        await self.transport.start()
        self._loop_task = asyncio.create_task(self._heartbeat_loop(), name="frenzy-heartbeats")

    async def stop(self) -> None:
        """Stop heartbeats, close the client session and the server (idempotent)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        await self.transport.stop()

    # --- heartbeats and liveness -------------------------------------------------------------

    def _my_heartbeat(self) -> dict[str, Any]:
        v = self.election.view()
        report: dict[str, Any] = {
            "python": ".".join(str(v) for v in sys.version_info[:3]),
        }
        if self._report_provider is not None:
            try:
                report.update(self._report_provider())
            except Exception:
                log.exception("report provider failed; sending a heartbeat without its report")
        return {
            "node_id": self.creds.node_id,
            "name": self.creds.node_name,
            "address": self.address,
            "priority": v.priority,
            "term": v.term,
            "coordinator": v.coordinator,
            "report": report,
        }

    def _answer_heartbeat(self, body: dict[str, Any]) -> dict[str, Any]:
        self._heard(body)
        return self._my_heartbeat()

    def _heard(self, body: dict[str, Any]) -> None:
        now = self._clock()
        rec, revived = self.table.heard(body, now)
        self.election.observe(PeerView(rec.node_id, rec.priority, rec.term, rec.coordinator))
        if rec.address and rec.address != self.address:
            self.book.add(rec.address, "report")
        if revived:
            log.info("peer %s (%s) at %s is live", rec.name, rec.node_id[:12], rec.address)
        if self._on_peer is not None:
            try:
                self._on_peer(rec, revived)
            except Exception:
                log.exception("on_peer callback failed")
        self._notify()

    def _changed(self, change: Change) -> None:
        log.info(
            "election: %s -> %s, coordinator %s, term %d (%s)",
            change.before.role.value,
            change.after.role.value,
            change.after.coordinator,
            change.after.term,
            change.reason,
        )
        if self._on_change is not None:
            try:
                self._on_change(change)
            except Exception:
                log.exception("on_change callback failed")

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
            self._changed(change)
        return change

    async def heartbeat_once(self, *, wait_s: float | None = None) -> None:
        """One round: heartbeat every due address concurrently, then tick the election.

        Waits for this round's replies at most ``wait_s`` (None: until all are done);
        a slow address keeps its beat in flight and is skipped until it finishes, so
        one unreachable peer never delays the others' heartbeats or the election.
        """
        frame = wire.encode("heartbeat", self._my_heartbeat())
        started: list[asyncio.Task[None]] = []
        for address in self.book.due(self._clock()):
            task = self.transport.begin(address, functools.partial(self._beat, address, frame),
                                        f"heartbeat to {address}")
            if task is not None:
                started.append(task)
        if started:
            await asyncio.wait(started, timeout=wait_s)
        self.heartbeat_rounds += 1
        self.tick()
        self._notify()

    async def _beat(self, address: str, frame: bytes) -> None:
        try:
            peer_id, reply = await self.transport.post(
                address, frame, self.config.timing.request_timeout_s, 1 << 20
            )
        except PeerError as exc:
            self.book.failed(address, self._clock())
            log.debug("heartbeat to %s failed: %s", address, exc)
            return
        if peer_id == self.creds.node_id:
            self.book.succeeded(address, peer_id, is_self=True)
            return
        if reply.kind != "heartbeat" or reply.body.get("node_id") != peer_id:
            self.book.failed(address, self._clock())
            self.auth_refusals["identity_mismatch"] += 1
            return
        self.book.succeeded(address, peer_id)
        self._heard(reply.body)

    async def _heartbeat_loop(self) -> None:
        period = self.config.timing.heartbeat_s
        while True:
            started = self._clock()
            try:
                await self.heartbeat_once(wait_s=period)
            except Exception:  # a bug here must not end liveness for the whole node
                log.exception("heartbeat round failed")
            await asyncio.sleep(max(0.0, period - (self._clock() - started)))

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
        out = {p: dict(rec.report) for p in self.table.live(now) if (rec := self.table.get(p)) is not None}
        out[self.creds.node_id] = self._my_heartbeat()["report"]
        return out

    def peers_status(self) -> list[dict[str, Any]]:
        """Every peer ever heard (this node first) as ``{"id", "name", "address", "alive", "report"}``
        for the status JSON (DESIGN.md §6); ``report`` is the peer's latest heartbeat report."""
        now = self._clock()
        me = {
            "id": self.creds.node_id,
            "name": self.creds.node_name,
            "address": self.address,
            "alive": True,
            "report": self._my_heartbeat()["report"],
        }
        others = [
            {
                "id": r.node_id,
                "name": r.name,
                "address": r.address,
                "alive": self.table.is_alive(r.node_id, now),
                "report": dict(r.report),
            }
            for r in sorted(self.table.records(), key=lambda r: r.name)
        ]
        return [me, *others]

    # --- sending ---------------------------------------------------------------------------

    async def send(
        self,
        node_id: str,
        kind: str,
        body: Mapping[str, Any],
        timeout: float | None = None,  # noqa: ASYNC109 (the interface daemon-orch codes against)
        *,
        max_reply_bytes: int | None = None,
    ) -> wire.Message:
        """Send one message to peer ``node_id``; return its reply.

        Raises PeerError: ``unknown_peer`` (no address), transport reasons
        (``unreachable``, ``timeout``, ``refused``, ...), ``wrong_peer`` (another node
        answered at that address), or the peer's own refusal reason (an ``error`` reply).
        """
        frame = wire.encode(kind, body)
        return await self.transport.send_frame(node_id, kind, frame, timeout, max_reply_bytes)

    async def send_signed(
        self,
        node_id: str,
        kind: str,
        body: dict[str, Any],
        timeout: float | None = None,  # noqa: ASYNC109 (the interface daemon-orch codes against)
        *,
        max_reply_bytes: int | None = None,
    ) -> wire.Message:
        """Send an order signed with this node's key (the body must carry the current ``term``)."""
        if "term" not in body:
            raise ValueError("signed orders carry the coordinator's 'term'")
        frame = wire.encode(wire.SIGNED_KIND, auth.seal_order(self.creds, kind, body))
        return await self.transport.send_frame(node_id, kind, frame, timeout, max_reply_bytes)

    async def broadcast(
        self,
        kind: str,
        body: Mapping[str, Any],
        timeout: float | None = None,  # noqa: ASYNC109 (the interface daemon-orch codes against)
        *,
        signed: bool = False,
    ) -> dict[str, wire.Message | PeerError]:
        """Send to every live peer concurrently; return each peer's reply or PeerError."""
        peers = self.live_peers()
        results: dict[str, wire.Message | PeerError] = {}

        async def one(p: str) -> None:
            try:
                if signed:
                    results[p] = await self.send_signed(p, kind, dict(body), timeout)
                else:
                    results[p] = await self.send(p, kind, body, timeout)
            except PeerError as exc:
                results[p] = exc

        async with asyncio.TaskGroup() as tg:
            for p in peers:
                tg.create_task(one(p))
        return results
