"""An in-memory transport on the running loop: frames between simulated members, a stated delay, loss.

For the scale harness (``scripts/bench_scale.py``) and tests: many members in one process exchange
the real wire frames on wall-clock time.  Every frame takes ``delay_s`` (plus up to ``jitter_s``) and
is lost with probability ``loss`` (seeded); a frame to an address no member holds, or to a member
that was cut off, is lost too.  Counts frames and bytes sent per node.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

OnFrame = Callable[[str, bytes], None]
"""``on_frame(sender_id, frame)``."""


class MemoryNet:
    """Addresses -> members; ``send`` delivers after the delay unless the frame is lost."""

    def __init__(self, *, delay_s: float = 0.005, jitter_s: float = 0.0, loss: float = 0.01,
                 rng: random.Random | None = None) -> None:
        if delay_s < 0 or jitter_s < 0 or not 0 <= loss < 1:
            raise ValueError("memnet: delay_s, jitter_s >= 0 and 0 <= loss < 1")
        self.delay_s = delay_s
        self.jitter_s = jitter_s
        self.loss = loss
        self._rng = rng or random.Random(0)
        self._at: dict[str, tuple[str, OnFrame]] = {}
        self.frames: Counter[str] = Counter()
        """Frames sent, by sender node id."""
        self.bytes: Counter[str] = Counter()
        self.lost: Counter[str] = Counter()
        """Frames lost, by reason (``loss``, ``no_member``)."""

    def attach(self, address: str, node_id: str, on_frame: OnFrame) -> None:
        self._at[address] = (node_id, on_frame)

    def detach(self, address: str) -> None:
        """Cut a member off: frames to it are lost from now on (a crash)."""
        self._at.pop(address, None)

    def sender(self, node_id: str) -> Callable[[str, str | None, bytes], None]:
        """The ``send(address, node_id, frame)`` of member ``node_id``."""
        loop = asyncio.get_running_loop()

        def send(address: str, to: str | None, frame: bytes) -> None:
            self.frames[node_id] += 1
            self.bytes[node_id] += len(frame)
            if self.loss and self._rng.random() < self.loss:
                self.lost["loss"] += 1
                return
            delay = self.delay_s + (self._rng.uniform(0, self.jitter_s) if self.jitter_s else 0.0)
            loop.call_later(delay, self._deliver, node_id, address, frame)

        return send

    def _deliver(self, sender: str, address: str, frame: bytes) -> None:
        member = self._at.get(address)
        if member is None:
            self.lost["no_member"] += 1
            return
        member[1](sender, frame)
