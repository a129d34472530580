"""Peer message dispatch: decode an incoming frame, check a signed order, run its handler, answer.

A frame arrives from a peer the transport has already authenticated (its node id comes from
the TLS certificate).  It is decoded under the size cap; a heartbeat must name that same
node; a ``signed`` envelope is opened against the pool CA and the TLS sender and its ``term``
checked by the election before the inner message goes on; then the kind's handler runs.
Undecodable frames, unknown kinds, bad signatures and stale terms become an ``error`` frame,
counted by reason and logged rate-limited: nothing a peer sends raises out of
:meth:`Dispatcher.process`.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from frenzyd.errors import AuthError, ElectionError, FrenzyError, WireError
from frenzyd.net import auth, wire
from frenzyd.net.election import Change, ElectionState
from frenzyd.net.ratelog import RateLimitedLog

log = logging.getLogger(__name__)


class PeerCheck(Protocol):
    """What the dispatcher asks of the revocation list (``frenzyd.net.revocation.RevocationState``)."""

    @property
    def version(self) -> int: ...

    def check_peer(self, node_id: str, der: bytes | None = None) -> None: ...


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

HeartbeatAnswer = Callable[[dict[str, Any]], dict[str, Any]]
"""``answer(body)``: record a peer's heartbeat (its node id already matched to its certificate)
and return this node's own heartbeat body, the reply."""


@dataclass
class Counters:
    """The peer layer's counters for metrics (plain values, shared by dispatch, transport and
    heartbeats): frames ``dropped`` and ``auth_refusals`` by reason, ``send_failures`` by reason,
    messages ``received`` and ``sent`` by kind."""

    dropped: Counter[str] = field(default_factory=Counter)
    auth_refusals: Counter[str] = field(default_factory=Counter)
    send_failures: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)
    sent: Counter[str] = field(default_factory=Counter)
    other_versions: dict[str, int] = field(default_factory=dict)
    """Authenticated peers whose frames carry another protocol version (node id -> version):
    members not yet upgraded, named by ``status``."""


def error_frame(reason: str, detail: str, status: int) -> tuple[int, bytes]:
    """An HTTP status and the ``error`` frame that carries ``reason`` (``detail`` cut to 500 chars)."""
    return status, wire.encode("error", {"reason": reason, "detail": detail[:500]})


class Dispatcher:
    """Turns one frame from an authenticated peer into the reply frame: decode, check, dispatch.

    ``max_frame_bytes`` caps an incoming frame (and a signed order's inner frame) of any kind;
    each kind's own cap (``wire.kind_cap``, ``caps`` overriding it) is checked before its body is
    unpacked.  The
    heartbeat layer answers heartbeats and hears of election changes a signed order causes
    (:meth:`bind`); other kinds go to the handler registered with :meth:`on`, else to the
    fallback, else they are refused as ``unknown_kind``.
    """

    def __init__(
        self,
        creds: auth.Credentials,
        election: ElectionState,
        counters: Counters,
        *,
        max_frame_bytes: int,
        caps: Mapping[str, int] | None = None,
        fallback: FallbackHandler | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.creds = creds
        self.election = election
        self.counters = counters
        self.max_frame_bytes = max_frame_bytes
        self.caps: dict[str, int] = dict(caps or {})
        """Per-kind frame cap overrides (``[network] frame_caps``)."""
        self._fallback = fallback
        self._handlers: dict[str, tuple[Handler, bool]] = {}
        self._answer_heartbeat: HeartbeatAnswer | None = None
        self._on_change: Callable[[Change], None] | None = None
        self._ratelog = RateLimitedLog(log, clock=clock)
        self.revocations: PeerCheck | None = None
        """The pool's revocation list: frames from a removed node are refused (``revoked_certificate``)."""

    def check_peer(self, peer_id: str, der: bytes | None = None) -> None:
        """Raise AuthError(``revoked_certificate``) when the peer was removed from the pool."""
        if self.revocations is not None and peer_id != self.creds.node_id:
            self.revocations.check_peer(peer_id, der)

    def refuse_certificate(self, der: bytes) -> str | None:
        """For the TLS door: the reason to close a connection whose handshake presented ``der``
        (``revoked_certificate``), or None to let it in."""
        if self.revocations is None or self.revocations.version == 0:
            return None
        try:
            peer_id, _ = auth.peer_identity_from_der(self.creds.ca_pem, der)
            self.check_peer(peer_id, der)
        except AuthError as exc:
            return exc.reason
        return None

    def bind(self, answer_heartbeat: HeartbeatAnswer, on_change: Callable[[Change], None]) -> None:
        """Connect the heartbeat layer (built after this one, because it sends through the transport
        that delivers frames here)."""
        self._answer_heartbeat = answer_heartbeat
        self._on_change = on_change

    def on(self, kind: str, handler: Handler, *, signed: bool = False) -> None:
        """Handle messages of ``kind``.  ``signed=True``: accept it only inside a verified
        ``signed`` envelope whose ``term`` the election accepts (orders that start/stop work)."""
        if kind not in wire.KINDS:
            raise ValueError(f"register the message kind {kind!r} with wire.register_kind first")
        if kind in ("heartbeat", wire.SIGNED_KIND):
            raise ValueError(f"{kind!r} is handled by the peer layer itself")
        self._handlers[kind] = (handler, signed)

    def drop(self, reason: str, peer: str, detail: str) -> tuple[int, bytes]:
        """Count and log (rate-limited) a dropped frame; return the ``error`` reply (HTTP 400)."""
        self.counters.dropped[reason] += 1
        self._ratelog.warning(f"drop:{reason}", "dropped a frame from %s: %s (%s)", peer, reason, detail)
        return error_frame(reason, detail, 400)

    async def process(self, peer_id: str, label: str, data: bytes) -> tuple[int, bytes]:
        """Decode, authorise and dispatch one frame from an authenticated peer; return the HTTP
        status and the reply frame.  Never raises: every failure becomes an ``error`` frame.  A frame
        from a node the revocation list names is refused before it is decoded."""
        try:
            self.check_peer(peer_id)
        except AuthError as exc:
            self.counters.auth_refusals[exc.reason] += 1
            self._ratelog.warning(f"auth:{exc.reason}", "refused a frame from %s: %s", label, exc)
            return error_frame(exc.reason, str(exc), 403)
        try:
            msg = wire.decode(data, max_bytes=self.max_frame_bytes, caps=self.caps)
        except wire.FrameRejected as exc:
            if exc.version is not None:
                self.counters.other_versions[peer_id] = exc.version
            return self.drop(exc.reason, label, exc.detail)
        self.counters.other_versions.pop(peer_id, None)
        self.counters.received[msg.kind] += 1
        try:
            kind, body = await self._dispatch(peer_id, msg)
        except wire.FrameRejected as exc:
            return self.drop(exc.reason, label, exc.detail)
        except AuthError as exc:
            self.counters.auth_refusals[exc.reason] += 1
            self._ratelog.warning(f"auth:{exc.reason}", "refused an order from %s: %s", label, exc)
            return error_frame(exc.reason, str(exc), 403)
        except ElectionError as exc:
            reason = str(exc).split(":", 1)[0]
            self.counters.dropped[reason] += 1
            self._ratelog.warning(f"term:{reason}", "refused an order from %s: %s", label, exc)
            return error_frame(reason, str(exc), 409)
        except FrenzyError as exc:
            why: object = getattr(exc, "reason", None)
            return error_frame(why if isinstance(why, str) else type(exc).__name__, str(exc), 400)
        except Exception:
            log.exception("handler for %r from %s failed", msg.kind, label)
            return error_frame("internal", f"handler for {msg.kind!r} failed", 500)
        try:
            return 200, wire.encode(kind, body)
        except WireError:
            log.exception("handler for %r returned an invalid reply", msg.kind)
            return error_frame("internal", "invalid reply", 500)

    async def _dispatch(self, peer_id: str, msg: wire.Message) -> tuple[str, dict[str, Any]]:
        if msg.kind == "heartbeat":
            if self._answer_heartbeat is None:
                raise wire.FrameRejected("unknown_kind", "heartbeats are not answered here yet")
            if msg.body["node_id"] != peer_id:
                raise AuthError("identity_mismatch", "heartbeat names another node than its certificate")
            return "heartbeat", self._answer_heartbeat(msg.body)
        signed = False
        if msg.kind == wire.SIGNED_KIND:
            order = auth.open_order(
                self.creds.ca_pem,
                msg,
                sender_id=peer_id,
                now=dt.datetime.now(dt.UTC),
                max_bytes=self.max_frame_bytes,
                caps=self.caps,
            )
            msg, signed = order.message, True
            term = msg.body.get("term")
            if not isinstance(term, int) or isinstance(term, bool):
                raise wire.FrameRejected("schema", f"signed order {msg.kind!r} carries no integer 'term'")
            change = self.election.check_order(peer_id, term)
            if change is not None and self._on_change is not None:
                self._on_change(change)
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
