"""The job lifecycle state machine (frenzyd.jobs.lifecycle): each event, fencing by attempt, and
property tests over random event orders; record schemas and their migration."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import JobStateError, WireError
from frenzyd.jobs.lifecycle import (
    EVENTS,
    MAX_LOST,
    PHASES,
    BeginAttempt,
    Cancel,
    Event,
    Exits,
    Fail,
    LateExits,
    Placed,
    Requeue,
    StaleAttempt,
    Wait,
    is_late,
    run_attempt,
    step,
)
from frenzyd.jobs.model import RECORD_SCHEMA, TERMINAL, JobRecord, JobSpec, RankAssignment, new_record
from frenzyd.jobs.store import JobStore

SPEC = JobSpec(argv=("train.py",), payload_sha256="ab" * 32, payload_size=10, python_version="3.11.7",
               torch_version="2.13.0", nproc=2, mem_per_rank=1 << 30)
V1 = json.loads((Path(__file__).parent / "data" / "records_v1.json").read_text())
"""Records as main wrote them before attempts (schema 1, no ``schema`` key), made by that code."""


def ranks(n: int) -> tuple[RankAssignment, ...]:
    return tuple(RankAssignment(i, "p", "n", f"G{i}", i, i) for i in range(n))


def fresh() -> JobRecord:
    return new_record("j", SPEC, "sub", "sub", 0.0)


def test_success_path_and_phases() -> None:
    r = fresh()
    assert (r.state, r.phase, r.attempt) == ("queued", "waiting", 0)
    r = step(r, BeginAttempt(), now=1)
    assert (r.state, r.phase, r.attempt) == ("queued", "placing", 1)
    r = step(r, Placed(1, ranks(2), term=3), now=2)
    assert (r.state, r.phase, r.attempt, r.term, r.world_size) == ("running", "running", 1, 3, 2)
    r = step(r, Exits(1, {0: 0}), now=3)
    assert r.state == "running"
    r = step(r, Exits(1, {1: 0, 7: 1}), now=4)  # rank 7 is not part of the attempt: ignored
    assert (r.state, r.phase, r.finished_at) == ("succeeded", "done", 4)
    assert JobRecord.from_dict(r.to_dict()) == r


def test_nonzero_exit_fails_and_names_the_first_failed_rank() -> None:
    r = run_attempt(fresh(), ranks(3), now=1)
    r = step(r, Exits(1, {0: 0, 1: 0, 2: 3}), now=2)
    assert r.state == "failed"
    assert "rank 2 exited 3" in r.message


def test_attempt_numbers_only_grow_and_gaps_are_allowed() -> None:
    r = fresh()
    r = step(r, BeginAttempt(), now=1)
    r = step(r, Requeue(1, "placement failed", lost=False), now=2)  # never launched
    assert (r.state, r.phase, r.attempt, r.lost) == ("queued", "waiting", 1, 0)
    r = step(r, BeginAttempt(), now=3)
    r = step(r, Placed(2, ranks(1), term=1), now=4)
    assert r.attempt == 2


def test_the_coordinators_copy_takes_the_submitters_attempt() -> None:
    """The coordinator's soft record lags (attempt 0); Placed with the allocated attempt moves it."""
    lagging = fresh()
    r = step(lagging, Placed(5, ranks(1), term=2), now=1)
    assert (r.state, r.attempt) == ("running", 5)


@pytest.mark.parametrize("ev", [
    Exits(1, {0: 0}), Requeue(1, "lost"), Placed(1, ranks(1), term=9),
])
def test_stale_attempts_are_refused(ev: Event) -> None:
    r = run_attempt(fresh(), ranks(1), now=1)          # attempt 1
    r = step(r, Requeue(1, "peer lost"), now=2)
    r = run_attempt(r, ranks(1), now=3)               # attempt 2 runs
    with pytest.raises(StaleAttempt):
        step(r, ev, now=4)


def test_news_about_a_finished_job_is_stale_not_an_error() -> None:
    r = step(run_attempt(fresh(), ranks(1), now=1), Exits(1, {0: 0}), now=2)
    with pytest.raises(StaleAttempt):
        step(r, Exits(1, {0: 0}), now=3)
    with pytest.raises(JobStateError):
        step(r, Cancel(), now=3)


def test_lost_attempts_give_up_but_failed_placements_do_not() -> None:
    r = fresh()
    for _ in range(10):  # placements that never launched cost nothing
        r = step(step(r, BeginAttempt(), now=1), Requeue(r.attempt + 1, "refused", lost=False), now=1)
    assert r.state == "queued"
    for i in range(MAX_LOST):
        r = run_attempt(r, ranks(1), now=i)
        r = step(r, Requeue(r.attempt, "peer lost"), now=i)
    assert r.state == "failed"
    assert f"losing {MAX_LOST} attempts" in r.message


def test_running_needs_contiguous_ranks() -> None:
    r = step(fresh(), BeginAttempt(), now=1)
    with pytest.raises(JobStateError):
        step(r, Placed(1, (RankAssignment(1, "p", "n", "g", 0, 0),), term=1), now=2)


def test_the_event_table_names_who_may_cause_each_event() -> None:
    assert set(EVENTS) == {BeginAttempt, Placed, Wait, Requeue, Exits, LateExits, Cancel, Fail}
    assert EVENTS[BeginAttempt][1] == {"submitter"}  # only the record's owner numbers attempts
    assert EVENTS[Cancel][1] == {"user"}


EVENT = st.one_of(
    st.just(BeginAttempt()),
    st.builds(lambda a, n, t: Placed(a, ranks(n), t), st.integers(0, 6), st.integers(1, 3),
              st.integers(1, 4)),
    st.builds(lambda a, lost: Requeue(a, "r", lost), st.integers(0, 6), st.booleans()),
    st.builds(Exits, st.integers(0, 6), st.dictionaries(st.integers(0, 3), st.integers(0, 2), max_size=3)),
    st.builds(lambda a, n, codes: LateExits(a, ranks(n), codes), st.integers(0, 6), st.integers(0, 2),
              st.dictionaries(st.integers(0, 3), st.integers(0, 1), max_size=3)),
    st.just(Cancel()),
    st.just(Fail("no")),
    st.builds(Wait, st.sampled_from(["no GPU fits now", "busy"])),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(EVENT, max_size=30))
def test_random_event_orders_keep_every_invariant(events: list[Event]) -> None:
    r = fresh()
    t = 0.0
    for ev in events:
        t += 1
        before = r
        try:
            r = step(r, ev, now=t)
        except StaleAttempt:
            assert r is before
            continue
        except JobStateError:
            assert before.terminal or before.state not in EVENTS[type(ev)][0]
            continue
        assert not before.terminal, "a terminal record changed"
        assert before.state in EVENTS[type(ev)][0]
        assert r.attempt >= before.attempt, "attempt numbers only grow"
        assert r.phase in PHASES[r.state]
        assert r.lost <= MAX_LOST
        if isinstance(ev, Exits | Requeue):
            assert ev.attempt == before.attempt, "only the current attempt's reports change a record"
        if isinstance(ev, LateExits):
            assert is_late(before, ev.attempt), "a late report is of a requeued attempt"
            assert r.state in {before.state, "succeeded"}
            if r.state == "succeeded":
                assert r.late[ev.attempt].succeeded
        if r.state == "running":
            assert r.ranks
            assert r.attempt >= 1
        if r.state == "queued" and not isinstance(ev, LateExits):
            assert r.ranks == ()
            assert r.plan is None
        if r.terminal:
            assert r.finished_at == t
        assert JobRecord.from_dict(r.to_dict()) == r


def test_a_late_success_of_a_requeued_attempt_stands_and_ends_the_job() -> None:
    """Attempt 1's host was cut off near the end: the job was requeued and attempt 2 started; then
    attempt 1's exit reports arrive.  Once every rank of attempt 1 is known to have exited 0 the
    job succeeded (by attempt 1); a partial or failed late report changes nothing but the record
    of what is known."""
    first = run_attempt(fresh(), ranks(2), now=1)
    r = step(first, Requeue(1, "lost ranks"), now=2)
    r = run_attempt(r, ranks(1), now=3)
    assert (r.state, r.attempt) == ("running", 2)
    r = step(r, LateExits(1, first.ranks, {0: 0}), now=4)
    assert (r.state, r.attempt, r.late[1].exit_codes) == ("running", 2, {0: 0})
    done = step(r, LateExits(1, first.ranks, {1: 0, 5: 1}), now=5)  # rank 5 is not attempt 1's
    assert (done.state, done.attempt) == ("succeeded", 2)
    assert (done.ranks, done.exit_codes) == (first.ranks, {0: 0, 1: 0})
    assert "attempt 1 succeeded" in done.message
    assert JobRecord.from_dict(done.to_dict()) == done
    failed = step(r, LateExits(1, first.ranks, {1: -9}), now=5)  # killed by its lease: not a success
    assert failed.state == "running"
    assert not failed.late[1].succeeded
    with pytest.raises(StaleAttempt):
        step(r, LateExits(2, ranks(1), {0: 0}), now=5)  # the current attempt reports through Exits
    with pytest.raises(StaleAttempt):
        step(done, LateExits(1, first.ranks, {0: 0}), now=6)
    # Requeued and not numbered again yet: the report of its own last attempt is late news too.
    waiting = step(first, Requeue(1, "cut off"), now=2)
    assert is_late(waiting, 1)
    assert not is_late(first, 1)
    back = step(waiting, LateExits(1, first.ranks, {0: 0, 1: 0}), now=3)
    assert (back.state, back.attempt) == ("succeeded", 1)


@pytest.mark.parametrize("name", sorted(V1))
def test_schema_1_records_from_main_are_migrated(name: str) -> None:
    d = V1[name]
    assert "schema" not in d
    rec = JobRecord.from_dict(d)
    assert rec.state == name
    assert rec.phase in PHASES[rec.state]
    assert rec.to_dict()["schema"] == RECORD_SCHEMA
    if name == "running":  # started twice on main: attempt 2, one lost
        assert (rec.attempt, rec.lost, rec.term) == (2, 1, 3)
        nxt = step(rec, Exits(2, {0: 0, 1: 0}), now=1e10)
        assert nxt.state == "succeeded"
    if name == "queued":
        assert (rec.attempt, rec.lost) == (0, 0)
    assert JobRecord.from_dict(rec.to_dict()) == rec


def test_a_newer_schema_is_refused_with_advice() -> None:
    d = fresh().to_dict()
    d["schema"] = RECORD_SCHEMA + 1
    with pytest.raises(WireError, match="upgrade frenzyd"):
        JobRecord.from_dict(d)


def test_store_migrates_old_records_and_quarantines_unreadable_ones(tmp_path: Path) -> None:
    """A data directory written by main before attempts loads; a broken record is moved aside and
    counted, and the other jobs are unaffected."""
    jobs = tmp_path / "jobs"
    for rec in V1.values():
        (jobs / rec["id"]).mkdir(parents=True)
        (jobs / rec["id"] / "record.json").write_text(json.dumps(rec))
    (jobs / "broken").mkdir()
    (jobs / "broken" / "record.json").write_text('{"id": "broken", "state": "runn')
    newer = replace(fresh(), id="from-the-future").to_dict() | {"schema": RECORD_SCHEMA + 1}
    (jobs / "from-the-future").mkdir()
    (jobs / "from-the-future" / "record.json").write_text(json.dumps(newer))
    store = JobStore(tmp_path)
    assert {r.id for r in store.all()} == {rec["id"] for rec in V1.values()}
    assert store.quarantined == 2
    kept = sorted(p.name.split(".")[0] for p in (tmp_path / "quarantine" / "jobs").iterdir())
    assert kept == ["broken", "from-the-future"]
    assert not (jobs / "broken").exists()
    running = store.get(V1["running"]["id"])
    store.save(running)  # written back in the current schema
    assert json.loads((jobs / running.id / "record.json").read_text())["schema"] == RECORD_SCHEMA


def test_terminal_states_accept_nothing() -> None:
    for end in sorted(TERMINAL):
        r = run_attempt(fresh(), ranks(1), now=1)
        r = {"succeeded": lambda x: step(x, Exits(1, {0: 0}), now=2),
             "failed": lambda x: step(x, Exits(1, {0: 1}), now=2),
             "cancelled": lambda x: step(x, Cancel(), now=2)}[end](r)
        assert r.state == end
        for ev in (BeginAttempt(), Cancel(), Fail("x")):
            with pytest.raises(JobStateError):
                step(r, ev, now=3)


def test_wait_only_updates_the_reason_of_a_waiting_job() -> None:
    r = step(fresh(), Wait("no GPU type in this pool fits it now"), now=1)
    assert (r.state, r.phase, r.message) == ("queued", "waiting", "no GPU type in this pool fits it now")
    placing = step(r, BeginAttempt(), now=2)
    with pytest.raises(StaleAttempt):
        step(placing, Wait("late news"), now=3)


def test_the_first_rank_to_fail_is_named_not_the_lowest() -> None:
    """Rank 2 fails first; the others are stopped because of it (SIGTERM: -15) and exit later."""
    r = run_attempt(fresh(), ranks(3), now=1)
    r = step(r, Exits(1, {2: 1}), now=2)
    assert (r.state, r.failed_rank) == ("running", 2)
    r = step(r, Exits(1, {0: -15, 1: -15}), now=3)
    assert (r.state, r.failed_rank) == ("failed", 2)
    assert r.message == "rank 2 exited 1 first"
    assert r.summary()["failed_rank"] == 2


def test_a_rank_that_failed_on_its_own_beats_one_killed_for_it() -> None:
    """The stopped rank's report (-15) may arrive before the failing rank's own (3)."""
    r = run_attempt(fresh(), ranks(2), now=1)
    r = step(r, Exits(1, {0: -15}), now=2)
    r = step(r, Exits(1, {1: 3}), now=3)
    assert (r.state, r.failed_rank, r.message) == ("failed", 1, "rank 1 exited 3 first")
