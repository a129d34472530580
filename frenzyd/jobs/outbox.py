"""A rank host's outbox: finished attempts' exit reports and rank 0's results, kept on disk until the
job's submitter acknowledges them (DESIGN.md §8: a finished job's status and results are never lost,
so it is never run again).

Layout: ``data_dir/outbox/<job>.a<attempt>/`` holds ``report.json`` (``{"created_at", "submitter",
"exit": <job.exit body>, "checkpoint": {"step", "hosts", "sha256"} or absent}``), for rank 0's host
``results.bin``, and for an attempt that stopped before its end with a complete checkpoint, this
host's part of it, ``checkpoint.bin`` (delivered first, so the next attempt can resume from it).
Entries survive a restart of
the rank host; an unreadable one is moved to ``data_dir/quarantine/outbox/`` and counted.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from frenzyd.errors import WireError
from frenzyd.jobs.context import SEND_TIMEOUT_S
from frenzyd.jobs.messages import JobExit
from frenzyd.jobs.model import valid_job_id
from frenzyd.jobs.store import atomic_write

log = logging.getLogger(__name__)

SLOW_SEND_BYTES_S = 1 << 20
"""Bytes a second a delivery is allowed at the least, on top of ``SEND_TIMEOUT_S``: a submitter whose
cores its own ranks keep busy took seconds for one 1 MiB chunk (results/live.md, finding 3)."""
SLOW_MERGE_BYTES_S = 2 << 20
"""Bytes a second the submitter is allowed for the work a checkpoint part's (or the results') last chunk
starts before it answers: hash, unpack, merge with the other hosts' parts, repack, all of the part."""
MAX_CHECKPOINT_TRIES = 3
"""Deliveries of a stopped attempt's checkpoint part that may time out before its exit report goes
without it (the next attempt then resumes from the last copy the submitter took while it ran)."""


def delivery_timeout_s(nbytes: int, then_bytes: int = 0) -> float:
    """How long to wait for the answer to a message of ``nbytes`` whose receiver works through
    ``then_bytes`` more before it answers: ``SEND_TIMEOUT_S`` plus both at the slow rates above (a
    1 MiB chunk: 11 s; the last chunk of a 90 MB checkpoint part: 54 s), not 10 s whatever the size."""
    if nbytes < 0 or then_bytes < 0:
        raise ValueError("byte counts must be non-negative")
    return SEND_TIMEOUT_S + nbytes / SLOW_SEND_BYTES_S + then_bytes / SLOW_MERGE_BYTES_S


def timed_out(exc: BaseException) -> bool:
    """The receiver did not answer in time (it is there, only slow), as opposed to unreachable/refused."""
    return isinstance(exc, TimeoutError) or getattr(exc, "reason", None) == "timeout"


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    report: JobExit
    submitter: str
    created_at: float
    has_results: bool
    checkpoint: tuple[int, int, str] | None = None
    """(step, hosts, sha256) of this host's checkpoint part in ``checkpoint.bin``, if any."""

    @property
    def key(self) -> tuple[str, int]:
        return (self.report.job_id, self.report.attempt)


class Outbox:
    """Undelivered exit reports (and results) of this node's finished attempts."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "outbox"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.quarantined = 0
        self._entries: dict[tuple[str, int], OutboxEntry] = {}
        for d in sorted(self.root.iterdir()):
            if d.is_dir():
                self._load(d)

    def _dir(self, job_id: str, attempt: int) -> Path:
        if not valid_job_id(job_id):
            raise WireError(f"bad job id {job_id!r}")
        return self.root / f"{job_id}.a{attempt}"

    def _load(self, d: Path) -> None:
        try:
            doc = json.loads((d / "report.json").read_text())
            report = JobExit.from_body(doc["exit"])
            ck = doc.get("checkpoint")
            checkpoint = None
            if isinstance(ck, dict) and (d / "checkpoint.bin").is_file():
                checkpoint = (int(ck["step"]), int(ck["hosts"]), str(ck["sha256"]))
            entry = OutboxEntry(report, str(doc["submitter"]), float(doc["created_at"]),
                                (d / "results.bin").is_file(), checkpoint)
            where = self._dir(report.job_id, report.attempt)
        except (OSError, ValueError, KeyError, TypeError, WireError) as exc:
            self._quarantine(d, exc)
            return
        if d != where:
            self._quarantine(d, f"entry of {report.job_id} attempt {report.attempt} in {d.name}")
            return
        self._entries[entry.key] = entry

    def _quarantine(self, d: Path, why: object) -> None:
        qdir = self.root.parent / "quarantine" / "outbox"
        qdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        dest = qdir / f"{d.name}.{time.strftime('%Y%m%dT%H%M%S')}"
        os.replace(d, dest)
        self.quarantined += 1
        log.error("unreadable outbox entry %s (%s); moved to %s", d, why, dest)

    def put(self, report: JobExit, submitter: str, results: bytes | None, now: float,
            checkpoint: tuple[int, int, bytes, str] | None = None) -> OutboxEntry:
        """Persist a finished attempt's report (and results, and this host's checkpoint part as
        ``(step, hosts, data, sha256)``) before anything is sent."""
        d = self._dir(report.job_id, report.attempt)
        d.mkdir(exist_ok=True, mode=0o700)
        if results is not None:
            atomic_write(d / "results.bin", results)
        doc: dict[str, object] = {"created_at": now, "submitter": submitter, "exit": report.to_body()}
        ck = None
        if checkpoint is not None:
            step, hosts, data, sha = checkpoint
            atomic_write(d / "checkpoint.bin", data)
            doc["checkpoint"] = {"step": step, "hosts": hosts, "sha256": sha}
            ck = (step, hosts, sha)
        atomic_write(d / "report.json", json.dumps(doc).encode())
        entry = OutboxEntry(report, submitter, now, results is not None, ck)
        self._entries[entry.key] = entry
        return entry

    def entries(self) -> list[OutboxEntry]:
        return sorted(self._entries.values(), key=lambda e: e.created_at)

    def results(self, entry: OutboxEntry) -> bytes:
        return (self._dir(*entry.key) / "results.bin").read_bytes()

    def checkpoint(self, entry: OutboxEntry) -> bytes:
        return (self._dir(*entry.key) / "checkpoint.bin").read_bytes()

    def remove(self, key: tuple[str, int]) -> None:
        """The submitter has it (or it can never be delivered): forget it."""
        self._entries.pop(key, None)
        shutil.rmtree(self._dir(*key), ignore_errors=True)
