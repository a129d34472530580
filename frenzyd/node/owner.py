"""The owner's policy: when Frenzy may use this workstation's GPUs, and the owner's own word (pure).

The owner's work always wins (DESIGN.md §1).  Besides the process check of
``frenzyd.node.inventory`` (a process on the GPU that is not Frenzy's), a GPU is
withheld, and Frenzy's ranks on it are stopped (SIGTERM, the grace to checkpoint,
SIGKILL), while:

* the owner said so: ``frenzy-client owner busy [GPU]`` until ``owner idle`` (the only
  signal a simulated device has; allowed to ``[owner] users`` and the pool's admins);
* outside the hours the owner lends the machine, when ``[owner] windows`` names any
  (``"Mon-Fri 19:00-08:00"``: a window that passes midnight belongs to the day it starts);
* the GPU was busy (utilisation above ``[owner] max_utilization``) while no Frenzy rank held
  it, or held an owner's process, or was signalled busy, less than ``[owner] idle_minutes``
  ago: Frenzy waits until the owner has left it idle that long.

:class:`OwnerPolicy` keeps the signals and when each GPU last saw its owner; ``reason`` is
asked once per inventory refresh with the clock passed in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from frenzyd.errors import ConfigError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
ALL_GPUS = "*"
"""``signal``'s key for every GPU of the node."""

_WINDOW = re.compile(r"^\s*(?:(?P<days>[A-Za-z,\-*]+)\s+)?"
                     r"(?P<h0>\d{1,2}):(?P<m0>\d\d)\s*-\s*(?P<h1>\d{1,2}):(?P<m1>\d\d)\s*$")


@dataclass(frozen=True, slots=True)
class Window:
    """Hours the owner lends the GPUs: ``days`` (0 = Monday) from ``start`` to ``end`` minutes of
    the day; ``end <= start`` passes midnight into the next day."""

    days: frozenset[int]
    start: int
    end: int

    @classmethod
    def parse(cls, text: str) -> Window:
        """``"Mon-Fri 19:00-08:00"``, ``"Sat,Sun 00:00-24:00"``, ``"22:00-06:00"`` (every day)."""
        m = _WINDOW.match(text)
        if m is None:
            raise ConfigError(f"[owner] windows: {text!r} is not like "
                              "\"Mon-Fri 19:00-08:00\" or \"22:00-06:00\"")
        start = int(m["h0"]) * 60 + int(m["m0"])
        end = int(m["h1"]) * 60 + int(m["m1"])
        if not (0 <= start < 24 * 60 and 0 < end <= 24 * 60 and int(m["m0"]) < 60 and int(m["m1"]) < 60):
            raise ConfigError(f"[owner] windows: {text!r}: times run from 00:00 to 24:00")
        return cls(_days(m["days"] or "*", text), start, end)

    def contains(self, t: datetime) -> bool:
        minute = t.hour * 60 + t.minute
        day = t.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= minute < self.end
        # Past midnight: the evening part on a listed day, the morning part after a listed day.
        evening = day in self.days and minute >= self.start
        return evening or ((day - 1) % 7 in self.days and minute < self.end)


def _days(spec: str, text: str) -> frozenset[int]:
    if spec == "*":
        return frozenset(range(7))
    out: set[int] = set()
    for part in spec.lower().split(","):
        lo, _, hi = part.partition("-")
        try:
            a = DAYS.index(lo[:3])
            b = DAYS.index(hi[:3]) if hi else a
        except ValueError:
            raise ConfigError(f"[owner] windows: {text!r}: days are Mon..Sun, e.g. Mon-Fri or "
                              "Sat,Sun") from None
        out.update((a + k) % 7 for k in range(((b - a) % 7) + 1))
    return frozenset(out)


def parse_windows(texts: Iterable[str]) -> tuple[Window, ...]:
    return tuple(Window.parse(t) for t in texts)


class OwnerPolicy:
    """When this node's owner wants the GPUs back; see the module docstring."""

    def __init__(self, *, max_utilization: float = 1.0, idle_s: float = 0.0,
                 windows: tuple[Window, ...] = ()) -> None:
        self.max_utilization = max_utilization
        self.idle_s = idle_s
        self.windows = windows
        self.busy: set[str] = set()
        """GPU uuids (or ``ALL_GPUS``) the owner said are busy."""
        self._seen_at: dict[str, float] = {}  # uuid -> when the owner was last seen on it

    def signal(self, busy: bool, uuids: Iterable[str]) -> None:
        """``owner busy`` / ``owner idle`` for these GPUs (``ALL_GPUS``: every GPU).  Idle for every GPU
        clears each GPU's own busy signal too."""
        keys = set(uuids)
        if busy:
            self.busy |= keys
        elif ALL_GPUS in keys:
            self.busy.clear()
        else:
            self.busy -= keys

    def said_busy(self, uuid: str) -> bool:
        return uuid in self.busy or ALL_GPUS in self.busy

    def observe(self, uuid: str, *, owner_process: bool, utilization: float, frenzy_holds: bool,
                now: float) -> None:
        """One inventory reading of a GPU: remember when its owner was last active on it."""
        busy_util = not frenzy_holds and utilization > self.max_utilization
        if owner_process or busy_util or self.said_busy(uuid):
            self._seen_at[uuid] = now

    def reason(self, uuid: str, *, now: float, local: datetime) -> str | None:
        """Why the owner's policy withholds the GPU now (None: Frenzy may use it)."""
        if self.said_busy(uuid):
            return "the owner said busy (frenzy-client owner busy); 'owner idle' gives it back"
        if self.windows and not any(w.contains(local) for w in self.windows):
            return "outside the hours its owner lends it ([owner] windows)"
        seen = self._seen_at.get(uuid)
        if seen is not None and now - seen < self.idle_s:
            return (f"its owner used it {now - seen:.0f} s ago; offered again after "
                    f"{self.idle_s / 60:g} idle minutes ([owner] idle_minutes)")
        return None
