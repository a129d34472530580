"""The job messages between daemons, one frozen dataclass per wire kind, and their typed replies (pure).

Each class registers its kind with the wire layer (``frenzyd.net.wire.message``), so a frame is
decoded, schema-checked and turned into its class once, at the edge; the roles' handlers get
these values.  ``to_body`` writes keys in the order the daemons have always sent them (the
golden-frame test pins the bytes).  Replies travel as ``ok`` frames; a sender reads the reply
body it expects with the reply class's ``from_body``.

Every kind has a frame cap that fits its largest legitimate body (``wire.kind_cap``), checked before
the body is unpacked, and every ``job_id`` is checked (``valid_job_id``) when the frame is decoded:
a malformed id is dropped at the edge with reason ``schema``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Self

from frenzyd.errors import WireError
from frenzyd.jobs.model import JobRecord, valid_job_id
from frenzyd.net.election import MAX_TERM
from frenzyd.net.wire import KINDS, SIGNED_KIND, Body, Schema, message, register_kind

SIGNED_KINDS: Final = frozenset({"job.launch", "job.stop"})
"""Orders that start or stop processes: sent signed and bound to the coordinator's term."""

CHUNK_BYTES: Final = 1 << 20
"""Payload and result bytes per message (``frenzyd.jobs.context.CHUNK``; a test keeps them equal)."""
FRAME_OVERHEAD: Final = 64 * 1024
"""Room for keys, ids and an envelope's certificate and signature around a chunk or record."""
CHUNK_FRAME_MAX: Final = CHUNK_BYTES + FRAME_OVERHEAD
"""Cap on a frame that carries one payload or result chunk."""
RECORD_FRAME_MAX: Final = 2 * 1024 * 1024
"""Cap on a frame that carries a job record (its command may hold up to 256 arguments of 4 KiB)."""
OUTPUT_FRAME_MAX: Final = 256 * 1024
"""Cap on a batch of rank output (the rank host sends under 128 KiB of output per batch)."""
SMALL_FRAME_MAX: Final = 64 * 1024
"""Cap on a frame of ids and numbers."""

# Replies travel as ``ok``: a payload chunk is the largest.  Signed orders carry a record.
register_kind("ok", KINDS["ok"], max_bytes=CHUNK_FRAME_MAX)
register_kind(SIGNED_KIND, KINDS[SIGNED_KIND], max_bytes=RECORD_FRAME_MAX + FRAME_OVERHEAD)


def _job_id(body: Mapping[str, Any]) -> str:
    """The body's ``job_id``, checked: safe as a file name (``valid_job_id``)."""
    job_id: str = body["job_id"]
    if not valid_job_id(job_id):
        raise WireError(f"bad job id {job_id[:80]!r}")
    return job_id


def _term(body: Mapping[str, Any]) -> int:
    """The body's ``term``, checked: 0..``MAX_TERM`` (2**53 - 1), the bound heartbeats and signed
    orders already have.  A lease granted at term 2**64 - 1 broke the node's own heartbeat report
    (its lease list failed the report check) until the lease expired."""
    term: int = body["term"]
    if not 0 <= term <= MAX_TERM:
        raise WireError(f"term {term} out of range 0..{MAX_TERM}")
    return term


def _attempt(body: Mapping[str, Any]) -> int:
    """The body's ``attempt``, checked: never negative."""
    attempt: int = body["attempt"]
    if attempt < 0:
        raise WireError(f"bad attempt {attempt}")
    return attempt


@message("job.submit", Schema(required={"record": dict}), max_bytes=RECORD_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobSubmit(Body):
    """Submitter -> coordinator: a job to schedule (idempotent; re-sent until acknowledged)."""

    record: JobRecord

    def to_body(self) -> dict[str, Any]:
        return {"record": self.record.to_dict()}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(JobRecord.from_dict(body["record"]))


@message("job.cancel", Schema(required={"job_id": str}, optional={"requeue_attempts": int}))
@dataclass(frozen=True, slots=True)
class JobCancel(Body):
    """Submitter -> coordinator: the user cancelled the job."""

    job_id: str

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body))


@message("job.state", Schema(required={"record": dict}), max_bytes=RECORD_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobState(Body):
    """Coordinator -> submitter: the job's new state (placed, failed, requeued)."""

    record: JobRecord

    def to_body(self) -> dict[str, Any]:
        return {"record": self.record.to_dict()}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(JobRecord.from_dict(body["record"]))


@message("job.attempt", Schema(required={"job_id": str, "term": int, "after": int}))
@dataclass(frozen=True, slots=True)
class JobAttempt(Body):
    """Coordinator -> submitter: about to place the job; allocate its next attempt number.

    ``after`` is the attempt the coordinator knows; the submitter answers with ``AttemptAck``
    (its record's attempt + 1, persisted before the reply) or refuses (job over, or running).
    """

    job_id: str
    term: int
    after: int

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "term": self.term, "after": self.after}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _term(body), body["after"])


@message("lease.request", Schema(required={"job_id": str, "attempt": int, "gpus": list, "term": int}),
         max_bytes=2 * SMALL_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class LeaseRequest(Body):
    """Coordinator -> GPU owner: lease these GPUs to the job's attempt (the owner may refuse)."""

    job_id: str
    attempt: int
    gpus: tuple[str, ...]
    term: int

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "gpus": list(self.gpus), "term": self.term}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _attempt(body), tuple(g for g in body["gpus"] if isinstance(g, str)),
                   _term(body))


@message("lease.release", Schema(required={"job_id": str, "attempt": int, "term": int}))
@dataclass(frozen=True, slots=True)
class LeaseRelease(Body):
    """Coordinator -> GPU owner: drop an attempt's lease whose launch will not come."""

    job_id: str
    attempt: int
    term: int

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "term": self.term}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _attempt(body), _term(body))


@message("job.launch", Schema(required={"job_id": str, "attempt": int, "term": int, "record": dict,
                                        "master_addr": str, "master_port": int, "start_store": bool,
                                        "backend": str}), max_bytes=RECORD_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobLaunch(Body):
    """Coordinator -> GPU owner (signed): start this node's ranks of the placed record.

    Rank 0's peer gets it first with ``start_store`` and answers with the store's port; the
    others get the port and ``start_store=False``.
    """

    job_id: str
    attempt: int
    term: int
    record: JobRecord
    master_addr: str
    master_port: int
    start_store: bool
    backend: str

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "term": self.term,
                "record": self.record.to_dict(), "master_addr": self.master_addr,
                "master_port": self.master_port, "start_store": self.start_store, "backend": self.backend}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        record = JobRecord.from_dict(body["record"])
        if record.id != _job_id(body) or record.attempt != _attempt(body):
            raise WireError("job.launch: the record is not the ordered job's attempt")
        return cls(_job_id(body), _attempt(body), _term(body), record, body["master_addr"],
                   body["master_port"], body["start_store"], body["backend"])


@message("job.stop", Schema(required={"job_id": str, "attempt": int, "term": int}, optional={"preempt": str}))
@dataclass(frozen=True, slots=True)
class JobStop(Body):
    """Coordinator -> GPU owner (signed): stop the ranks of the job's attempt here.

    ``preempt`` (non-empty: why) makes it a preemption by the scheduler: the ranks get SIGTERM and
    their grace to checkpoint, and the exit is reported as vacated and ``preempted``, so the job
    is requeued (not failed) and the stop does not count as a lost attempt."""

    job_id: str
    attempt: int
    term: int
    preempt: str = ""

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": self.job_id, "attempt": self.attempt, "term": self.term}
        if self.preempt:
            body["preempt"] = self.preempt
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _attempt(body), _term(body), str(body.get("preempt", "")))


@message("payload.fetch", Schema(required={"job_id": str, "attempt": int, "offset": int, "length": int},
                                 optional={"what": str}))
@dataclass(frozen=True, slots=True)
class PayloadFetch(Body):
    """GPU owner -> submitter: the next chunk of the job's packed directory (``what`` = ``payload``)
    or of its latest complete checkpoint (``checkpoint``; total 0 when it has none), for an attempt."""

    job_id: str
    attempt: int
    offset: int
    length: int
    what: str = "payload"

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": self.job_id, "attempt": self.attempt, "offset": self.offset,
                                "length": self.length}
        if self.what != "payload":
            body["what"] = self.what
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        what = str(body.get("what", "payload"))
        if what not in ("payload", "checkpoint"):
            raise WireError(f"payload.fetch: unknown what {what!r}")
        return cls(_job_id(body), _attempt(body), body["offset"], body["length"], what)


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Bytes one rank wrote to one stream (rank -1, stream ``frenzy``: the daemon's own note)."""

    rank: int
    stream: str
    data: bytes


@message("job.output", Schema(required={"job_id": str, "attempt": int, "chunks": list}),
         max_bytes=OUTPUT_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobOutput(Body):
    """GPU owner -> submitter: a batch of an attempt's rank output, in order.  Malformed chunks
    are dropped."""

    job_id: str
    attempt: int
    chunks: tuple[OutputChunk, ...]

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt,
                "chunks": [[c.rank, c.stream, c.data] for c in self.chunks]}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        chunks = tuple(
            OutputChunk(ch[0], ch[1][:16], ch[2]) for ch in body["chunks"]
            if isinstance(ch, list) and len(ch) == 3 and type(ch[0]) is int
            and isinstance(ch[1], str) and isinstance(ch[2], bytes)
        )
        return cls(_job_id(body), _attempt(body), chunks)


@message("job.results", Schema(required={"job_id": str, "attempt": int, "offset": int, "total": int,
                                         "data": bytes}), max_bytes=CHUNK_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobResults(Body):
    """Rank 0's host -> submitter: one chunk of the files rank 0 of an attempt wrote under its
    output directory."""

    job_id: str
    attempt: int
    offset: int
    total: int
    data: bytes

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "offset": self.offset, "total": self.total,
                "data": self.data}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _attempt(body), body["offset"], body["total"], body["data"])


@message("job.checkpoint", Schema(required={"job_id": str, "attempt": int, "step": int, "hosts": int,
                                            "offset": int, "total": int, "sha256": str, "data": bytes}),
         max_bytes=CHUNK_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobCheckpoint(Body):
    """A rank host -> submitter: one chunk of this host's part (its ranks' shards) of the attempt's
    newest complete checkpoint ``step``; the checkpoint is whole once the ``hosts`` hosts of the
    attempt have each sent theirs.  ``sha256`` is of the whole part."""

    job_id: str
    attempt: int
    step: int
    hosts: int
    offset: int
    total: int
    sha256: str
    data: bytes

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "step": self.step, "hosts": self.hosts,
                "offset": self.offset, "total": self.total, "sha256": self.sha256, "data": self.data}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _attempt(body), body["step"], body["hosts"], body["offset"], body["total"],
                   body["sha256"], body["data"])


@message("job.exit", Schema(required={"job_id": str, "attempt": int, "term": int, "codes": list, "peer": str},
                            optional={"record": dict, "vacated": bool, "reason": str, "preempted": bool}),
         max_bytes=RECORD_FRAME_MAX)
@dataclass(frozen=True, slots=True)
class JobExit(Body):
    """GPU owner -> submitter and coordinator: this node's ranks of the job exited.

    ``codes`` are (rank, exit code) pairs (malformed pairs are dropped); ``vacated`` means the node
    stopped them itself (owner reclaim, shutdown) and the job should be requeued, not failed.
    """

    job_id: str
    attempt: int
    term: int
    codes: tuple[tuple[int, int], ...]
    peer: str
    record: JobRecord | None = None
    vacated: bool = False
    reason: str = ""
    preempted: bool = False
    """Vacated because the scheduler preempted the attempt (``JobStop.preempt``): not a lost attempt."""

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"job_id": self.job_id, "attempt": self.attempt, "term": self.term,
                                "codes": [[r, c] for r, c in self.codes], "peer": self.peer}
        if self.record is not None:
            body["record"] = self.record.to_dict()
        body.update(vacated=self.vacated, reason=self.reason)
        if self.preempted:
            body["preempted"] = True
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        codes = tuple((c[0], c[1]) for c in body["codes"]
                      if isinstance(c, list) and len(c) == 2
                      and all(isinstance(x, int) and not isinstance(x, bool) for x in c))
        record = None if body.get("record") is None else JobRecord.from_dict(body["record"])
        return cls(_job_id(body), _attempt(body), _term(body), codes, body["peer"], record,
                   bool(body.get("vacated", False)), str(body.get("reason", "")),
                   bool(body.get("preempted", False)))

    @property
    def exit_codes(self) -> dict[int, int]:
        return dict(self.codes)


@message("job.finished", Schema(required={"job_id": str, "attempt": int}))
@dataclass(frozen=True, slots=True)
class JobFinished(Body):
    """Submitter -> the attempt's peers: the job is over (rank 0's host closes the attempt's
    rendezvous store)."""

    job_id: str
    attempt: int

    def to_body(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_job_id(body), _attempt(body))


# --- replies (sent as ``ok`` frames) ---------------------------------------------------------


class Reply(ABC):
    """A handler's answer; ``to_body`` is the ``ok`` frame's body."""

    @abstractmethod
    def to_body(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Ack(Reply):
    """Done (``ok``), or refused with a reason the sender logs."""

    ok: bool = True
    reason: str = ""

    def to_body(self) -> dict[str, Any]:
        return {"ok": True} if self.ok else {"ok": False, "reason": self.reason}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(bool(body.get("ok")), str(body.get("reason", "?")))


@dataclass(frozen=True, slots=True)
class StateAck(Reply):
    """Done; the job's state as the receiver now holds it."""

    state: str

    def to_body(self) -> dict[str, Any]:
        return {"ok": True, "state": self.state}

    @classmethod
    def state_of(cls, body: Mapping[str, Any]) -> str | None:
        state = body.get("state")
        return state if isinstance(state, str) else None


@dataclass(frozen=True, slots=True)
class AttemptAck(Reply):
    """The submitter allocated (and persisted) this attempt number for the placement; attempt 0
    means it did not, and ``state`` says why (the job is running or over)."""

    attempt: int
    state: str

    def to_body(self) -> dict[str, Any]:
        return {"ok": True, "attempt": self.attempt, "state": self.state}

    @classmethod
    def attempt_of(cls, body: Mapping[str, Any]) -> int:
        attempt = body.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
            raise WireError("attempt reply carries no attempt number")
        return attempt


@dataclass(frozen=True, slots=True)
class LaunchAck(Reply):
    """The ranks run (or are starting); rank 0's host says the rendezvous store's port."""

    master_port: int

    def to_body(self) -> dict[str, Any]:
        return {"ok": True, "master_port": self.master_port}

    @classmethod
    def port_of(cls, body: Mapping[str, Any]) -> int:
        port = body.get("master_port")
        if not isinstance(port, int) or isinstance(port, bool):
            raise WireError("launch reply carries no integer master_port")
        return port


@dataclass(frozen=True, slots=True)
class PayloadChunk(Reply):
    """A chunk of the packed job directory (or checkpoint), its total size and, for a checkpoint,
    the sha256 of the whole archive."""

    data: bytes
    total: int
    sha256: str = ""

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": True, "data": self.data, "total": self.total}
        if self.sha256:
            body["sha256"] = self.sha256
        return body
