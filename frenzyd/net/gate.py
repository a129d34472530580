"""The peer port's door: TLS handshakes under a deadline and a cap, before aiohttp sees a connection.

Until its TLS handshake completes, a connection to the peer port is *unauthenticated*: anyone on
the LAN can open one.  :class:`GatedTLSSite` accepts plain TCP, counts such connections per source
address and in total, closes at once one that would exceed ``[network] max_unauthenticated_per_ip``
or ``max_unauthenticated`` (a connection from a member's address is exempt from the total: a flood
of strangers holding every slot must not lock the pool's own members out), and runs the handshake
(``loop.start_tls``) under ``[network] handshake_timeout_s``.  A completed handshake proved a
certificate of the pool CA (the TLS context requires one): the connection leaves the counts and is
handed to aiohttp's request handler, so members' established connections are never limited here.
Refusals are counted by reason (``unauth_per_ip``, ``unauth_total``, ``handshake_timeout``) in the
caller's counter.  A certificate of the pool CA that ``check_peer`` refuses (one the revocation
list names: ``revoked_certificate``) is closed right after the handshake, before any request is
read.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import Callable, Container

from aiohttp import web

log = logging.getLogger(__name__)

OnRefused = Callable[[str, str], None]
"""``on_refused(reason, source_ip)``."""
CheckPeer = Callable[[bytes], str | None]
"""``check_peer(certificate_der)`` -> a refusal reason, or None to admit the connection."""
KnownHosts = Callable[[], Container[str]]
"""``known_hosts()`` -> the addresses members were heard from (exempt from the total cap)."""


class _Pending(asyncio.Protocol):
    """Holds what TLS delivers between the end of the handshake and the handler taking over."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = False
        self.lost = False
        self.exc: Exception | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost, self.exc = True, exc


class _Door(asyncio.Protocol):
    """The plain-TCP protocol of an accepted connection: stop reading, then admit or close."""

    def __init__(self, site: GatedTLSSite) -> None:
        self._site = site

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the TLS layer reads the ClientHello, not this protocol
        self._site._admit(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        pass  # start_tls owns the transport now, or it was closed on purpose


class GatedTLSSite(web.TCPSite):
    """An aiohttp site on ``host:port`` whose TLS handshakes are capped and timed (see the module).

    ``unauthenticated`` is the number of connections in their handshake now, ``by_ip`` the same
    per source address.
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        *,
        handshake_timeout_s: float,
        max_total: int,
        max_per_ip: int,
        on_refused: OnRefused,
        backlog: int = 128,
        check_peer: CheckPeer | None = None,
        known_hosts: KnownHosts | None = None,
    ) -> None:
        super().__init__(runner, host, port, backlog=backlog)
        self._tls = ssl_context
        self._timeout = handshake_timeout_s
        self._max_total = max_total
        self._max_per_ip = max_per_ip
        self._on_refused = on_refused
        self._check_peer = check_peer
        self._known_hosts = known_hosts
        self.by_ip: Counter[str] = Counter()
        self.unauthenticated = 0
        self._handshakes: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self.port}"

    async def start(self) -> None:
        self._runner._reg_site(self)  # BaseSite.start's part; TCPSite.start would bind without the door
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Door(self), self._host, self._port, backlog=self._backlog
        )
        if self._server.sockets:
            self._bound_port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        for task in list(self._handshakes):
            task.cancel()
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)
        await super().stop()

    def _admit(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self.by_ip[ip] >= self._max_per_ip:
            transport.abort()
            self._on_refused("unauth_per_ip", ip)
            return
        if self.unauthenticated >= self._max_total and (
                self._known_hosts is None or ip not in self._known_hosts()):
            transport.abort()
            self._on_refused("unauth_total", ip)
            return
        self.by_ip[ip] += 1
        self.unauthenticated += 1
        task = asyncio.get_running_loop().create_task(self._handshake(transport, ip), name=f"tls from {ip}")
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, transport: asyncio.Transport, ip: str) -> None:
        loop = asyncio.get_running_loop()
        pending = _Pending()
        started = loop.time()
        try:
            tls = await loop.start_tls(
                transport, pending, self._tls, server_side=True, ssl_handshake_timeout=self._timeout
            )
        except (OSError, ssl.SSLError, EOFError) as exc:
            transport.abort()
            # asyncio ends a handshake past its deadline with ConnectionAbortedError; other failures
            # were counted by the TLS context's callback (wrong CA, no certificate, ...).
            late = loop.time() - started >= self._timeout
            if late and isinstance(exc, TimeoutError | ConnectionAbortedError):
                self._on_refused("handshake_timeout", ip)
            return
        finally:
            self._release(ip)
        if tls is None:  # the connection closed during the handshake
            return
        if self._check_peer is not None:
            ssl_object = tls.get_extra_info("ssl_object")
            der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
            reason = self._check_peer(der or b"")
            if reason is not None:
                tls.abort()
                self._on_refused(reason, ip)
                return
        server = self._runner.server
        if server is None or pending.lost:  # shutting down, or gone already
            tls.abort()
            return
        handler = server()
        tls.set_protocol(handler)
        handler.connection_made(tls)
        for chunk in pending.data:
            handler.data_received(chunk)
        if pending.eof:
            handler.eof_received()

    def _release(self, ip: str) -> None:
        self.unauthenticated -= 1
        self.by_ip[ip] -= 1
        if self.by_ip[ip] <= 0:
            del self.by_ip[ip]
