"""The daemon's log lines: text for a person at a terminal, or one JSON object per event for a
log pipeline (``[log] format = "json"``).

Every record that concerns a job carries its id (and its attempt when the line names one) as
fields of their own, so ``jq 'select(.job_id == "...")'`` finds a job's whole story across the
coordinator, the submitter and the rank hosts. The id comes from
``extra={"job_id": ..., "attempt": ...}`` given at the call, else from the ``job %s`` convention
every job line of the daemon follows (``"job %s attempt %d: ..."``): the argument in that position
is the id, and a following ``attempt %d`` the attempt.

Pure: no I/O besides the handler :func:`configure` installs on stderr.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, Final, TextIO

FORMATS: Final = ("text", "json")
LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
                 "error": logging.ERROR}

_PLACEHOLDER = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]")
_JOB_AT = re.compile(r"\bjob %s(?: attempt %[ds])?")
# A record's standard attributes; anything else on it came from ``extra=`` and is emitted too.
_STANDARD: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _from_format(record: logging.LogRecord) -> tuple[Any, Any]:
    """(job id, attempt) named by the ``job %s [attempt %d]`` convention, else (None, None)."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not isinstance(args, tuple) or "job %s" not in msg:
        return None, None
    m = _JOB_AT.search(msg)
    if m is None:
        return None, None
    before = [p for p in _PLACEHOLDER.findall(msg[: m.start()]) if p != "%%"]
    i = len(before)
    if i >= len(args):
        return None, None
    attempt = args[i + 1] if m.group(0) != "job %s" and i + 1 < len(args) else None
    return args[i], attempt


class JobFields(logging.Filter):
    """Sets ``record.job_id`` (and ``record.attempt`` when known) on every record about a job."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            job, attempt = _from_format(record)
            if job is not None:
                record.job_id = str(job)
                if attempt is not None and getattr(record, "attempt", None) is None:
                    record.attempt = attempt
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601, ms), ``level``, ``logger``, ``msg``, then
    ``job_id``/``attempt`` and any other ``extra=`` fields, and ``exc`` with the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``[time] LEVEL logger: message``; the job id is already in the message by convention."""

    def __init__(self, *, timestamps: bool) -> None:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s" if timestamps else \
            "%(levelname)s %(name)s: %(message)s"
        super().__init__(fmt)


def configure(fmt: str = "text", level: int = logging.INFO, *, timestamps: bool = True,
              stream: TextIO | None = None) -> logging.Handler:
    """Replace the root logger's handlers with one on ``stream`` (stderr) in ``fmt``; returns it."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter(timestamps=timestamps))
    handler.addFilter(JobFields())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("aiohttp.access", "zeroconf"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, level))
    return handler
