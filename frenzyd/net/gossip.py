"""Drives the SWIM membership core on the event loop: frames in, frames out, ticks when it asks.

The core (``frenzyd.net.membership``) decides; this shell encodes what it returns with the wire codec
and hands each frame to a ``send(address, node_id, frame)`` that must not block (the peer network
posts it over mutual TLS; ``frenzyd.net.memnet`` delivers it in memory after a delay, or loses it),
decodes what arrives (a bad frame is counted and dropped, never raised), and sleeps until the core's
next deadline.  Membership changes go to ``on_changes`` (the peer table and the election listen).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable

from frenzyd.net import wire
from frenzyd.net.membership import Membership, Outgoing, SwimMessage
from frenzyd.net.messages import MemberEntry, SwimAck, SwimPing, SwimPingReq, SwimSync
from frenzyd.net.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

SWIM_KINDS = ("swim.ping", "swim.ping_req", "swim.ack", "swim.sync")
SendFrame = Callable[[str, str | None, bytes], None]
"""``send(address, node_id or None, frame)``: start sending; never blocks, never raises."""


class GossipDriver:
    """One member's protocol on the running loop.  ``sent`` and ``received`` count messages by kind,
    ``sent_bytes`` the bytes handed to ``send``; ``dropped`` counts refused frames by reason."""

    def __init__(
        self,
        core: Membership,
        send: SendFrame,
        *,
        on_changes: Callable[[list[MemberEntry]], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self._send = send
        self._on_changes = on_changes
        self._clock = clock
        self._timer: asyncio.TimerHandle | None = None
        self._at = float("inf")
        self.running = False
        self.sent: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.sent_bytes = 0
        self.dropped: Counter[str] = Counter()
        self._ratelog = RateLimitedLog(log, clock=clock)

    def start(self, seeds: Iterable[str] = ()) -> None:
        """Join through ``seeds`` (addresses) and start probing."""
        self.running = True
        self._emit(self.core.join(seeds, self._clock()))
        self._schedule()

    def stop(self, *, leave: bool = True) -> None:
        """Stop probing; ``leave`` tells a few members that this node leaves (they gossip it)."""
        if self.running and leave:
            self._emit(self.core.leave())
        self.running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def join(self, addresses: Iterable[str]) -> None:
        """Sync with addresses found later (mDNS, a seed that came back)."""
        if self.running:
            self._emit(self.core.join(addresses, self._clock()))
            self._schedule()

    def unreachable(self, node_id: str) -> None:
        """The node's other traffic found member ``node_id`` not listening: suspect it (or confirm)."""
        if self.running:
            self._emit(self.core.unreachable(node_id, self._clock()))
            self._schedule()

    def set_view(self, *, term: int, coordinator: str | None) -> None:
        """This node's election view changed: gossip it (a new incarnation of its entry)."""
        if self.core.set_view(term=term, coordinator=coordinator):
            self._schedule()

    # --- frames in ---------------------------------------------------------------------------

    def deliver_frame(self, sender: str, frame: bytes) -> None:
        """A frame from the authenticated node ``sender``: decode, check, take.  Never raises."""
        try:
            msg = wire.parse(wire.decode(frame, max_bytes=wire.kind_cap("swim.sync")))
        except wire.FrameRejected as exc:
            self.dropped[exc.reason] += 1
            self._ratelog.warning(f"swim:{exc.reason}", "dropped a membership frame from %s: %s",
                                  sender[:12], exc)
            return
        if not isinstance(msg, SwimPing | SwimPingReq | SwimAck | SwimSync):
            self.dropped["unknown_kind"] += 1
            return
        self.deliver(sender, msg)

    def deliver(self, sender: str, msg: SwimMessage, *, answer: bool = False) -> SwimAck | None:
        """A decoded message from the authenticated node ``sender``.  ``answer``: an ack owed to the
        sender is returned instead of sent (the transport carries it back as the request's reply, one
        round trip and no connection back)."""
        if not self.running:
            return None
        self.received[msg.KIND] += 1
        out = self.core.receive(sender, msg, self._clock())
        ack = None
        if answer:
            for i, o in enumerate(out):
                if o.node_id == sender and isinstance(o.message, SwimAck):
                    ack = o.message
                    del out[i]
                    self.sent[ack.KIND] += 1
                    break
        self._emit(out)
        self._schedule()
        return ack

    # --- the loop ----------------------------------------------------------------------------

    def _emit(self, out: list[Outgoing]) -> None:
        for o in out:
            frame = wire.encode_message(o.message)
            self.sent[o.message.KIND] += 1
            self.sent_bytes += len(frame)
            self._send(o.address, o.node_id, frame)
        changes = self.core.drain_changes()
        if changes and self._on_changes is not None:
            self._on_changes(changes)

    def _schedule(self) -> None:
        if not self.running:
            return
        at = self.core.next_wake()
        if self._timer is not None and at >= self._at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = asyncio.get_running_loop().call_later(max(0.0, at - self._clock()), self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._at = float("inf")
        if not self.running:
            return
        try:
            self._emit(self.core.tick(self._clock()))
        finally:
            self._schedule()
