"""Rate-limited warnings for events caused by untrusted input (bad frames, refused peers).

The first event of each key is logged at WARNING; after that at most one WARNING per
interval says how many were suppressed, and the rest go to DEBUG — so a misbehaving
peer cannot flood the journal, and an operator still sees that it keeps happening.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

MAX_KEYS = 4096
"""Keys remembered; past this the oldest are forgotten (keys may carry peer addresses)."""


class RateLimitedLog:
    """Log the first event of each key at WARNING, then at most one WARNING per ``interval_s``
    (saying how many were suppressed); the rest go to DEBUG."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._interval = interval_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, key: str, msg: str, *args: object) -> None:
        now = self._clock()
        last = self._last.get(key)
        if last is None or now - last >= self._interval:
            self._last[key] = now
            n = self._suppressed.pop(key, 0)
            suffix = f" (and {n} more since the last report)" if n else ""
            self._log.warning(msg + suffix, *args)
        else:
            self._suppressed[key] += 1
            self._log.debug(msg, *args)
        if len(self._last) > MAX_KEYS:
            oldest = min(self._last, key=self._last.__getitem__)
            del self._last[oldest]
            self._suppressed.pop(oldest, None)
