"""The peer layer's face: ``PeerNetwork`` composes the transport, the dispatcher and the heartbeats.

The parts, one concern each: ``transport`` (the mutual-TLS aiohttp server and client that carry
one frame each way), ``dispatch`` (decode a frame, check a signed order, run its handler, answer
or refuse with a counted reason) and ``heartbeats`` (heartbeats, liveness, the election ticks,
waiting on them).  The daemon and the tests use only this class: register handlers with
:meth:`PeerNetwork.on`, ``start``, ``send``/``send_signed``/``broadcast``, read the peer table,
the election and the counters, ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from frenzyd.config import Config
from frenzyd.errors import PeerError
from frenzyd.net import auth, wire
from frenzyd.net.dispatch import Counters, Dispatcher, FallbackHandler, Handler, Reply
from frenzyd.net.election import Change, ElectionState
from frenzyd.net.heartbeats import Heartbeats
from frenzyd.net.membership_net import Members
from frenzyd.net.peer_table import AddressBook, PeerRecord, PeerTable
from frenzyd.net.revocation import REVOCATIONS_FILE, RevocationGossip, RevocationState
from frenzyd.net.transport import CONNECTIONS_PER_PEER, CONTENT_TYPE, FRAME_OVERHEAD, MSG_PATH, Transport

log = logging.getLogger(__name__)

__all__ = ["CONNECTIONS_PER_PEER", "CONTENT_TYPE", "FRAME_OVERHEAD", "MSG_PATH", "FallbackHandler", "Handler",
           "PeerNetwork", "Reply"]


class PeerNetwork:
    """This node's side of the pool mesh: server, client, heartbeats, peer table, handlers.

    Counters for metrics (plain values): ``dropped`` (frames dropped, by reason),
    ``auth_refusals`` (by reason), ``send_failures`` (by reason), ``received`` and
    ``sent`` (by kind).  ``table`` is the peer table, ``book`` the address book.  The parts
    are ``dispatch``, ``transport`` and ``heartbeats``.
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
        election.max_term_jump = config.election.max_term_jump
        t = config.timing
        self.table = PeerTable(t.peer_timeout_s)
        self.book = AddressBook(base_s=t.heartbeat_s, max_s=max(8 * t.heartbeat_s, t.peer_timeout_s))
        for p in config.network.peers:
            self.book.add(str(p), "static", pinned=True)
        self.counters = Counters()
        caps = dict(config.network.frame_caps)
        self.dispatch = Dispatcher(
            creds,
            election,
            self.counters,
            # Payloads and results travel in 1 MiB chunks and every kind has its own cap, so no peer
            # frame needs more than the largest kind's: a peer cannot make this node buffer more.
            max_frame_bytes=max_frame_bytes or wire.largest_cap(caps),
            caps=caps,
            fallback=on_message,
            clock=clock,
        )
        self.revocations = RevocationState(creds.ca_pem, config.node.data_dir / REVOCATIONS_FILE,
                                           [config.pool.credentials / REVOCATIONS_FILE])
        """The pool CA's revocation list: removed nodes are refused at TLS and per frame, and forgotten."""
        self.dispatch.revocations = self.revocations
        self.transport = Transport(config, creds, self.dispatch, self.table, clock=clock)

        def _on_peer(rec: PeerRecord, revived: bool) -> None:
            if revived:
                self.gossip.peer_live(rec.node_id)
            if on_peer is not None:
                on_peer(rec, revived)
        self.heartbeats = Heartbeats(
            config,
            creds,
            election,
            table=self.table,
            book=self.book,
            transport=self.transport,
            counters=self.counters,
            report_provider=report_provider,
            on_change=on_change,
            on_peer=_on_peer,
            clock=clock,
        )
        self.dispatch.bind(self.heartbeats.answer, self.heartbeats.changed)
        self.members: Members | None = None
        """The membership protocol (``[network] membership = "swim"``), else None: the heartbeat mesh."""
        if config.network.membership == "swim":
            self.members = Members(config, creds, election, table=self.table, heartbeats=self.heartbeats,
                                   transport=self.transport, dispatch=self.dispatch, clock=clock)
        self.gossip = RevocationGossip(self.revocations, self.send, self.live_peers, self._forget_removed,
                                       self.counters)
        self.dispatch.on("revocations", self.gossip.handle)

    # --- what the parts know -----------------------------------------------------------------

    @property
    def port(self) -> int | None:
        """The port the server listens on (None before :meth:`start`)."""
        return self.transport.port

    @property
    def address(self) -> str:
        """This node's advertised ``host:port`` for peers."""
        return self.transport.address

    @property
    def max_frame_bytes(self) -> int:
        """The cap on one incoming frame (bytes)."""
        return self.dispatch.max_frame_bytes

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self.dispatch.max_frame_bytes = value

    @property
    def heartbeat_rounds(self) -> int:
        return self.heartbeats.rounds

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
        self.heartbeats.add_address(address, hints, source)
        if self.members is not None:
            self.members.found(address, hints)

    def _forget_removed(self, node_id: str) -> None:
        """A node the revocation list names: out of the peer table and the election's view."""
        if node_id == self.creds.node_id:
            log.error("this node (%s) was removed from the pool by its CA: peers refuse it; enrol it "
                      "again ('frenzy-client pool add-node') to rejoin", node_id[:12])
            return
        rec = self.table.get(node_id)
        self.table.forget(node_id)
        self.election.forget(node_id)
        if rec is not None:
            log.warning("peer %s (%s) was removed from the pool: forgotten", rec.name, node_id[:12])
        self.tick()

    def accept_revocations(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A revocation list from the client API (``revocations.json``'s JSON): adopt it if newer
        (and pass it on); RevocationError (an AuthError) when it is forged, malformed or older."""
        adopted = self.revocations.offer_file(json.dumps(dict(doc)).encode())
        return {"version": self.revocations.version, "adopted": adopted, **self.revocations.summary()}

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the server, open the client session and start the heartbeat loop."""
        await self.transport.start()
        if self.members is not None:
            self.members.start()
        self.heartbeats.start()
        self.gossip.start()

    async def stop(self) -> None:
        """Stop heartbeats, close the client session and the server (idempotent)."""
        await self.heartbeats.stop()
        if self.members is not None:
            await self.members.stop()
        await self.gossip.close()
        await self.transport.stop()

    # --- liveness ----------------------------------------------------------------------------

    def tick(self) -> Change | None:
        """Re-evaluate liveness and the election now (also run after every heartbeat round)."""
        return self.heartbeats.tick()

    async def heartbeat_once(self, *, wait_s: float | None = None) -> None:
        """One round: heartbeat every due address concurrently (waiting at most ``wait_s`` for the
        replies), then tick the election."""
        await self.heartbeats.once(wait_s=wait_s)

    async def wait_until(self, predicate: Callable[[], bool], within_s: float) -> bool:
        """Wait (at most ``within_s``) until ``predicate()`` holds; it is re-checked after every
        heartbeat round and every heartbeat received.  Returns whether it came true."""
        return await self.heartbeats.wait_until(predicate, within_s)

    def live_peers(self) -> list[str]:
        """Node ids of the peers heard within the timeout."""
        return self.heartbeats.live_peers()

    def reports(self) -> dict[str, dict[str, Any]]:
        """Live peers' latest heartbeat reports by node id, this node's own included."""
        return self.heartbeats.reports()

    def peers_status(self) -> list[dict[str, Any]]:
        """Every peer ever heard (this node first) as ``{"id", "name", "address", "alive", "report"}``
        for the status JSON (DESIGN.md §6)."""
        return self.heartbeats.peers_status()

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
