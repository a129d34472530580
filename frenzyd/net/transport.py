"""Peer transport: the mutual-TLS aiohttp server and client that carry one frame each way.

Every daemon serves ``POST /v1/msg`` on ``[network] listen``: the request body is one wire
frame, the reply is one wire frame.  The TLS layer admits only certificates of the pool CA;
the server then derives the sender's node id from its certificate and hands the frame to the
dispatcher, so every message is attributed to an authenticated node.  The client posts a frame
to an address, checks that the certificate that answered is the pool's and caps the reply;
:meth:`Transport.send_frame` sends to a node id (its address from the peer table) and delivers a
frame addressed to this node itself through the same dispatcher without the network.  Every
failure is a :class:`~frenzyd.errors.PeerError` whose reason is counted.  At most one request
per address runs on behalf of the heartbeats (:meth:`Transport.begin`); ``stop`` cancels them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from aiohttp import web

from frenzyd.config import Config
from frenzyd.errors import AuthError, ConfigError, PeerError
from frenzyd.net import auth, tls, wire
from frenzyd.net.dispatch import Dispatcher, error_frame
from frenzyd.net.gate import GatedTLSSite
from frenzyd.net.peer_table import PeerTable
from frenzyd.net.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

MSG_PATH = "/v1/msg"
CONTENT_TYPE = "application/x-frenzy-frame"
CONNECTIONS_PER_PEER = 8
"""Kept-alive TLS connections per peer (requests beyond this wait for a free one)."""
KEEPALIVE_S = 90.0
"""An idle kept-alive connection to a peer is closed after this long.  SWIM probes members in a
shuffled round robin, each once per ``n`` periods: a connection kept this long is reused by the next
probe in pools up to ~90 members at a 1 s period, so a probe there costs one request, not a mutual-TLS
handshake (two certificates, ~3 KB and two signatures).  Past that each probe pays one handshake,
the same for any pool size; a member holds at most ~this many idle connections each way."""
SERVER_KEEPALIVE_S = KEEPALIVE_S + 30.0
"""The server keeps an idle connection longer than a client would, so a client never reuses one
the server has just closed (a POST is not retried)."""
FRAME_OVERHEAD = 64 * 1024
"""Room for an envelope's certificate, signature and keys around a payload-sized body."""


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


class Transport:
    """This node's server and client for peer frames.

    ``port`` and ``address`` are the bound port and the advertised ``host:port`` (known after
    :meth:`start`).  Counts into the dispatcher's counters: TLS and certificate refusals
    (``auth_refusals``), failed sends by reason (``send_failures``), undecodable replies
    (``dropped``) and sent messages by kind (``sent``).
    """

    def __init__(
        self,
        config: Config,
        creds: auth.Credentials,
        dispatch: Dispatcher,
        table: PeerTable,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.creds = creds
        self.dispatch = dispatch
        self.counters = dispatch.counters
        self.table = table
        self._ratelog = RateLimitedLog(log, clock=clock)
        self._runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None
        """The client session (kept-alive TLS connections to peers); None before start and after stop."""
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self.port: int | None = None
        self.address = config.network.advertise_address
        self.site: GatedTLSSite | None = None
        """The server's site (its ``unauthenticated`` count); None before start."""

    def _member_hosts(self) -> set[str]:
        """The hosts of every member's advertised address (the gate's exemption from its total cap:
        asked only when the cap is reached)."""
        return {r.address.rsplit(":", 1)[0].strip("[]") for r in self.table.records() if r.address}

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the server and open the client session."""
        app = web.Application(client_max_size=self.dispatch.max_frame_bytes)
        app.router.add_post(MSG_PATH, self._handle)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=SERVER_KEEPALIVE_S,
            shutdown_timeout=max(0.5, self.config.timing.shutdown_deadline_s / 2),
        )
        await self._runner.setup()
        net = self.config.network
        listen = net.listen
        site = GatedTLSSite(
            self._runner,
            listen.host,
            listen.port,
            tls.server_context(self.creds, self._count_handshake_failure),
            handshake_timeout_s=net.handshake_timeout_s,
            max_total=net.max_unauthenticated,
            max_per_ip=net.max_unauthenticated_per_ip,
            on_refused=self._count_door_refusal,
            backlog=128,
            check_peer=self.dispatch.refuse_certificate,
            known_hosts=self._member_hosts,
        )
        self.site = site
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
            ssl=tls.client_context(self.creds), limit=256, limit_per_host=CONNECTIONS_PER_PEER,
            keepalive_timeout=KEEPALIVE_S,
        )
        self.session = aiohttp.ClientSession(connector=connector, raise_for_status=False)
        log.info("peer API on %s (advertised as %s), node %s", listen, self.address, self.creds.node_id)

    async def stop(self) -> None:
        """Cancel the requests in flight, close the client session and the server (idempotent)."""
        for task in list(self._inflight.values()):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        if self.session is not None:
            await self.session.close()
            self.session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self.site = None

    # --- requests in flight ------------------------------------------------------------------

    def begin(
        self, address: str, work: Callable[[], Coroutine[Any, Any, None]], name: str
    ) -> asyncio.Task[None] | None:
        """Run ``work()`` as the one request in flight to ``address`` and return its task; None (and
        ``work`` not started) while an earlier one is still in flight there."""
        if address in self._inflight:
            return None
        task = asyncio.create_task(work(), name=name)
        self._inflight[address] = task
        task.add_done_callback(functools.partial(self._done, address))
        return task

    def in_flight(self, address: str) -> asyncio.Task[None] | None:
        """The request in flight to ``address``, if any."""
        return self._inflight.get(address)

    def _done(self, address: str, task: asyncio.Task[None]) -> None:
        self._inflight.pop(address, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s failed unexpectedly", task.get_name(), exc_info=exc)

    # --- the server side ---------------------------------------------------------------------

    def _count_door_refusal(self, reason: str, ip: str) -> None:
        self.counters.auth_refusals[reason] += 1
        self._ratelog.warning(f"door:{reason}", "closed a connection from %s before TLS: %s", ip, reason)

    def _count_handshake_failure(self, reason: str) -> None:
        self.counters.auth_refusals[reason] += 1
        self._ratelog.warning(f"tls:{reason}", "refused a TLS connection: %s", reason)

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            peer_id, peer_name = auth.peer_identity_from_der(
                self.creds.ca_pem, _tls_peer_der(request.transport)
            )
        except AuthError as exc:
            self.counters.auth_refusals[exc.reason] += 1
            self._ratelog.warning(f"auth:{exc.reason}", "refused a request from %s: %s", request.remote, exc)
            status, frame = error_frame(exc.reason, str(exc), 403)
        else:
            label = f"{peer_name} ({peer_id[:12]})"
            try:
                data = await request.read()
            except web.HTTPRequestEntityTooLarge:
                too_big = f"body over {self.dispatch.max_frame_bytes} bytes"
                status, frame = self.dispatch.drop("oversized", label, too_big)
            else:
                status, frame = await self.dispatch.process(peer_id, label, data)
        return web.Response(body=frame, status=status, content_type=CONTENT_TYPE)

    # --- the client side ---------------------------------------------------------------------

    async def post(
        self, address: str, frame: bytes, timeout_s: float, max_reply: int
    ) -> tuple[str, wire.Message]:
        """Post ``frame`` to ``address``; return the answering node's id (from its certificate) and
        its decoded reply (at most ``max_reply`` bytes).  Raises PeerError with the reason."""
        if self.session is None:
            raise PeerError("not_started", "PeerNetwork.start() has not run")
        url = f"https://{address}{MSG_PATH}"
        try:
            async with self.session.post(
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
            self.counters.auth_refusals["untrusted_certificate"] += 1
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
            self.dispatch.check_peer(peer_id, der)
        except AuthError as exc:
            self.counters.auth_refusals[exc.reason] += 1
            raise self._fail(exc.reason, f"{address}: {exc}") from exc
        try:
            reply = wire.decode(b"".join(chunks), max_bytes=max_reply, caps=self.dispatch.caps)
        except wire.FrameRejected as exc:
            self.counters.dropped[exc.reason] += 1
            raise self._fail("bad_reply", f"{address}: {exc}") from exc
        return peer_id, reply

    def _fail(self, reason: str, detail: str) -> PeerError:
        self.counters.send_failures[reason] += 1
        return PeerError(reason, detail)

    async def send_frame(
        self, node_id: str, kind: str, frame: bytes, timeout_s: float | None, max_reply_bytes: int | None
    ) -> wire.Message:
        """Send an encoded message of ``kind`` to node ``node_id``; return its reply.

        Raises PeerError: ``unknown_peer`` (no address), transport reasons (``unreachable``,
        ``timeout``, ``refused``, ...), ``wrong_peer`` (another node answered at that address), or
        the peer's own refusal reason (an ``error`` reply).
        """
        if node_id == self.creds.node_id:
            # To ourselves: the same decode, checks and handlers, without the network.
            _, reply_frame = await self.dispatch.process(node_id, "this node", frame)
            reply = wire.decode(reply_frame, max_bytes=max(len(reply_frame), 1))
            self.counters.sent[kind] += 1
            if reply.kind == "error":
                raise PeerError(reply.body["reason"], reply.body.get("detail", ""))
            return reply
        rec = self.table.get(node_id)
        if rec is None:
            raise self._fail("unknown_peer", f"no address known for node {node_id[:12]}")
        peer_id, reply = await self.post(
            rec.address,
            frame,
            timeout_s or self.config.timing.request_timeout_s,
            max_reply_bytes or self.dispatch.max_frame_bytes,
        )
        if peer_id != node_id:
            self.counters.auth_refusals["wrong_peer"] += 1
            raise self._fail("wrong_peer", f"{rec.address} is node {peer_id[:12]}, not {node_id[:12]}")
        self.counters.sent[kind] += 1
        if reply.kind == "error":
            raise PeerError(reply.body["reason"], reply.body.get("detail", ""))
        return reply
