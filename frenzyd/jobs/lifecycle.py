"""The job lifecycle as a state machine: states, phases, events, who may cause each, fencing (pure).

A job's ``state`` is one of the five of the status JSON (DESIGN.md §6); its ``phase`` says more:

=========  ==========  ====================================================================
state      phase       meaning
=========  ==========  ====================================================================
queued     waiting     no attempt in flight: waiting for GPUs that fit
queued     placing     attempt ``a`` allocated by the submitter; leases and launch in flight
running    running     attempt ``a`` launched on its ranks
terminal   done        succeeded, failed or cancelled: final
=========  ==========  ====================================================================

Every start of a job is an *attempt* whose number only grows (DESIGN.md §8).  The submitter owns
the record and allocates attempt numbers (``BeginAttempt``), so a number is never used twice even
across coordinator changes; everything about an attempt (orders, leases, reports, output,
results, checkpoints) carries ``(job_id, attempt)``, and an event for another attempt than the
record's is refused with ``StaleAttempt`` (the caller counts it).

==============  =====================  ======================  ==================================
event           from                   to                      caused by
==============  =====================  ======================  ==================================
BeginAttempt    queued                 queued/placing, a + 1   submitter, when the coordinator asks
Placed(a)       queued                 running a               coordinator (launch acknowledged);
                                                               the submitter on its report
Wait(reason)    queued/waiting         queued/waiting          coordinator: why it cannot place the
                                                               job now (shown; nothing else changes)
Requeue(a)      queued/placing a,      queued/waiting          submitter or coordinator: placement
                running a                                      failed, ranks lost, peer vacated
Exits(a)        running a              running, succeeded,     the rank hosts' exit reports
                                       failed
LateExits(a')   queued, running a,     unchanged, or           the exit report of an earlier,
                a' < a, or a' = a      succeeded               requeued attempt a' (its host was
                                                               cut off or frozen near the end):
                                                               once every rank of a' is known to
                                                               have exited 0, the job succeeded
                                                               (by a'; a is stopped)
Cancel          queued, running        cancelled               the user (through the submitter)
Fail            queued                 failed                  the submitter (unplaceable) or the
                                                               coordinator (cannot ever fit)
==============  =====================  ======================  ==================================

A ``Requeue`` of a started attempt that says ``lost`` (its ranks vanished with their peer) counts
toward ``MAX_LOST``; past it the
job fails instead.  Terminal states are final: no event changes a terminal record.

``LateExits`` is what keeps "never rerun after success" when the pool could not know: a rank host
cut off near the end of an attempt finishes it, its report waits in the host's outbox, and the
coordinator (rightly, after the lease) starts the next attempt.  When the report arrives, the
success stands and the newer attempt is stopped, instead of running the job a second time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from frenzyd.errors import JobStateError
from frenzyd.jobs.model import PHASES, TERMINAL, JobPlan, JobRecord, JobState, LateAttempt, RankAssignment

__all__ = ["EVENTS", "MAX_LOST", "PHASES", "BeginAttempt", "Cancel", "Event", "Exits", "Fail", "LateExits",
           "Placed", "Requeue", "StaleAttempt", "Wait", "is_late", "run_attempt", "step"]

MAX_LOST: Final = 3
"""Started attempts a job may lose before it is failed: attempts whose ranks vanished with their peer
(no exit report: a crash or a kill that may be the job's own doing).  Attempts a peer stopped and
reported (owner reclaim, daemon shutdown, a lease its host could not renew, a preemption) say
nothing about the job and are requeued with ``lost=False``."""

Actor = Literal["user", "submitter", "coordinator", "rank_host"]


class StaleAttempt(JobStateError):
    """An event for another attempt than the record's current one (refused and counted)."""


@dataclass(frozen=True, slots=True)
class BeginAttempt:
    """Allocate the next attempt number (the submitter, when a coordinator is about to place)."""


@dataclass(frozen=True, slots=True)
class Placed:
    """Attempt ``attempt`` runs on ``ranks`` (placed by the coordinator of ``term``)."""

    attempt: int
    ranks: tuple[RankAssignment, ...]
    term: int
    plan: JobPlan | None = None
    message: str = "placed"


@dataclass(frozen=True, slots=True)
class Requeue:
    """Attempt ``attempt`` will not finish; back to the queue.  ``lost``: it had started and its
    work is lost (counts toward ``MAX_LOST``); a placement that failed before launch is not."""

    attempt: int
    reason: str
    lost: bool = True


@dataclass(frozen=True, slots=True)
class Wait:
    """The job stays queued: ``reason`` says why it cannot be placed now."""

    reason: str


@dataclass(frozen=True, slots=True)
class Exits:
    """Exit codes of some ranks of attempt ``attempt``."""

    attempt: int
    codes: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LateExits:
    """Exit codes of some ranks of ``attempt``, a requeued attempt (before the record's current one,
    or the record's own while it waits: ``is_late``), with that attempt's placement (its report
    carries it): ``ranks`` and ``plan``."""

    attempt: int
    ranks: tuple[RankAssignment, ...]
    codes: Mapping[int, int] = field(default_factory=dict)
    plan: JobPlan | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    message: str = "cancelled by user"


@dataclass(frozen=True, slots=True)
class Fail:
    reason: str


Event = BeginAttempt | Placed | Wait | Requeue | Exits | LateExits | Cancel | Fail

EVENTS: Final[dict[type, tuple[frozenset[JobState], frozenset[Actor]]]] = {
    BeginAttempt: (frozenset({"queued"}), frozenset({"submitter"})),
    Placed: (frozenset({"queued"}), frozenset({"coordinator", "submitter"})),
    Wait: (frozenset({"queued"}), frozenset({"coordinator"})),
    Requeue: (frozenset({"queued", "running"}), frozenset({"submitter", "coordinator"})),
    Exits: (frozenset({"running"}), frozenset({"rank_host"})),
    LateExits: (frozenset({"queued", "running"}), frozenset({"rank_host"})),
    Cancel: (frozenset({"queued", "running"}), frozenset({"user"})),
    Fail: (frozenset({"queued"}), frozenset({"submitter", "coordinator"})),
}
"""Event type -> (states it applies in, who may cause it): the table of the module docstring."""


def step(rec: JobRecord, ev: Event, *, now: float) -> JobRecord:
    """Apply ``ev`` to ``rec``; raise ``JobStateError`` for a move the lifecycle forbids and
    ``StaleAttempt`` for an event about another attempt.

    ``Exits`` on a terminal or not-running record, and a ``Requeue`` of an attempt that is no
    longer current, are ``StaleAttempt`` too: late reports are normal and must not change state.
    """
    if rec.state in TERMINAL:
        if isinstance(ev, Exits | LateExits | Requeue | Placed):
            raise StaleAttempt(f"job {rec.id} is {rec.state}: news of attempt {ev.attempt} changes nothing")
        raise JobStateError(f"job {rec.id} is {rec.state}: it cannot change any more")
    allowed, _ = EVENTS[type(ev)]
    if isinstance(ev, BeginAttempt):
        _require(rec, allowed, ev)
        return replace(rec, attempt=rec.attempt + 1, phase="placing", updated_at=now, plan=None, ranks=(),
                       term=0, exit_codes={}, failed_rank=None, message="placing")
    if isinstance(ev, Placed):
        if ev.attempt < rec.attempt or (ev.attempt == rec.attempt and rec.phase != "placing"):
            raise StaleAttempt(f"job {rec.id}: placement of attempt {ev.attempt}, the job is at attempt "
                               f"{rec.attempt} ({rec.state}/{rec.phase})")
        _require(rec, allowed, ev)
        ranks = tuple(sorted(ev.ranks, key=lambda r: r.rank))
        if not ranks or [r.rank for r in ranks] != list(range(len(ranks))):
            raise JobStateError(f"job {rec.id}: a running job needs ranks 0..N-1")
        return replace(rec, state="running", phase="running", attempt=ev.attempt, updated_at=now,
                       started_at=now, plan=ev.plan, ranks=ranks, term=ev.term, exit_codes={},
                       message=ev.message)
    if isinstance(ev, Wait):
        _require(rec, allowed, ev)
        if rec.phase != "waiting":
            raise StaleAttempt(f"job {rec.id}: a reason to wait while attempt {rec.attempt} is being placed")
        return replace(rec, message=ev.reason, updated_at=now)
    if isinstance(ev, Requeue):
        _current(rec, ev.attempt, "requeue")
        _require(rec, allowed, ev)
        if rec.state == "queued" and rec.phase != "placing":
            raise StaleAttempt(f"job {rec.id}: attempt {ev.attempt} is not in flight")
        lost = rec.lost + (1 if ev.lost and rec.state == "running" else 0)
        if lost >= MAX_LOST:
            return replace(rec, state="failed", phase="done", lost=lost, updated_at=now, finished_at=now,
                           message=f"gave up after losing {lost} attempts: {ev.reason}")
        return replace(rec, state="queued", phase="waiting", lost=lost, updated_at=now, plan=None, ranks=(),
                       term=0, exit_codes={}, failed_rank=None, message=ev.reason)
    if isinstance(ev, Exits):
        _current(rec, ev.attempt, "exit report")
        if rec.state != "running":
            raise StaleAttempt(f"job {rec.id}: exit report for attempt {ev.attempt}, which is not running")
        return _exits(rec, ev.codes, now)
    if isinstance(ev, LateExits):
        return _late_exits(rec, ev, now)
    if isinstance(ev, Cancel):
        _require(rec, allowed, ev)
        return _finish(rec, "cancelled", ev.message, now)
    _require(rec, allowed, ev)
    return _finish(rec, "failed", ev.reason, now)


def _require(rec: JobRecord, allowed: frozenset[JobState], ev: Event) -> None:
    if rec.state not in allowed:
        raise JobStateError(f"job {rec.id}: {type(ev).__name__} is not allowed while {rec.state}")


def _current(rec: JobRecord, attempt: int, what: str) -> None:
    if attempt != rec.attempt:
        raise StaleAttempt(f"job {rec.id}: {what} for attempt {attempt}, the job is at attempt {rec.attempt}")


def _finish(rec: JobRecord, to: JobState, message: str, now: float) -> JobRecord:
    return replace(rec, state=to, phase="done", updated_at=now, finished_at=now,
                   message=message or rec.message)


def _exits(rec: JobRecord, codes: Mapping[int, int], now: float) -> JobRecord:
    """Add rank exit codes; finish the job once every rank has exited (any non-zero: failed).

    ``codes`` come in the order the ranks exited; the first non-zero one to arrive is the job's
    ``failed_rank`` (the others were usually stopped because of it) and the message names it.  A
    rank that exited with a code of its own beats one killed by a signal (negative: the stop of the
    others), whichever report came first.  Codes for ranks outside the attempt are ignored.
    """
    merged = dict(rec.exit_codes)
    failed_rank = rec.failed_rank
    for rank, code in codes.items():
        if 0 <= rank < rec.world_size and rank not in merged:
            merged[rank] = code
            if code != 0 and (failed_rank is None or merged[failed_rank] < 0 < code):
                failed_rank = rank
    rec = replace(rec, exit_codes=merged, failed_rank=failed_rank, updated_at=now)
    if len(merged) < rec.world_size:
        return rec
    if failed_rank is None:
        return _finish(rec, "succeeded", "all ranks exited 0", now)
    return _finish(rec, "failed", f"rank {failed_rank} exited {merged[failed_rank]} first", now)


def is_late(rec: JobRecord, attempt: int) -> bool:
    """Whether an exit report of ``attempt`` is late news: of an attempt before the record's, or of
    the record's own attempt after it was requeued (waiting, no new attempt numbered yet)."""
    if rec.terminal or attempt < 1:
        return False
    waiting = rec.state == "queued" and rec.phase == "waiting"
    return attempt < rec.attempt or (attempt == rec.attempt and waiting)


def _late_exits(rec: JobRecord, ev: LateExits, now: float) -> JobRecord:
    """Record an earlier attempt's exit codes; the job succeeded once all of its ranks exited 0."""
    if not is_late(rec, ev.attempt):
        raise StaleAttempt(f"job {rec.id}: late exit report of attempt {ev.attempt}, the job is at attempt "
                           f"{rec.attempt} ({rec.state}/{rec.phase})")
    world = len(ev.ranks)
    if world == 0 or [r.rank for r in sorted(ev.ranks, key=lambda r: r.rank)] != list(range(world)):
        raise StaleAttempt(f"job {rec.id}: late exit report of attempt {ev.attempt} without its placement")
    known = rec.late.get(ev.attempt, LateAttempt(world))
    merged = dict(known.exit_codes)
    merged.update({r: c for r, c in ev.codes.items() if 0 <= r < world and r not in merged})
    late = LateAttempt(world, merged)
    rec = replace(rec, late={**rec.late, ev.attempt: late}, updated_at=now)
    if not late.succeeded:
        return rec
    rec = replace(rec, plan=ev.plan, ranks=tuple(sorted(ev.ranks, key=lambda r: r.rank)), exit_codes=merged,
                  failed_rank=None)
    return _finish(rec, "succeeded", f"attempt {ev.attempt} succeeded: all ranks exited 0 (its report came "
                   f"after attempt {rec.attempt} had begun, which is stopped)", now)


def run_attempt(rec: JobRecord, ranks: Iterable[RankAssignment], *, now: float, term: int = 1,
                plan: JobPlan | None = None) -> JobRecord:
    """BeginAttempt then Placed: a queued record running its next attempt (tests, tools)."""
    rec = step(rec, BeginAttempt(), now=now)
    return step(rec, Placed(rec.attempt, tuple(ranks), term, plan), now=now)
