"""The rank side of the launcher's control channel: JSON lines written to the descriptor FRENZY_CONTROL_FD.

Messages (one JSON object per line, ``"type"`` first):

* ``{"type": "step", "step", "steps", "loss", ...}`` - progress (``report``)
* ``{"type": "checkpoint_complete", "rank", "step", "path"}`` - this rank's part of a
  checkpoint is on disk (``checkpoint_complete``)

Every line also carries ``rank``, ``job`` and ``attempt`` when ``RANK``,
``FRENZY_JOB_ID`` and ``FRENZY_ATTEMPT`` are set (DESIGN.md §8: reports from an
older attempt are refused).  A line is one write of at most ``MAX_LINE_BYTES``
(atomic on a pipe, so the ranks of a host may share one channel); when the
channel is full or closed the message is dropped, never waited for: a daemon
that reads behind never stalls training.  Without ``FRENZY_CONTROL_FD`` every call is a no-op and a warning is
logged once.  No torch here: user scripts call this from any loop.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {"fd": None, "resolved": False, "warned": False, "dropped": 0, "closed": False}

MAX_LINE_BYTES = 4096
"""Longest message line (PIPE_BUF on Linux: a write this size to a pipe is atomic)."""


def _fd() -> int | None:
    if not _state["resolved"]:
        raw = os.environ.get("FRENZY_CONTROL_FD")
        fd: int | None = None
        if raw:
            try:
                fd = int(raw)
                os.fstat(fd)
            except (ValueError, OSError):
                log.warning("FRENZY_CONTROL_FD=%r is not an open descriptor; reports go nowhere", raw)
                fd = None
        _state.update(fd=fd, resolved=True)
    resolved: int | None = _state["fd"]
    return resolved


def send(message: dict[str, Any], *, quiet: bool = False) -> bool:
    """Write one JSON line to the control descriptor; False (and a one-time warning) when there is none."""
    fd = _fd()
    if fd is None:
        if not quiet and not _state["warned"]:
            log.warning("FRENZY_CONTROL_FD is not set: progress and checkpoint reports are not sent to the "
                        "daemon (this is expected outside a Frenzy job)")
            _state["warned"] = True
        return False
    fence: dict[str, Any] = {}
    if os.environ.get("RANK", "").isdigit() and "rank" not in message:
        fence["rank"] = int(os.environ["RANK"])
    if os.environ.get("FRENZY_JOB_ID"):
        fence["job"] = os.environ["FRENZY_JOB_ID"]
    if os.environ.get("FRENZY_ATTEMPT", "").isdigit():
        fence["attempt"] = int(os.environ["FRENZY_ATTEMPT"])
    data = (json.dumps({**message, **fence}, separators=(",", ":")) + "\n").encode()
    if len(data) > MAX_LINE_BYTES:
        raise ValueError(f"a control message is at most {MAX_LINE_BYTES} bytes as JSON, not {len(data)}")
    with _lock:
        try:
            # One write of at most PIPE_BUF bytes: atomic on a pipe, so the local ranks sharing the
            # channel never interleave; all or nothing on a non-blocking one.
            os.write(fd, data)
        except BlockingIOError:
            _state["dropped"] += 1  # the daemon reads behind: progress is best effort, never a stall
            return False
        except OSError as exc:  # the daemon closed its end (it is stopping the job)
            if not _state["closed"]:
                log.warning("the control channel is closed (%s): later reports go nowhere", exc)
                _state["closed"] = True
            return False
    return True


def dropped() -> int:
    """Messages not sent because the channel was full (the daemon reads behind)."""
    return int(_state["dropped"])


def report(step: int, loss: float, **extra: Any) -> bool:
    """Tell the daemon that optimizer step ``step`` finished with mean loss ``loss`` (nats per token)."""
    if isinstance(step, bool) or step < 0:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    value = float(loss)
    if not math.isfinite(value):
        raise ValueError(f"loss must be a finite number, not {loss!r}")
    return send({"type": "step", "step": step, "loss": value, **extra})


def checkpoint_complete(step: int | None = None, path: str | None = None) -> bool:
    """Tell the daemon this rank's files in FRENZY_CHECKPOINT_DIR are a complete checkpoint, to collect."""
    rank = int(os.environ.get("RANK", "0"))
    return send({"type": "checkpoint_complete", "rank": rank, "step": step,
                 "path": path or os.environ.get("FRENZY_CHECKPOINT_DIR")})


def reset_for_tests() -> None:
    """Forget the resolved descriptor (tests change FRENZY_CONTROL_FD between calls)."""
    _state.update(fd=None, resolved=False, warned=False, dropped=0, closed=False)
