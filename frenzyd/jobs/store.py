"""The submitter's durable job records, payloads, output logs and results in ``data_dir/jobs``.

Layout per job ``data_dir/jobs/<id>/``: ``record.json`` (the authoritative ``JobRecord``,
replaced atomically; older schemas are migrated when read, an unreadable one is moved to
``data_dir/quarantine/jobs/`` and counted, never silently dropped), ``payload.bin`` (the packed
job directory), ``output.ndjson`` (one event per line: ``{"seq", "t", "attempt", "rank", "stream",
"data"}``), ``results.bin`` (rank 0's output
files as packed by the launcher), ``results.fetched`` (present once a client fetched them).  Live
followers get the same events through queues.

Retention (``[jobs] keep_finished_days`` / ``keep_unfetched_days``): :meth:`JobStore.expired` names the
finished jobs past their time (results fetched, or none: the first; never fetched: the second; 0 keeps
forever), :meth:`JobStore.remove` deletes one, and :func:`keep_pruned` does both at start and hourly,
with the leftover run directories (``data_dir/runs/JOB``) of jobs no longer live on this node.  A job
that is not finished, or that someone is following, is never removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from frenzyd.errors import JobStateError, WireError
from frenzyd.jobs.model import JobRecord, valid_job_id

log = logging.getLogger(__name__)

FETCHED_FILE = "results.fetched"
DAY_S = 24 * 3600.0
PRUNE_EVERY_S = 3600.0
"""How often :func:`keep_pruned` looks for expired jobs and run leftovers."""

FOLLOW_QUEUE = 10_000
"""Events buffered per live follower; a follower that falls this far behind is cut off."""


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a crash leaves the old file or the new one, never half.
    Each write has its own temporary file (0600), so two writers of one path (the event loop and
    a thread) never replace each other's half-written file: the last one wins whole."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class JobStore:
    """Records and logs of the jobs this node submitted; survives restarts."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "jobs"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._records: dict[str, JobRecord] = {}
        self._save_lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self._followers: dict[str, set[asyncio.Queue[dict[str, Any] | None]]] = {}
        self.quarantined = 0
        """Unreadable records moved to ``data_dir/quarantine/jobs`` (``frenzy_job_records_quarantined``)."""
        self._load()

    def _load(self) -> None:
        for left in self.root.glob(".incoming-*"):  # a payload half-received when the daemon stopped
            with contextlib.suppress(OSError):
                left.unlink()
        for left in self.root.glob(".removing-*"):  # a job removed by retention when the daemon stopped
            shutil.rmtree(left, ignore_errors=True)
        for d in sorted(self.root.iterdir()):
            f = d / "record.json"
            if not f.is_file():
                continue
            try:
                rec = JobRecord.from_dict(json.loads(f.read_text()))
            except (OSError, ValueError, WireError) as exc:
                self._quarantine(d, exc)
                continue
            if rec.id != d.name:
                self._quarantine(d, f"the record of job {rec.id!r} is in the directory of {d.name!r}")
                continue
            self._records[rec.id] = rec
            self._seq[rec.id] = self._count_lines(d / "output.ndjson")

    def _quarantine(self, d: Path, why: object) -> None:
        """Move an unreadable job directory aside (never delete it) and count it."""
        qdir = self.root.parent / "quarantine" / "jobs"
        dest = qdir / f"{d.name}.{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            qdir.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.replace(d, dest)
        except OSError as exc:
            log.error("unreadable job record %s (%s) could not be moved aside: %s", d, why, exc)  # noqa: TRY400
            dest = d
        self.quarantined += 1
        log.error("job record %s is unreadable (%s); moved to %s. It is kept, not run: a newer frenzyd "
                  "may read it, or remove it by hand", d / "record.json", why, dest)

    @staticmethod
    def _count_lines(path: Path) -> int:
        try:
            with open(path, "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def dir(self, job_id: str) -> Path:
        if not valid_job_id(job_id):
            raise JobStateError(f"bad job id {job_id!r}")
        return self.root / job_id

    def get(self, job_id: str) -> JobRecord:
        """The record of a job submitted here; ``JobStateError`` when unknown."""
        rec = self._records.get(job_id)
        if rec is None:
            raise JobStateError(f"no job {job_id!r} was submitted on this node (see 'frenzy-client jobs')")
        return rec

    def find(self, job_id: str) -> JobRecord | None:
        return self._records.get(job_id)

    def all(self) -> list[JobRecord]:
        return sorted(self._records.values(), key=lambda r: (r.created_at, r.id))

    def create(self, rec: JobRecord, payload: bytes | Path) -> None:
        """Persist a new job and its payload (bytes, or a file of this store's, ``incoming()``,
        moved into place)."""
        d = self.dir(rec.id)
        d.mkdir(mode=0o700)
        if isinstance(payload, Path):
            with open(payload, "rb") as f:
                os.fsync(f.fileno())
            os.replace(payload, d / "payload.bin")
        else:
            atomic_write(d / "payload.bin", payload)
        self._seq[rec.id] = 0
        self.save(rec)

    def incoming(self) -> Path:
        """A fresh private file (0600) beside the job directories for a payload being received;
        ``create`` moves it into its job, the caller removes it otherwise."""
        fd, name = tempfile.mkstemp(prefix=".incoming-", suffix=".bin", dir=self.root)
        os.close(fd)
        return Path(name)

    def save(self, rec: JobRecord) -> None:
        """Replace the job's record on disk and tell followers when its state changed."""
        with self._save_lock:  # a save from a thread (on_attempt) and one from the loop: memory and
            old = self._records.get(rec.id)  # disk end with the same record, the later one
            self._records[rec.id] = rec
            atomic_write(self.dir(rec.id) / "record.json", json.dumps(rec.to_dict(), indent=1).encode())
        if old is None or (old.state, old.phase, old.attempt, old.ranks, old.message) != (
                rec.state, rec.phase, rec.attempt, rec.ranks, rec.message):
            self._publish(rec.id, {"type": "state", "job": rec.summary()})
        if rec.terminal:
            self._publish(rec.id, None)

    def payload(self, job_id: str, offset: int, length: int) -> tuple[bytes, int]:
        """A slice of the job's payload and the payload's total size."""
        path = self.dir(job_id) / "payload.bin"
        try:
            with open(path, "rb") as f:
                total = os.fstat(f.fileno()).st_size
                f.seek(offset)
                return f.read(length), total
        except FileNotFoundError:
            raise JobStateError(f"job {job_id} has no payload here") from None

    def append_output(self, job_id: str, rank: int, stream: str, data: bytes, now: float, *,
                      attempt: int = 0) -> None:
        """Append one output chunk of a rank of an attempt to the job's log and to live followers."""
        seq = self._seq.get(job_id, 0) + 1
        self._seq[job_id] = seq
        ev = {"seq": seq, "t": now, "attempt": attempt, "rank": rank, "stream": stream,
              "data": data.decode("utf-8", errors="replace")}
        with open(self.dir(job_id) / "output.ndjson", "a", encoding="utf-8") as f:
            f.write(json.dumps(ev) + "\n")
        self._publish(job_id, {"type": "output", **ev})

    def read_output(self, job_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        """Logged output events with ``seq > after_seq``."""
        self.get(job_id)
        out = []
        try:
            with open(self.dir(job_id) / "output.ndjson", encoding="utf-8") as f:
                for line in f:
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("seq", 0) > after_seq:
                        out.append({"type": "output", **ev})
        except FileNotFoundError:
            pass
        return out

    def write_results(self, job_id: str, data: bytes, *, late_attempt: int | None = None) -> None:
        """Keep rank 0's results; ``late_attempt``: they are an earlier, requeued attempt's, kept
        aside until that attempt is known to have succeeded (``promote_results``)."""
        name = "results.bin" if late_attempt is None else f"results.attempt-{int(late_attempt)}.bin"
        atomic_write(self.dir(job_id) / name, data)

    def promote_results(self, job_id: str, attempt: int) -> bytes | None:
        """Make the results kept aside for ``attempt`` the job's results; return them (None: none came)."""
        aside = self.dir(job_id) / f"results.attempt-{int(attempt)}.bin"
        try:
            data = aside.read_bytes()
        except FileNotFoundError:
            return None
        os.replace(aside, self.dir(job_id) / "results.bin")
        return data

    # --- checkpoints (DESIGN.md §8: a job's latest complete checkpoint lives with its submitter) ---

    def checkpoint_meta(self, job_id: str) -> dict[str, Any] | None:
        """``{"attempt", "step", "sha256", "size"}`` of the job's kept checkpoint (None: none yet)."""
        try:
            meta = json.loads((self.dir(job_id) / "checkpoint" / "checkpoint.json").read_text())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def checkpoint_chunk(self, job_id: str, offset: int, length: int) -> tuple[bytes, int, str]:
        """A chunk of the kept checkpoint archive, its size and sha256 (``b"", 0, ""``: none)."""
        meta = self.checkpoint_meta(job_id)
        if meta is None:
            return b"", 0, ""
        with open(self.dir(job_id) / "checkpoint" / "checkpoint.tgz", "rb") as f:
            f.seek(max(0, offset))
            return f.read(max(0, length)), int(meta["size"]), str(meta["sha256"])

    def keep_checkpoint_part(
        self, job_id: str, peer: str, data: bytes, *, attempt: int, step: int, hosts: int,
        merge: Callable[[list[bytes]], tuple[bytes, str]],
    ) -> bool:
        """Keep one host's part of ``attempt``'s checkpoint ``step``; once all ``hosts`` parts are
        in, ``merge`` them into one archive that replaces an older kept checkpoint.  True when the
        checkpoint became the job's (an older or equal one than the kept checkpoint is dropped)."""
        root = self.dir(job_id) / "checkpoint"
        parts = root / f"parts-a{int(attempt)}-s{int(step)}"
        parts.mkdir(parents=True, exist_ok=True)
        atomic_write(parts / f"{hashlib.sha256(peer.encode()).hexdigest()[:16]}.tgz", data)
        have = sorted(parts.glob("*.tgz"))
        if len(have) < hosts:
            return False
        meta = self.checkpoint_meta(job_id)
        if meta is not None and (int(meta["attempt"]), int(meta["step"])) >= (attempt, step):
            shutil.rmtree(parts, ignore_errors=True)
            return False
        merged, sha = merge([p.read_bytes() for p in have])
        atomic_write(root / "checkpoint.tgz", merged)
        atomic_write(root / "checkpoint.json", json.dumps(
            {"attempt": attempt, "step": step, "sha256": sha, "size": len(merged)}).encode())
        for old in root.glob("parts-*"):
            shutil.rmtree(old, ignore_errors=True)
        return True

    def has_results(self, job_id: str) -> bool:
        return (self.dir(job_id) / "results.bin").exists()

    def results(self, job_id: str) -> bytes | None:
        self.get(job_id)
        try:
            return (self.dir(job_id) / "results.bin").read_bytes()
        except FileNotFoundError:
            return None

    # --- retention -------------------------------------------------------------------------------

    def mark_fetched(self, job_id: str) -> None:
        """Note that a client fetched the job's results (they may then go after ``keep_finished_days``)."""
        self.get(job_id)
        with contextlib.suppress(FileExistsError):
            (self.dir(job_id) / FETCHED_FILE).touch(mode=0o600, exist_ok=False)

    def expired(self, now: float, keep_finished_s: float, keep_unfetched_s: float) -> list[str]:
        """The finished jobs to remove at ``now``: finished ``keep_finished_s`` ago with their results
        fetched or with none, or ``keep_unfetched_s`` ago with results never fetched (0: keep).  Never
        a queued or running job, nor one with a live follower."""
        out = []
        for rec in self._records.values():
            if not rec.terminal or self._followers.get(rec.id):
                continue
            d = self.dir(rec.id)
            fetched = (d / FETCHED_FILE).exists() or not any(d.glob("results*.bin"))
            keep = keep_finished_s if fetched else keep_unfetched_s
            finished = rec.finished_at if rec.finished_at is not None else rec.updated_at
            if keep > 0 and now - finished >= keep:
                out.append(rec.id)
        return out

    def remove(self, job_id: str) -> Path | None:
        """Forget a finished job and move its directory aside; return where (the caller deletes it,
        e.g. in a thread: :func:`shutil.rmtree`).  ``JobStateError`` for a job that is not finished."""
        rec = self.get(job_id)
        if not rec.terminal:
            raise JobStateError(f"job {job_id} is {rec.state}: only finished jobs are removed")
        with self._save_lock:
            self._records.pop(job_id, None)
        self._seq.pop(job_id, None)
        self._followers.pop(job_id, None)
        aside = self.root / f".removing-{job_id}"
        try:
            os.replace(self.dir(job_id), aside)
        except FileNotFoundError:
            return None
        return aside

    def _publish(self, job_id: str, ev: dict[str, Any] | None) -> None:
        for q in list(self._followers.get(job_id, ())):
            try:
                q.put_nowait(ev)
            except asyncio.QueueFull:
                self._followers[job_id].discard(q)
                with contextlib.suppress(asyncio.QueueFull):
                    q.get_nowait()
                    q.put_nowait(None)

    async def follow(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """The job's state and every output event from the start, then live ones until it ends."""
        rec = self.get(job_id)
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(FOLLOW_QUEUE)
        self._followers.setdefault(job_id, set()).add(q)
        try:
            yield {"type": "state", "job": rec.summary()}
            last = 0
            for ev in self.read_output(job_id):
                last = ev["seq"]
                yield ev
            if self.get(job_id).terminal:
                yield {"type": "state", "job": self.get(job_id).summary()}
                return
            while True:
                live = await q.get()
                if live is None:
                    yield {"type": "state", "job": self.get(job_id).summary()}
                    return
                if live["type"] == "output":
                    if live["seq"] <= last:
                        continue
                    last = live["seq"]
                yield live
        finally:
            self._followers.get(job_id, set()).discard(q)


def stale_run_dirs(runs_dir: Path, now: float, keep_s: float, live: set[str]) -> list[Path]:
    """Directories ``runs_dir/JOB`` (rank hosts' leftovers of earlier attempts) of jobs not in ``live``
    whose newest file is older than ``keep_s`` (0: keep)."""
    if keep_s <= 0:
        return []
    out = []
    with contextlib.suppress(FileNotFoundError):
        for d in runs_dir.iterdir():
            if d.name in live or not d.is_dir() or d.is_symlink():
                continue
            newest = d.lstat().st_mtime
            for sub, dirs, files in os.walk(d):
                for name in (*dirs, *files):
                    with contextlib.suppress(OSError):
                        newest = max(newest, os.lstat(os.path.join(sub, name)).st_mtime)
            if now - newest >= keep_s:
                out.append(d)
    return out


async def prune_once(store: JobStore, runs_dir: Path, *, keep_finished_s: float, keep_unfetched_s: float,
                     live: Callable[[], set[str]], now: float) -> tuple[list[str], list[Path]]:
    """Remove the expired finished jobs (:meth:`JobStore.expired`) and the run leftovers of jobs not
    ``live()`` on this node; return what went.  Decisions on the loop, deletions in a thread."""
    jobs = store.expired(now, keep_finished_s, keep_unfetched_s)
    gone: list[Path] = []
    for job_id in jobs:
        aside = store.remove(job_id)
        if aside is not None:
            gone.append(aside)
    runs = await asyncio.to_thread(stale_run_dirs, runs_dir, now, keep_finished_s, live())
    still = live()
    runs = [d for d in runs if d.name not in still]  # a job may have started here meanwhile
    for path in [*gone, *runs]:
        await asyncio.to_thread(shutil.rmtree, path, True)
    if jobs or runs:
        log.info("retention: removed %d finished job(s) %s and %d run leftover(s)", len(jobs),
                 ", ".join(jobs[:10]) + (" ..." if len(jobs) > 10 else ""), len(runs))
    return jobs, runs


async def keep_pruned(store: JobStore, runs_dir: Path, *, keep_finished_days: float,
                      keep_unfetched_days: float, live: Callable[[], set[str]],
                      every_s: float = PRUNE_EVERY_S, clock: Callable[[], float] = time.time) -> None:
    """:func:`prune_once` at start, then every ``every_s``, until cancelled (a failure is logged and
    retried at the next round: retention must never stop the daemon)."""
    while True:
        try:
            await prune_once(store, runs_dir, keep_finished_s=keep_finished_days * DAY_S,
                             keep_unfetched_s=keep_unfetched_days * DAY_S, live=live, now=clock())
        except (OSError, JobStateError) as exc:
            log.warning("retention: pruning failed, retrying in %.0f s: %s", every_s, exc)
        await asyncio.sleep(every_s)
