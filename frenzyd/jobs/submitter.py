"""The submitter role: a node's own jobs -- records, payloads, output, results, (re)submission."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import os
import secrets
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from frenzyd.errors import AuthError, FrenzyError, JobStateError, LaunchError, WireError
from frenzyd.jobs import bulk
from frenzyd.jobs.context import (
    CHUNK,
    RESUBMIT_S,
    SEND_TIMEOUT_S,
    ClusterView,
    RoleContext,
    Versions,
    own_codes,
    slug,
)
from frenzyd.jobs.lifecycle import (
    BeginAttempt,
    Cancel,
    Exits,
    Fail,
    LateExits,
    Placed,
    Requeue,
    StaleAttempt,
    Wait,
    is_late,
    step,
)
from frenzyd.jobs.messages import (
    Ack,
    AttemptAck,
    JobAttempt,
    JobCancel,
    JobCheckpoint,
    JobExit,
    JobFinished,
    JobOutput,
    JobResults,
    JobState,
    JobSubmit,
    PayloadChunk,
    PayloadFetch,
    StateAck,
)
from frenzyd.jobs.model import (
    JobRecord,
    JobSpec,
    new_record,
)
from frenzyd.jobs.placement import SeenInventory, job_model, offers_from_reports, place, predicted_rank_peaks
from frenzyd.jobs.store import JobStore, atomic_write
from frenzyd.marp.calibration import (
    Calibration,
    CalibrationError,
    MeasuredRun,
    dump_calibration,
    fold_run,
    load_calibration,
)

log = logging.getLogger(__name__)

CHECKPOINT_COMPRESSLEVEL = 0
"""gzip level of the checkpoint a submitter keeps, merged from its hosts' parts: stored, as the parts
(``launcher.RESULTS_COMPRESSLEVEL``).  Re-deflating tensors at level 6 cost ~2.4 CPU s per copy of
a tiny-llama checkpoint for ~26 %, two thirds of the daemon's CPU beside the ranks in
``scripts/bench_trainer_overhead.py`` (py-spy: 397 of 588 busy samples)."""


class PackDir(Protocol):
    """``payload.pack_dir``: a directory as a gzip'd tar and its sha256, at most ``max_bytes``."""

    def __call__(self, path: Path, max_bytes: int, *, compresslevel: int = ...) -> tuple[bytes, str]: ...

PROGRESS_LINE_CAP = 64 * 1024
"""Longest partial line of rank 0's output kept while waiting for its end."""
RESULT_SUMMARY_CAP = 4 << 20
"""Largest ``summary.json`` read out of a job's results (the trainer's is a few KiB)."""


def trainer_summary(results: bytes) -> dict[str, Any] | None:
    """Rank 0's ``summary.json`` out of a job's results archive (a gzip'd tar), or None."""
    try:
        with tarfile.open(fileobj=io.BytesIO(results), mode="r:gz") as tar:
            member = tar.getmember("summary.json")
            if not member.isfile() or member.size > RESULT_SUMMARY_CAP:
                return None
            f = tar.extractfile(member)
            doc = json.loads(f.read()) if f is not None else None
    except (KeyError, OSError, EOFError, tarfile.TarError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def fold_trainer_run(cal: Calibration, rec: JobRecord, results: bytes) -> Calibration:
    """``cal`` with a finished trainer job's run folded in (``cal`` itself when the results carry
    no usable measurement: no summary, a rank count that does not match the plan, ...)."""
    summary = trainer_summary(results)
    plan = rec.plan
    if summary is None or plan is None:
        return cal
    measured = summary.get("measured_peak_bytes")
    predicted = predicted_rank_peaks(rec.spec, plan)
    if not isinstance(measured, list) or not predicted or len(measured) != len(predicted):
        log.info("job %s: no per-rank measurement to calibrate MARP with", rec.id)
        return cal
    try:
        run = MeasuredRun(
            gpu_type=plan.gpu_type, family=job_model(rec.spec).family, torch_version=rec.spec.torch_version,
            device="cpu" if plan.backend == "gloo" else "cuda", predicted_peak_bytes=predicted,
            measured_peak_bytes=[int(m) for m in measured], job=rec.id,
        )
        return fold_run(cal, run)
    except (FrenzyError, TypeError, ValueError) as exc:
        log.info("job %s: its measurement does not calibrate MARP: %s", rec.id, exc)
        return cal

CALIBRATION_FILE = "marp-calibration.json"
"""This node's trainer jobs' measured peaks against MARP's predictions (``frenzyd.marp.calibration``
format; ``frenzy-client predict --calibration FILE`` reads it)."""
SEEN_FILE = "seen-gpus.json"
"""The most GPUs of each kind seen in the pool at once (``SeenInventory``), in the data directory."""
UNPLACEABLE_CHECK_S = 30.0
"""How often a waiting job is checked against what the pool has held (MARP is not free)."""


@dataclass(frozen=True, slots=True)
class ReceivedPayload:
    """A job's packed directory as received from its submitting user: a file of the job store's
    (``JobStore.incoming``), its size and sha256 hex."""

    path: Path
    size: int
    sha256: str


class SubmitterRole:
    """Keeps the authoritative records of the jobs submitted on this node."""

    def __init__(
        self,
        ctx: RoleContext,
        store: JobStore,
        *,
        pack_dir: PackDir,
        versions: Versions,
        max_payload_bytes: int,
        max_result_bytes: int,
        unplaceable_after_s: float = 3600.0,
        unpack: Callable[[bytes, str, Path, int], Any] | None = None,
        max_checkpoint_bytes: int = 1 << 30,
    ) -> None:
        self.ctx = ctx
        self.store = store
        self.unplaceable_after_s = unplaceable_after_s
        self._born = ctx.clock()
        self._absent_since: dict[str, float] = {}  # peer running one of our attempts -> left the view
        self._unfit_since: dict[str, float] = {}  # waiting job -> since when nothing seen could hold it
        self._fit_checked: dict[str, float] = {}
        self._seen_path = store.root.parent / SEEN_FILE
        self.seen = self._load_seen()
        self._calibration_path = store.root.parent / CALIBRATION_FILE
        self.calibration = self._load_calibration()
        self.progress: dict[str, dict[str, Any]] = {}
        """Trainer job -> its last step (``summary``'s ``progress``)."""
        self.measured: dict[str, list[int]] = {}
        """Trainer job -> each rank's measured peak, from its results."""
        self._progress_buf: dict[str, bytes] = {}
        self._predicted: dict[tuple[str, int], list[int] | None] = {}
        self._pack_dir = pack_dir
        self.versions = versions
        self.max_payload_bytes, self.max_result_bytes = max_payload_bytes, max_result_bytes
        self._acked: dict[str, tuple[str, int]] = {}  # job -> (coordinator, term) that has it
        self._resend_at: dict[str, float] = {}
        self._cancelling: set[str] = set()
        self._preempted: dict[tuple[str, int], set[str]] = {}  # attempt being preempted -> peers stopped
        self._ckpt_buf: dict[tuple[str, int, str], bytearray] = {}
        self._unpack = unpack
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self._results_buf: dict[tuple[str, int], bytearray] = {}
        self._placing_seen: dict[tuple[str, int], float] = {}  # attempt in flight -> last sign of it

    async def submit(self, request: Mapping[str, Any], *, payload: ReceivedPayload | None = None,
                     owner: tuple[str, int] | None = None) -> JobRecord:
        """Persist a queued job owned by ``owner`` (user name, uid) and hand it to the coordinator.

        ``request`` carries the JobSpec fields except versions.  ``payload`` is the packed job
        directory as the client sent it (a file from ``store.incoming()``, moved into the job);
        its hash and size are the job's (a ``payload_sha256``/``payload_size`` in ``request`` must
        match them).  Without ``payload``, ``request['workdir']`` is packed here with this
        daemon's privileges: for in-process callers only (tests), never on a user's behalf --
        the client API refuses ``workdir``.
        Raises ``JobStateError``/``LaunchError`` with a message for the user.
        """
        fields = {k: v for k, v in request.items() if k != "workdir"}
        data: bytes | Path
        if payload is not None:
            if "workdir" in request:
                raise JobStateError("give the packed payload or a workdir, not both")
            if payload.size > self.max_payload_bytes:
                raise LaunchError(f"payload of {payload.size} bytes is over this node's cap of "
                                  f"{self.max_payload_bytes} ([launcher] max_payload_bytes)")
            for key, got in (("payload_sha256", payload.sha256), ("payload_size", payload.size)):
                if fields.get(key) is not None and fields[key] != got:
                    raise LaunchError(f"the payload received does not match its {key} ({fields[key]!r}, "
                                        f"received {got!r}): it was cut short or altered; submit again")
            data, sha, size = payload.path, payload.sha256, payload.size
        else:
            workdir = Path(str(request.get("workdir") or ""))
            if not workdir.is_absolute() or not await asyncio.to_thread(workdir.is_dir):
                raise JobStateError(f"job directory {workdir} is not an absolute path to a directory")
            packed, sha = await asyncio.to_thread(self._pack_dir, workdir, self.max_payload_bytes)
            data, size = packed, len(packed)
        fields.update(payload_sha256=sha, payload_size=size, python_version=self.versions.python,
                      torch_version=self.versions.torch)
        try:
            spec = JobSpec.from_dict(fields)
        except WireError as exc:
            raise JobStateError(str(exc).removeprefix("job spec: ")) from None
        now = self.ctx.clock()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        job_id = f"{slug(self.ctx.node_name)}-{stamp}-{secrets.token_hex(2)}"
        rec = new_record(job_id, spec, self.ctx.node_id, self.ctx.node_name, now, owner=owner)
        await asyncio.to_thread(self.store.create, rec, data)
        log.info("job %s queued for %s (%s)", job_id, owner[0] if owner else "the daemon's user",
                 " ".join(spec.argv))
        self.ctx.wake()
        return rec

    async def cancel(self, job_id: str) -> JobRecord:
        """Cancel a job submitted here: queued ones at once, running ones through the coordinator."""
        rec = self.store.get(job_id)
        if rec.terminal:
            return rec
        v = self.ctx.view()
        if rec.state == "running" or (v.coordinator is not None and rec.id in self._acked):
            if v.coordinator is None:
                raise JobStateError("no coordinator right now: the cancel cannot reach the ranks; "
                                    "retry shortly")
            self._cancelling.add(job_id)  # exits of the killed ranks now mean "cancelled"
            try:
                await self.ctx.send(v.coordinator, JobCancel(job_id), SEND_TIMEOUT_S)
            except FrenzyError:
                self._cancelling.discard(job_id)
                raise
        rec = self.store.get(job_id)
        if not rec.terminal:
            rec = step(rec, Cancel(), now=self.ctx.clock())
            self.store.save(rec)
        return rec

    def _load_seen(self) -> SeenInventory:
        try:
            return SeenInventory.from_dict(json.loads(self._seen_path.read_text()))
        except FileNotFoundError:
            return SeenInventory()
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring unreadable %s (%s): the pool's GPUs are learned again",
                        self._seen_path, exc)
            return SeenInventory()

    def _load_calibration(self) -> Calibration:
        if not self._calibration_path.exists():
            return Calibration()
        try:
            return load_calibration(self._calibration_path)
        except CalibrationError as exc:
            aside = self._calibration_path.with_name(self._calibration_path.name + ".unreadable")
            with contextlib.suppress(OSError):
                os.replace(self._calibration_path, aside)
            log.warning("%s; moved it to %s and started a new one", exc, aside)
            return Calibration()

    def _observe_pool(self, v: ClusterView) -> None:
        if self.seen.observe(offers_from_reports(v.peers)):
            try:
                atomic_write(self._seen_path, json.dumps(self.seen.to_dict()).encode())
            except OSError as exc:
                log.warning("cannot remember the pool's GPUs in %s: %s", self._seen_path, exc)

    def _lost_peers(self, v: ClusterView, rec: JobRecord, now: float) -> list[str]:
        """Peers of a running attempt whose ranks are gone: a live peer that lists neither the
        attempt's lease nor its undelivered exit report, or a peer out of the view for longer
        than its ranks' lease outlives it.  Nothing is lost in the first heartbeats after this
        daemon started (it re-attaches to its running jobs as their peers' reports arrive)."""
        for p in rec.peers():
            if p not in v.peers:
                self._absent_since.setdefault(p, now)
        grace = 5 * self.ctx.heartbeat_s + 10
        if now - self._born < grace or now - (rec.started_at or now) < grace:
            return []
        lost = []
        for p in rec.peers():
            if self._peer_exited(rec, p):
                continue
            if p not in v.peers:
                if now - self._absent_since[p] >= self.ctx.lease_timeout_s + 2 * self.ctx.heartbeat_s:
                    lost.append(p)
            elif not self._peer_has_job(v, p, rec):
                lost.append(p)
        return lost

    async def _check_unplaceable(self, rec: JobRecord, now: float) -> JobRecord:
        """Fail a waiting job that nothing this node has seen in the pool could hold, once that has
        been so for ``unplaceable_after_s``; say what was seen.  MARP's plans of a new job shape take
        up to a few hundred ms to enumerate: off the event loop."""
        every = min(UNPLACEABLE_CHECK_S, self.unplaceable_after_s / 4)
        if not self.seen.kinds or now - self._fit_checked.get(rec.id, 0.0) < every:
            return rec
        self._fit_checked[rec.id] = now
        try:
            await asyncio.to_thread(place, rec.spec, self.seen.offers())
        except FrenzyError as exc:
            cur = self.store.find(rec.id)
            if cur is not rec:  # it changed meanwhile (cancelled, placed): judged again next time
                return rec if cur is None else cur
            since = self._unfit_since.setdefault(rec.id, max(now, self._born))
            if now - since < self.unplaceable_after_s:
                return rec
            why = (f"no GPUs seen in this pool can hold it ({exc}); seen: {self.seen.describe()}. "
                   f"Waited {now - since:.0f}s ([jobs] unplaceable_after_s)")
            rec = step(rec, Fail(why), now=now)
            self.store.save(rec)
            log.warning("job %s failed: %s", rec.id, why)
            return rec
        self._unfit_since.pop(rec.id, None)
        return rec

    async def tick(self, v: ClusterView) -> None:
        """Requeue jobs whose ranks were lost, fail the unplaceable, (re)submit the rest."""
        now = self.ctx.clock()
        self._observe_pool(v)
        for p in [p for p in self._absent_since if p in v.peers]:
            del self._absent_since[p]
        for stored in self.store.all():
            rec = stored
            if rec.terminal:
                continue
            if rec.phase == "placing":
                self._placing_may_run(v, rec, now)  # remember the last peer report that holds it
            if rec.state == "running":
                lost = self._lost_peers(v, rec, now)
                if lost:
                    # A peer of an attempt being preempted (another peer already reported its ranks
                    # stopped as ordered) whose report has not come yet stopped as ordered too: its
                    # heartbeat dropped the lease before its exit report arrived.  Counting that as a
                    # lost attempt failed a job moved three times across two hosts (bench_live).
                    ordered = (rec.id, rec.attempt) in self._preempted
                    why = f"preempted; peer {lost[0][:12]}'s exit report did not come" if ordered else \
                        f"lost ranks on peer {lost[0][:12]}"
                    self._preempted.pop((rec.id, rec.attempt), None)
                    rec = step(rec, Requeue(rec.attempt, why, lost=not ordered), now=now)
                    self.store.save(rec)
                    self._acked.pop(rec.id, None)
                    log.warning("job %s: %s; requeued", rec.id, rec.message)
            if rec.state == "queued" and rec.phase == "waiting":
                rec = await self._check_unplaceable(rec, now)
                if rec.terminal:
                    continue
            acked = self._acked.get(rec.id) == (v.coordinator, v.term)
            if v.coordinator is None or (acked and now < self._resend_at.get(rec.id, 0)):
                continue
            self._resend_at[rec.id] = now + RESUBMIT_S
            try:
                reply = await self.ctx.send(v.coordinator, JobSubmit(rec), SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: coordinator unreachable (%s); will retry", rec.id, exc)
                continue
            if Ack.from_body(reply).ok:
                self._acked[rec.id] = (v.coordinator, v.term)

    @staticmethod
    def _peer_has_job(v: ClusterView, peer: str, rec: JobRecord) -> bool:
        rep = v.peers.get(peer)
        if rep is None:
            return False
        return any(isinstance(x, Mapping) and x.get("job_id") == rec.id and x.get("attempt") == rec.attempt
                   for x in [*(rep.get("leases") or ()), *(rep.get("outbox") or ())])

    def _attempt_alive(self, rec: JobRecord) -> bool:
        """Every peer of the running attempt that has not exited is live here and lists its lease
        or outbox: a coordinator that cannot see them (an asymmetric partition) must not requeue
        the job, or the new attempt could start before these ranks' leases run out."""
        v = self.ctx.view()
        return all(self._peer_exited(rec, p) or self._peer_has_job(v, p, rec) for p in rec.peers())

    def _placing_may_run(self, v: ClusterView, rec: JobRecord, now: float) -> str | None:
        """Why attempt ``a`` of a record still placing it may have ranks running (None: it cannot).

        A coordinator that dies between launching ``a`` and telling this node leaves the record
        placing while the ranks run (their lease renewed, since this node confirms a placing
        attempt) until their exit report, which carries the placement, arrives.  A new attempt must
        wait until no peer lists ``a``'s lease or undelivered exit and ``lease_timeout_s + 2 x
        heartbeat_s`` have passed since one did (or since ``a`` was numbered, or this daemon
        started): by then any rank of ``a`` on a silent peer has been killed by its supervisor.
        """
        if rec.phase != "placing" or rec.attempt < 1:
            return None
        key = (rec.id, rec.attempt)
        holders = [p for p in v.peers if self._peer_has_job(v, p, rec)]
        if holders:
            self._placing_seen[key] = now
            return f"attempt {rec.attempt} is still held on peer {holders[0][:12]}"
        since = max(self._born, self._placing_seen.get(key, float("-inf")))
        if now - since < self.ctx.lease_timeout_s + 2 * self.ctx.heartbeat_s:
            return f"attempt {rec.attempt} may still run on a silent peer until its lease runs out"
        return None

    @staticmethod
    def _peer_exited(rec: JobRecord, peer: str) -> bool:
        return all(r.rank in rec.exit_codes for r in rec.ranks if r.peer == peer)

    async def on_attempt(self, peer: str, msg: JobAttempt) -> AttemptAck | Ack:
        """The coordinator is about to place a job of ours: allocate (and persist) its next attempt.

        Numbers come only from here, so an attempt number is never used twice, even when the
        coordinator changes mid-placement.  A job that is over or running gets attempt 0 and its
        state, so the coordinator drops its stale copy.
        """
        v = self.ctx.view()
        if msg.term < v.term:
            return Ack(False, f"stale term {msg.term}: this node has seen term {v.term}")
        rec = self.store.get(msg.job_id)
        if rec.terminal or rec.state == "running":
            return AttemptAck(0, rec.state)
        now = self.ctx.clock()
        held = self._placing_may_run(v, rec, now)
        if held is None and rec.attempt > 0:
            holders = [p for p in v.peers if self._peer_has_job(v, p, rec)]
            if holders:  # the last attempt's ranks (a lease) or its undelivered exit report (outbox)
                held = f"peer {holders[0][:12]} still holds attempt {rec.attempt} or its exit report"
        if held is not None:  # the coordinator tries again later; the attempt's exit may settle it
            log.debug("job %s: no new attempt yet: %s", rec.id, held)
            return AttemptAck(0, rec.state)
        rec = step(rec, BeginAttempt(), now=now)
        # On the loop, not in a thread: a cancel handled meanwhile must not be overwritten by this
        # older copy (and the store's followers are asyncio queues).
        self.store.save(rec)
        self._placing_seen[(rec.id, rec.attempt)] = now
        return AttemptAck(rec.attempt, rec.state)

    def _apply_placement(self, rec: JobRecord, theirs: JobRecord) -> JobRecord:
        """Adopt the coordinator's placement carried in a state or exit message (its attempt only)."""
        if theirs.state != "running" or (rec.state == "running" and rec.attempt == theirs.attempt):
            return rec
        if theirs.attempt != rec.attempt:  # only the attempt this node numbered can start
            self.ctx.stale(JobState.KIND, f"job {rec.id}: placement of attempt {theirs.attempt}, "
                           f"this node numbered attempt {rec.attempt}")
            return rec
        try:
            placed = Placed(theirs.attempt, theirs.ranks, theirs.term, theirs.plan)
            rec = step(rec, placed, now=self.ctx.clock())
        except StaleAttempt as exc:
            self.ctx.stale("job.state", exc)
            return rec
        self.store.save(rec)
        log.info("job %s attempt %d running on %d rank(s), term %d", rec.id, rec.attempt, rec.world_size,
                 rec.term)
        return rec

    async def on_state(self, peer: str, msg: JobState) -> StateAck:
        theirs = msg.record
        rec = self.store.get(theirs.id)
        if rec.terminal:
            return StateAck(rec.state)
        try:
            if theirs.state == "running":
                rec = self._apply_placement(rec, theirs)
            elif theirs.state == "failed" and rec.state == "queued":
                rec = step(rec, Fail(theirs.message), now=self.ctx.clock())
                self.store.save(rec)
            elif theirs.state == "queued" and theirs.term == 0 and theirs.attempt == rec.attempt \
                    and (rec.state == "running" or rec.phase == "placing") \
                    and not (rec.state == "running" and self._attempt_alive(rec)):
                rec = step(rec, Requeue(rec.attempt, theirs.message, lost=rec.state == "running"),
                           now=self.ctx.clock())
                self.store.save(rec)
                self._acked.pop(rec.id, None)
            elif theirs.state == "queued" and rec.phase == "waiting" and theirs.message != rec.message:
                rec = step(rec, Wait(theirs.message), now=self.ctx.clock())
                self.store.save(rec)
        except StaleAttempt as exc:
            self.ctx.stale(JobState.KIND, exc)
        return StateAck(rec.state)

    def _current(self, kind: str, job_id: str, attempt: int) -> JobRecord | None:
        """The job's record when ``attempt`` is its current attempt; otherwise count a refusal."""
        rec = self.store.get(job_id)
        if attempt == rec.attempt and attempt > 0:
            return rec
        self.ctx.stale(kind, f"job {job_id}: attempt {attempt}, the job is at attempt {rec.attempt}")
        return None

    async def on_output(self, peer: str, msg: JobOutput) -> Ack:
        rec = self._current(JobOutput.KIND, msg.job_id, msg.attempt)
        if rec is None:
            return Ack(False, f"stale attempt {msg.attempt}")
        _check_attempt_host(rec, msg.attempt, peer, "output")
        now = self.ctx.clock()
        for ch in msg.chunks:
            self.store.append_output(rec.id, ch.rank, ch.stream, ch.data, now, attempt=msg.attempt)
            if ch.rank == 0 and ch.stream == ("stdout" if rec.spec.trainer else "control"):
                self._follow_progress(rec, ch.data, now)  # a checkpointable script's: its reports
        return Ack()

    def _follow_progress(self, rec: JobRecord, data: bytes, now: float) -> None:
        """Rank 0 of the built-in trainer prints one JSON line per step: keep the latest."""
        buf = self._progress_buf.get(rec.id, b"") + data
        *lines, rest = buf.split(b"\n")
        self._progress_buf[rec.id] = rest[-PROGRESS_LINE_CAP:]
        for line in reversed(lines):
            try:
                step = json.loads(line)
            except ValueError:
                continue
            if isinstance(step, dict) and isinstance(step.get("step"), int) and "loss" in step:
                self.progress[rec.id] = {
                    **{k: step.get(k) for k in ("step", "steps", "loss", "tokens_per_s", "eta_s", "step_s")},
                    "attempt": rec.attempt, "updated_at": now,
                }
                return

    def summary(self, rec: JobRecord) -> dict[str, Any]:
        """The job's status entry: the record's summary plus, for a built-in trainer job,
        ``progress`` (the last step rank 0 reported; null before the first) and ``memory`` (MARP's
        per-rank prediction for the current plan and, once the results are in, each rank's
        measured peak)."""
        out = rec.summary()
        if not rec.spec.keeps_checkpoints:
            return out
        out["progress"] = self.progress.get(rec.id)
        predicted = None
        if rec.plan is not None:
            key = (rec.id, rec.attempt)
            if key not in self._predicted:
                self._predicted[key] = predicted_rank_peaks(rec.spec, rec.plan)
            predicted = self._predicted[key]
        out["memory"] = {"predicted_peak_bytes": predicted, "measured_peak_bytes": self.measured.get(rec.id)}
        return out

    async def on_results(self, peer: str, msg: JobResults) -> Ack:
        """Rank 0's results, in chunks.  The current attempt's become the job's results; an earlier
        attempt's, arriving late while the job is not over, are kept aside until that attempt's
        late exit reports show whether it succeeded (``LateExits``).  Once a finished job has its
        results, later copies are acknowledged and dropped.

        Only the node that ran rank 0 of the attempt may send them, when this node knows the
        attempt's placement (else ``AuthError`` ``not_rank0_host``, logged); an attempt whose
        placement never reached this node (its exit report, which carries it, comes after the
        results) or an earlier attempt's late results cannot be checked this way."""
        job_id, off, total, data = msg.job_id, msg.offset, msg.total, msg.data
        rec = self.store.find(job_id)
        late = rec is not None and not rec.terminal and 0 < msg.attempt < rec.attempt  # own attempt: as usual
        if not late and self._current(JobResults.KIND, job_id, msg.attempt) is None:
            return Ack(False, f"stale attempt {msg.attempt}")
        rank0 = _rank0_host(rec, msg.attempt)
        if rank0 is not None and peer != rank0:
            log.warning("job %s: refused results of attempt %d from node %s, which did not run its rank 0",
                        job_id, msg.attempt, peer[:12])
            raise AuthError("not_rank0_host", f"results of job {job_id} attempt {msg.attempt} from node "
                            f"{peer[:12]}, but its rank 0 ran on {rank0[:12]}")
        if total > self.max_result_bytes or off < 0:
            raise LaunchError(f"results of {total} bytes exceed the cap of {self.max_result_bytes}")
        key = (job_id, msg.attempt)
        buf = self._results_buf.setdefault(key, bytearray())
        if off != len(buf):
            buf.clear()
            if off != 0:
                raise LaunchError("results arrived out of order")
        buf.extend(data)
        if len(buf) < total:
            return Ack()
        results = bytes(buf)
        del self._results_buf[key]
        rec = self.store.get(job_id)
        if late:
            await asyncio.to_thread(self.store.write_results, job_id, results, late_attempt=msg.attempt)
            return Ack()
        if rec.terminal and await asyncio.to_thread(self.store.has_results, job_id):
            return Ack()  # a resent copy, or a stopped attempt's after a late success: keep the first
        await asyncio.to_thread(self.store.write_results, job_id, results)
        if rec.spec.trainer and rec.plan is not None:
            self.ctx.spawn(self._calibrate(rec, results), f"calibrate {job_id}")
        return Ack()

    async def _calibrate(self, rec: JobRecord, results: bytes) -> None:
        """Fold a trainer job's measured per-rank peaks into this node's MARP calibration file."""
        summary = await asyncio.to_thread(trainer_summary, results)
        measured = (summary or {}).get("measured_peak_bytes")
        if isinstance(measured, list) and all(isinstance(m, int) for m in measured):
            self.measured[rec.id] = measured
        cal = await asyncio.to_thread(fold_trainer_run, self.calibration, rec, results)
        if cal is self.calibration:
            return
        try:
            await asyncio.to_thread(atomic_write, self._calibration_path, dump_calibration(cal).encode())
        except OSError as exc:
            log.warning("cannot write %s: %s", self._calibration_path, exc)
            return
        self.calibration = cal

    def on_exit(self, peer: str, msg: JobExit) -> None:
        """A peer's ranks of one of our jobs exited: requeue (vacated) or record the exit codes."""
        mine = self.store.find(msg.job_id)
        if mine is None:
            return
        if mine.terminal:
            if msg.attempt != mine.attempt:
                self.ctx.stale(JobExit.KIND, f"job {mine.id} is {mine.state}: exit of attempt {msg.attempt}")
            return
        if is_late(mine, msg.attempt):
            self._on_late_exit(peer, mine, msg)
            return
        if msg.record is not None:
            mine = self._apply_placement(mine, msg.record)
        # A peer reports only the ranks it was given.
        codes = own_codes(msg.exit_codes, mine, peer)
        try:
            key = (mine.id, msg.attempt)
            if mine.state == "running" and (msg.preempted or key in self._preempted):
                # Requeued once every peer of the attempt has stopped (and written its part of the
                # checkpoint): a new attempt must not start beside ranks still saving.
                stopped = self._preempted.setdefault(key, set())
                stopped.add(peer)
                if not set(mine.peers()) <= stopped:
                    return
                del self._preempted[key]
                rec = step(mine, Requeue(msg.attempt, msg.reason or "preempted", lost=False),
                           now=self.ctx.clock())
                self.store.save(rec)
                self._acked.pop(rec.id, None)
                log.info("job %s attempt %d: %s; requeued", rec.id, msg.attempt, rec.message)
                return
            if mine.state == "running" and msg.vacated:
                why = msg.reason or "it stopped"
                why = f"vacated by peer {peer[:12]}: {why}"
                # A reported stop (owner, shutdown, an unrenewable lease) is not the job's doing.
                rec = step(mine, Requeue(msg.attempt, why, lost=False), now=self.ctx.clock())
                self.store.save(rec)
                self._acked.pop(rec.id, None)
                log.warning("job %s: %s; requeued", rec.id, rec.message)
                return
            rec = step(mine, Exits(msg.attempt, codes), now=self.ctx.clock())
        except StaleAttempt as exc:
            self.ctx.stale(JobExit.KIND, exc)
            return
        if rec.state == "failed" and rec.id in self._cancelling:
            rec = replace(rec, state="cancelled", message="cancelled by user")
        if rec != mine:
            self.store.save(rec)
        if rec.terminal:
            log.info("job %s %s: %s", rec.id, rec.state, rec.message)
            self.ctx.spawn(self._announce_finished(rec), f"finished {rec.id}")

    def _on_late_exit(self, peer: str, mine: JobRecord, msg: JobExit) -> None:
        """The exit report of an earlier attempt, requeued while its host was cut off or frozen:
        if every rank of it exited 0 the job succeeded, and the attempt running now is stopped."""
        placed = msg.record
        if msg.vacated or placed is None or placed.attempt != msg.attempt or not placed.ranks:
            self.ctx.stale(JobExit.KIND, f"job {mine.id}: exit of attempt {msg.attempt}, the job is at "
                           f"attempt {mine.attempt}")
            return
        codes = own_codes(msg.exit_codes, placed, peer)
        try:
            rec = step(mine, LateExits(msg.attempt, placed.ranks, codes, placed.plan), now=self.ctx.clock())
        except StaleAttempt as exc:
            self.ctx.stale(JobExit.KIND, exc)
            return
        if rec.state != "succeeded":
            self.store.save(rec)
            return
        results = self.store.promote_results(rec.id, msg.attempt)
        self.store.save(rec)
        log.warning("job %s: %s", rec.id, rec.message)
        self.ctx.spawn(self._announce_finished(rec, attempt=msg.attempt), f"finished {rec.id}")
        self.ctx.spawn(self._stop_current(mine), f"stop {rec.id} attempt {mine.attempt}")
        if results is not None and rec.spec.trainer and rec.plan is not None:
            self.ctx.spawn(self._calibrate(rec, results), f"calibrate {rec.id}")

    async def _stop_current(self, was: JobRecord) -> None:
        """Stop the attempt ``was`` had in flight: through the coordinator, which holds the right to
        order stops.  Should it be unreachable, the attempt's leases are no longer confirmed by this
        node, so its rank hosts' supervisors stop it within ``lease_timeout_s`` anyway."""
        if was.state != "running" and was.phase != "placing":
            return
        coordinator = self.ctx.view().coordinator
        if coordinator is None:
            return
        with contextlib.suppress(FrenzyError):
            await self.ctx.send(coordinator, JobCancel(was.id), SEND_TIMEOUT_S)

    async def on_payload(self, peer: str, msg: PayloadFetch) -> PayloadChunk | Ack:
        rec = self._current(PayloadFetch.KIND, msg.job_id, msg.attempt)
        if rec is None:
            return Ack(False, f"stale attempt {msg.attempt}")
        _check_attempt_host(rec, msg.attempt, peer, f"the {msg.what}")
        length = max(0, min(msg.length, CHUNK))
        if msg.what == "checkpoint":
            data, total, sha = await asyncio.to_thread(self.store.checkpoint_chunk, msg.job_id, msg.offset,
                                                       length)
            return PayloadChunk(data, total, sha)
        data, total = await asyncio.to_thread(self.store.payload, msg.job_id, msg.offset, length)
        return PayloadChunk(data, total)

    async def on_checkpoint(self, peer: str, msg: JobCheckpoint) -> Ack:
        """A rank host's part of the current attempt's newest complete checkpoint, in chunks
        (fenced: only the current attempt's, of a job that is not over).  Once every host of the
        attempt has sent its part, the parts are merged into the job's checkpoint, which the next
        attempt's rank hosts fetch before their ranks start (DESIGN.md §8)."""
        rec = self._current(JobCheckpoint.KIND, msg.job_id, msg.attempt)
        if rec is None or rec.terminal:
            return Ack(False, f"stale attempt {msg.attempt}")
        _check_attempt_host(rec, msg.attempt, peer, "a checkpoint")
        unpack = self._unpack
        if unpack is None:
            return Ack(False, "this node keeps no checkpoints")
        if msg.total > self.max_checkpoint_bytes or msg.offset < 0 or not 1 <= msg.hosts <= 4096:
            raise LaunchError(f"checkpoint part of {msg.total} bytes over {msg.hosts} hosts refused "
                              f"(the cap is {self.max_checkpoint_bytes} bytes)")
        key = (msg.job_id, msg.attempt, peer)
        buf = self._ckpt_buf.setdefault(key, bytearray())
        if msg.offset != len(buf):
            buf.clear()
            if msg.offset != 0:
                raise LaunchError("checkpoint chunks arrived out of order")
        buf.extend(msg.data)
        if len(buf) < msg.total:
            return Ack()
        data = bytes(self._ckpt_buf.pop(key))
        if await bulk.run(lambda: hashlib.sha256(data).hexdigest()) != msg.sha256:
            raise LaunchError("checkpoint part hash mismatch: altered or truncated in transit")

        def merge(parts: list[bytes]) -> tuple[bytes, str]:
            with tempfile.TemporaryDirectory(prefix="frenzy-ckpt-") as tmp:
                for part in parts:
                    unpack(part, hashlib.sha256(part).hexdigest(), Path(tmp) / f"step-{msg.step:08d}",
                                 self.max_checkpoint_bytes)
                return self._pack_dir(Path(tmp), self.max_checkpoint_bytes,
                                      compresslevel=CHECKPOINT_COMPRESSLEVEL)

        try:
            kept = await bulk.run(  # on a node that may run ranks: at a lower priority than theirs
                self.store.keep_checkpoint_part, rec.id, peer, data, attempt=msg.attempt, step=msg.step,
                hosts=msg.hosts, merge=merge)
        except OSError as exc:  # a full disk: the next attempt starts from an older checkpoint
            log.warning("job %s: checkpoint of attempt %d not kept: %s", rec.id, msg.attempt, exc)
            return Ack(False, f"checkpoint not kept: {exc}")
        if kept:
            log.info("job %s: keeps the checkpoint of step %d (attempt %d, %d host(s))", rec.id, msg.step,
                     msg.attempt, msg.hosts)
        return Ack()

    async def _announce_finished(self, rec: JobRecord, attempt: int | None = None) -> None:
        """Tell the peers of the attempt that finished (``rec``'s ranks) that the job is over."""
        for peer in rec.peers():
            with contextlib.suppress(FrenzyError):
                await self.ctx.send(peer, JobFinished(rec.id, attempt or rec.attempt), SEND_TIMEOUT_S)


def _check_attempt_host(rec: JobRecord, attempt: int, peer: str, what: str) -> None:
    """``AuthError`` ``not_attempt_host`` when ``rec`` holds the placement of ``attempt`` and ``peer``
    runs none of its ranks: only the attempt's own hosts send its output and checkpoint and fetch its
    payload.  Before the placement reaches this node (while the attempt is being placed) any member
    may, as for results (``_rank0_host``)."""
    if rec.attempt != attempt or not rec.ranks:
        return
    hosts = {r.peer for r in rec.ranks}
    if peer not in hosts:
        log.warning("job %s: refused %s of attempt %d from node %s, which runs none of its ranks",
                    rec.id, what, attempt, peer[:12])
        raise AuthError("not_attempt_host", f"{what} of job {rec.id} attempt {attempt} from node "
                        f"{peer[:12]}, which runs none of its ranks")


def _rank0_host(rec: JobRecord | None, attempt: int) -> str | None:
    """The node that runs rank 0 of ``attempt`` as ``rec`` places it; None when ``rec`` does not
    hold that attempt's placement."""
    if rec is None or rec.attempt != attempt:
        return None
    return next((r.peer for r in rec.ranks if r.rank == 0), None)
