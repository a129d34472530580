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
import datetime as dt
import functools
import logging
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from frenzyd.config import Config
from frenzyd.errors import AuthError, ConfigError, ElectionError, FrenzyError, PeerError, WireError
from frenzyd.net import auth, tls, wire
from frenzyd.net.election import Change, ElectionState, PeerView
from frenzyd.net.peer_table import AddressBook, PeerRecord, PeerTable
from frenzyd.net.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

MSG_PATH = "/v1/msg"
CONTENT_TYPE = "application/x-frenzy-frame"
CONNECTIONS_PER_PEER = 8
"""Kept-alive TLS connections per peer (requests beyond this wait for a free one)."""
FRAME_OVERHEAD = 64 * 1024
"""Room for an envelope's certificate, signature and keys around a payload-sized body."""


@dataclass(frozen=True)
class Reply:
    """A handler's reply of a kind other than ``ok``."""

    kind: str
    body: dict[str, Any]


Handler = Callable[[str, Any], Awaitable[dict[str, Any] | Reply | None]]
"""``async handler(peer_id, message)`` → reply body (sent as ``ok``), a :class:`Reply`, or None.

``message`` is the kind's typed class (``wire.parse``), or the checked body for kinds without one."""

FallbackHandler = Callable[[str, wire.Message, bool], Awaitable[dict[str, Any] | Reply | None]]
"""``async on_message(peer_id, message, signed)`` for kinds without a registered handler."""


def _tls_peer_der(transport: asyncio.BaseTransport | None) -> bytes:
    if transport is None:
        return b""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return b""
    der = ssl_object.getpeercert(binary_form=True)
    return der or b""


def _response_der(resp: aiohttp.ClientResponse) -> bytes:
    # The connection is released as soon as a small body is complete, possibly before
    # we look; the protocol (and its transport) stays reachable on the response.
    conn = resp.connection
    if conn is not None and conn.transport is not None:
        return _tls_peer_der(conn.transport)
    proto = getattr(resp, "_protocol", None)
    return _tls_peer_der(getattr(proto, "transport", None))


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
        self._fallback = on_message
        self._report_provider = report_provider
        self._on_change = on_change
        self._on_peer = on_peer
        self._clock = clock
        t = config.timing
        self.max_frame_bytes = max_frame_bytes or config.launcher.max_payload_bytes + FRAME_OVERHEAD
        self.table = PeerTable(t.peer_timeout_s)
        self.book = AddressBook(base_s=t.heartbeat_s, max_s=max(8 * t.heartbeat_s, t.peer_timeout_s))
        for p in config.network.peers:
            self.book.add(str(p), "static", pinned=True)
        self.dropped: Counter[str] = Counter()
        self.auth_refusals: Counter[str] = Counter()
        self.send_failures: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.heartbeat_rounds = 0
        self._handlers: dict[str, tuple[Handler, bool]] = {}
        self._ratelog = RateLimitedLog(log, clock=clock)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._was_live: set[str] = set()
        self.port: int | None = None
        self.address = config.network.advertise_address
        self._progress: asyncio.Event | None = None

    # --- registration ------------------------------------------------------------------------

    def on(self, kind: str, handler: Handler, *, signed: bool = False) -> None:
        """Handle messages of ``kind``.  ``signed=True``: accept it only inside a verified
        ``signed`` envelope whose ``term`` the election accepts (orders that start/stop work)."""
        if kind not in wire.KINDS:
            raise ValueError(f"register the message kind {kind!r} with wire.register_kind first")
        if kind in ("heartbeat", wire.SIGNED_KIND):
            raise ValueError(f"{kind!r} is handled by the peer layer itself")
        self._handlers[kind] = (handler, signed)

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
        app = web.Application(client_max_size=self.max_frame_bytes)
        app.router.add_post(MSG_PATH, self._handle)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=max(0.5, self.config.timing.shutdown_deadline_s / 2),
        )
        await self._runner.setup()
        listen = self.config.network.listen
        site = web.TCPSite(
            self._runner,
            listen.host,
            listen.port,
            ssl_context=tls.server_context(self.creds, self._count_handshake_failure),
            backlog=128,
        )
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(
                f"cannot listen for peers on {listen}: {exc.strerror or exc}; is another frenzyd running? "
                "Change [network] listen or stop the other process"
            ) from exc
        self.port = site.port  # the real port when listen asks for port 0
        adv = self.config.network.advertise or listen.host
        self.address = f"[{adv}]:{self.port}" if ":" in adv else f"{adv}:{self.port}"
        connector = aiohttp.TCPConnector(
            ssl=tls.client_context(self.creds), limit=256, limit_per_host=CONNECTIONS_PER_PEER
        )
        self._session = aiohttp.ClientSession(connector=connector, raise_for_status=False)
        self._loop_task = asyncio.create_task(self._heartbeat_loop(), name="frenzy-heartbeats")
        log.info("peer API on %s (advertised as %s), node %s", listen, self.address, self.creds.node_id)

    async def stop(self) -> None:
        """Stop heartbeats, close the client session and the server (idempotent)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for task in list(self._inflight.values()):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the server side ---------------------------------------------------------------------

    def _count_handshake_failure(self, reason: str) -> None:
        self.auth_refusals[reason] += 1
        self._ratelog.warning(f"tls:{reason}", "refused a TLS connection: %s", reason)

    def _drop(self, reason: str, peer: str, detail: str) -> tuple[int, bytes]:
        self.dropped[reason] += 1
        self._ratelog.warning(f"drop:{reason}", "dropped a frame from %s: %s (%s)", peer, reason, detail)
        return self._error(reason, detail, 400)

    @staticmethod
    def _error(reason: str, detail: str, status: int) -> tuple[int, bytes]:
        return status, wire.encode("error", {"reason": reason, "detail": detail[:500]})

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            peer_id, peer_name = auth.peer_identity_from_der(
                self.creds.ca_pem, _tls_peer_der(request.transport)
            )
        except AuthError as exc:
            self.auth_refusals[exc.reason] += 1
            self._ratelog.warning(f"auth:{exc.reason}", "refused a request from %s: %s", request.remote, exc)
            status, frame = self._error(exc.reason, str(exc), 403)
        else:
            label = f"{peer_name} ({peer_id[:12]})"
            try:
                data = await request.read()
            except web.HTTPRequestEntityTooLarge:
                status, frame = self._drop("oversized", label, f"body over {self.max_frame_bytes} bytes")
            else:
                status, frame = await self._process(peer_id, label, data)
        return web.Response(body=frame, status=status, content_type=CONTENT_TYPE)

    async def _process(self, peer_id: str, label: str, data: bytes) -> tuple[int, bytes]:
        """Decode, authorise and dispatch one frame from an authenticated peer; return the HTTP
        status and the reply frame.  Never raises: every failure becomes an ``error`` frame."""
        try:
            msg = wire.decode(data, max_bytes=self.max_frame_bytes)
        except wire.FrameRejected as exc:
            return self._drop(exc.reason, label, exc.detail)
        self.received[msg.kind] += 1
        try:
            kind, body = await self._dispatch(peer_id, msg)
        except wire.FrameRejected as exc:
            return self._drop(exc.reason, label, exc.detail)
        except AuthError as exc:
            self.auth_refusals[exc.reason] += 1
            self._ratelog.warning(f"auth:{exc.reason}", "refused an order from %s: %s", label, exc)
            return self._error(exc.reason, str(exc), 403)
        except ElectionError as exc:
            reason = str(exc).split(":", 1)[0]
            self.dropped[reason] += 1
            self._ratelog.warning(f"term:{reason}", "refused an order from %s: %s", label, exc)
            return self._error(reason, str(exc), 409)
        except FrenzyError as exc:
            why: object = getattr(exc, "reason", None)
            return self._error(why if isinstance(why, str) else type(exc).__name__, str(exc), 400)
        except Exception:
            log.exception("handler for %r from %s failed", msg.kind, label)
            return self._error("internal", f"handler for {msg.kind!r} failed", 500)
        try:
            return 200, wire.encode(kind, body)
        except WireError:
            log.exception("handler for %r returned an invalid reply", msg.kind)
            return self._error("internal", "invalid reply", 500)

    async def _dispatch(self, peer_id: str, msg: wire.Message) -> tuple[str, dict[str, Any]]:
        if msg.kind == "heartbeat":
            if msg.body["node_id"] != peer_id:
                raise AuthError("identity_mismatch", "heartbeat names another node than its certificate")
            self._heard(msg.body)
            return "heartbeat", self._my_heartbeat()
        signed = False
        if msg.kind == wire.SIGNED_KIND:
            order = auth.open_order(
                self.creds.ca_pem,
                msg,
                sender_id=peer_id,
                now=dt.datetime.now(dt.UTC),
                max_bytes=self.max_frame_bytes,
            )
            msg, signed = order.message, True
            term = msg.body.get("term")
            if not isinstance(term, int) or isinstance(term, bool):
                raise wire.FrameRejected("schema", f"signed order {msg.kind!r} carries no integer 'term'")
            change = self.election.check_order(peer_id, term)
            if change is not None:
                self._changed(change)
        entry = self._handlers.get(msg.kind)
        if entry is None:
            if self._fallback is None:
                raise wire.FrameRejected("unknown_kind", f"no handler for {msg.kind!r} on this node")
            result = await self._fallback(peer_id, msg, signed)
        else:
            handler, needs_signature = entry
            if needs_signature and not signed:
                raise AuthError("unsigned_order", f"{msg.kind!r} must be sent signed")
            result = await handler(peer_id, wire.parse(msg))
        if isinstance(result, Reply):
            return result.kind, result.body
        return "ok", result or {}

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
            if address in self._inflight:
                continue
            task = asyncio.create_task(self._beat(address, frame), name=f"heartbeat {address}")
            self._inflight[address] = task
            task.add_done_callback(functools.partial(self._beat_done, address))
            started.append(task)
        if started:
            await asyncio.wait(started, timeout=wait_s)
        self.heartbeat_rounds += 1
        self.tick()
        self._notify()

    def _beat_done(self, address: str, task: asyncio.Task[None]) -> None:
        self._inflight.pop(address, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("heartbeat to %s failed unexpectedly", address, exc_info=exc)

    async def _beat(self, address: str, frame: bytes) -> None:
        try:
            peer_id, reply = await self._post(address, frame, self.config.timing.request_timeout_s, 1 << 20)
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
        try:
            self._heard(reply.body)
        except AuthError as exc:
            self.book.failed(address, self._clock())
            self.auth_refusals[exc.reason] += 1
            self._ratelog.warning(f"auth:{exc.reason}", "refused a heartbeat reply from %s: %s",
                                  address, exc)
            return
        self.book.succeeded(address, peer_id)

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

    # --- the client side ---------------------------------------------------------------------

    async def _post(
        self, address: str, frame: bytes, timeout_s: float, max_reply: int
    ) -> tuple[str, wire.Message]:
        if self._session is None:
            raise PeerError("not_started", "PeerNetwork.start() has not run")
        url = f"https://{address}{MSG_PATH}"
        try:
            async with self._session.post(
                url,
                data=frame,
                headers={"Content-Type": CONTENT_TYPE},
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                der = _response_der(resp)
                if resp.content_length is not None and resp.content_length > max_reply:
                    raise self._fail("oversized_reply", f"{address} replied {resp.content_length} bytes")
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > max_reply:
                        raise self._fail("oversized_reply", f"{address} replied over {max_reply} bytes")
                    chunks.append(chunk)
        except aiohttp.ClientConnectorCertificateError as exc:
            self.auth_refusals["untrusted_certificate"] += 1
            self._ratelog.warning(f"cert:{address}", "%s presented a certificate of another pool", address)
            raise self._fail("untrusted_certificate", f"{address}: {exc.certificate_error}") from exc
        except aiohttp.ClientSSLError as exc:
            raise self._fail("tls_handshake", f"{address}: {exc}") from exc
        except aiohttp.ClientConnectorError as exc:
            raise self._fail("unreachable", f"{address}: {exc.os_error}") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # Under TLS 1.3 a server that rejects our certificate shows it here, on the first read.
            raise self._fail("refused", f"{address} closed the connection: {exc}") from exc
        except TimeoutError as exc:
            raise self._fail("timeout", f"{address} did not answer within {timeout_s}s") from exc
        except aiohttp.ClientError as exc:
            raise self._fail("transport", f"{address}: {exc}") from exc
        try:
            peer_id, _ = auth.peer_identity_from_der(self.creds.ca_pem, der)
        except AuthError as exc:
            self.auth_refusals[exc.reason] += 1
            raise self._fail(exc.reason, f"{address}: {exc}") from exc
        try:
            reply = wire.decode(b"".join(chunks), max_bytes=max_reply)
        except wire.FrameRejected as exc:
            self.dropped[exc.reason] += 1
            raise self._fail("bad_reply", f"{address}: {exc}") from exc
        return peer_id, reply

    def _fail(self, reason: str, detail: str) -> PeerError:
        self.send_failures[reason] += 1
        return PeerError(reason, detail)

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
        return await self._send_frame(node_id, kind, frame, timeout, max_reply_bytes)

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
        return await self._send_frame(node_id, kind, frame, timeout, max_reply_bytes)

    async def _send_frame(
        self, node_id: str, kind: str, frame: bytes, timeout_s: float | None, max_reply_bytes: int | None
    ) -> wire.Message:
        if node_id == self.creds.node_id:
            # To ourselves: the same decode, checks and handlers, without the network.
            _, reply_frame = await self._process(node_id, "this node", frame)
            reply = wire.decode(reply_frame, max_bytes=max(len(reply_frame), 1))
            self.sent[kind] += 1
            if reply.kind == "error":
                raise PeerError(reply.body["reason"], reply.body.get("detail", ""))
            return reply
        rec = self.table.get(node_id)
        if rec is None:
            raise self._fail("unknown_peer", f"no address known for node {node_id[:12]}")
        peer_id, reply = await self._post(
            rec.address,
            frame,
            timeout_s or self.config.timing.request_timeout_s,
            max_reply_bytes or self.max_frame_bytes,
        )
        if peer_id != node_id:
            self.auth_refusals["wrong_peer"] += 1
            raise self._fail("wrong_peer", f"{rec.address} is node {peer_id[:12]}, not {node_id[:12]}")
        self.sent[kind] += 1
        if reply.kind == "error":
            raise PeerError(reply.body["reason"], reply.body.get("detail", ""))
        return reply

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
