"""Job specs, the lifecycle state machine, the coordinator's job table and per-node GPU leases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import ConfigError, JobStateError, LeaseError, WireError
from frenzyd.jobs.model import (
    JOB_STATES,
    MAX_ATTEMPTS,
    TERMINAL,
    JobPlan,
    JobRecord,
    JobSpec,
    JobTable,
    LeaseTable,
    RankAssignment,
    new_record,
    record_exits,
    transition,
)

SHA = "ab" * 32


PLAN2 = JobPlan("T4", gpus=2, dp=2, tp=1, pp=1, zero=0, bytes_per_gpu=1)

def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {
        "argv": ("train.py", "--lr", "1e-3"), "payload_sha256": SHA, "payload_size": 10,
        "python_version": "3.11.7", "torch_version": "2.13.0", "nproc": 2, "mem_per_rank": 1 << 30,
    }
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def ranks(n: int, peer: str = "p1") -> list[RankAssignment]:
    return [RankAssignment(i, peer, "n", f"G{i}", i, i) for i in range(n)]


def test_spec_roundtrips_and_validates() -> None:
    s = spec().validate()
    assert JobSpec.from_dict(s.to_dict()) == s
    m = spec(nproc=None, mem_per_rank=None, model="gpt2", seq_len=128, micro_batch=2, global_batch=8)
    assert JobSpec.from_dict(m.to_dict()) == m.validate()
    w = spec(steps=500)
    assert JobSpec.from_dict(w.to_dict()) == w.validate()
    old = spec().to_dict()
    del old["steps"]  # a record written before --steps existed
    assert JobSpec.from_dict(old).steps is None


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"argv": ()}, "after '--'"),
        ({"nproc": None}, "--nproc"),
        ({"mem_per_rank": None}, "--mem-per-rank"),
        ({"nproc": 0}, "--nproc"),
        ({"mem_per_rank": -1}, "--mem-per-rank"),
        ({"payload_sha256": "xyz"}, "sha256"),
        ({"model": "gpt2", "nproc": None, "mem_per_rank": None}, "--seq-len"),
        ({"model": "gpt2", "seq_len": 8, "micro_batch": 3, "global_batch": 8}, "multiple"),
        ({"zero": 5}, "--zero"),
        ({"steps": 0}, "--steps"),
    ],
)
def test_bad_spec_says_what_to_fix(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        spec(**kw).validate()


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("argv"),
        lambda d: d.update(argv="train.py"),
        lambda d: d.update(payload_size="10"),
        lambda d: d.update(nproc=True),
        lambda d: d.update(model_config=[1, 2]),
        lambda d: d.update(nproc=None),
        lambda d: d.update(steps="100"),
        lambda d: d.update(steps=-5),
    ],
)
def test_untrusted_spec_raises_wire_error(mutate: object) -> None:
    d = spec().to_dict()
    mutate(d)  # type: ignore[operator]
    with pytest.raises(WireError):
        JobSpec.from_dict(d)


def test_record_lifecycle_success() -> None:
    r = new_record("ws1-1", spec(), "node-a", "a", now=1.0)
    assert r.state == "queued"
    r = transition(r, "running", now=2.0, plan=PLAN2, ranks=ranks(2), term=3)
    assert (r.state, r.attempts, r.term, r.world_size) == ("running", 1, 3, 2)
    r = record_exits(r, {0: 0}, now=3.0)
    assert r.state == "running"
    r = record_exits(r, {1: 0, 7: 1}, now=4.0)  # rank 7 is not part of the job: ignored
    assert r.state == "succeeded"
    assert r.finished_at == 4.0
    assert JobRecord.from_dict(r.to_dict()) == r


def test_nonzero_exit_fails_and_names_rank() -> None:
    r = transition(new_record("j", spec(), "a", "a", 0.0), "running", now=1, ranks=ranks(3), term=1)
    r = record_exits(r, {0: 0, 1: 0, 2: 3}, now=2.0)
    assert r.state == "failed"
    assert "rank 2 exited 3" in r.message


def test_requeue_then_give_up() -> None:
    r = new_record("j", spec(), "a", "a", 0.0)
    for i in range(MAX_ATTEMPTS):
        r = transition(r, "running", now=i, ranks=ranks(1), term=i + 1)
        r = transition(r, "queued", now=i + 0.5, message="peer lost")
    assert r.state == "failed"
    assert "gave up" in r.message


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_are_final(state: str) -> None:
    r = new_record("j", spec(), "a", "a", 0.0)
    if state != "cancelled":
        r = transition(r, "running", now=1, ranks=ranks(1), term=1)
    r = transition(r, state, now=2)  # type: ignore[arg-type]
    for to in JOB_STATES:
        with pytest.raises(JobStateError):
            transition(r, to, now=3, ranks=ranks(1))


def test_running_needs_contiguous_ranks() -> None:
    r = new_record("j", spec(), "a", "a", 0.0)
    with pytest.raises(JobStateError):
        transition(r, "running", now=1, ranks=[RankAssignment(1, "p", "n", "g", 0, 0)])


def test_bad_job_id() -> None:
    with pytest.raises(ConfigError):
        new_record("../etc", spec(), "a", "a", 0.0)


def test_record_from_untrusted_dict() -> None:
    d = new_record("j", spec(), "a", "a", 0.0).to_dict()
    d["state"] = "exploded"
    with pytest.raises(WireError):
        JobRecord.from_dict(d)
    with pytest.raises(WireError):
        JobRecord.from_dict({"id": "j"})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(JOB_STATES), st.integers(1, 4)), max_size=20))
def test_random_event_sequences_keep_the_lifecycle(events: list[tuple[str, int]]) -> None:
    r = new_record("j", spec(), "a", "a", 0.0)
    t = 0.0
    for to, n in events:
        t += 1
        before = r
        try:
            r = transition(r, to, now=t, ranks=ranks(n), term=n)  # type: ignore[arg-type]
        except JobStateError:
            assert before.terminal or to == before.state or (before.state == "queued" and to in
                                                           ("queued", "succeeded"))
            continue
        assert not before.terminal
        assert r.attempts <= MAX_ATTEMPTS
        if r.state == "running":
            assert r.ranks
            assert r.term == n
        if r.state == "queued":
            assert r.ranks == ()
            assert r.plan is None
        if r.terminal:
            assert r.finished_at == t


def test_job_table_queue_order_and_idempotent_submit() -> None:
    t = JobTable()
    a = new_record("a", spec(), "n1", "n1", 2.0)
    b = new_record("b", spec(), "n2", "n2", 1.0)
    t.submit(a)
    t.submit(b)
    assert [r.id for r in t.queued()] == ["b", "a"]
    running = transition(a, "running", now=3, ranks=ranks(1), term=1)
    t.update(running)
    assert t.submit(a) is running  # resubmission keeps the table's newer record
    assert [r.id for r in t.running()] == ["a"]
    with pytest.raises(JobStateError):
        t.update(new_record("zz", spec(), "n", "n", 0.0))


def test_job_table_forget_finished_is_bounded() -> None:
    t = JobTable()
    for i in range(10):
        r = t.submit(new_record(f"j{i}", spec(), "n", "n", float(i)))
        t.update(transition(r, "cancelled", now=float(i)))
    t.forget_finished(keep=3)
    assert [r.id for r in t.all()] == ["j7", "j8", "j9"]


def test_lease_refuses_busy_unoffered_and_stale() -> None:
    lt = LeaseTable()
    offer = ["g0", "g1", "g2"]
    lt.grant("j1", ["g0", "g1"], term=2, coordinator="c", now=0, offerable=offer)
    with pytest.raises(LeaseError, match="leased to job j1"):
        lt.grant("j2", ["g1"], term=2, coordinator="c", now=0, offerable=offer)
    with pytest.raises(LeaseError, match="not offered"):
        lt.grant("j2", ["g9"], term=2, coordinator="c", now=0, offerable=offer)
    with pytest.raises(LeaseError, match="stale term"):
        lt.grant("j2", ["g2"], term=1, coordinator="old", now=0, offerable=offer)
    # Idempotent re-grant with a newer term.
    assert lt.grant("j1", ["g1", "g0"], term=3, coordinator="c2", now=1, offerable=offer).term == 3
    with pytest.raises(LeaseError, match="stale term"):
        lt.check_order("j1", 2)
    assert lt.check_order("j1", 3).gpus == ("g0", "g1")
    with pytest.raises(LeaseError, match="no lease"):
        lt.check_order("j2", 3)
    assert lt.release("j1") is not None
    assert lt.holder("g0") is None


def test_unlaunched_leases_expire() -> None:
    lt = LeaseTable()
    lt.grant("a", ["g0"], term=1, coordinator="c", now=0, offerable=["g0", "g1"])
    lt.grant("b", ["g1"], term=1, coordinator="c", now=0, offerable=["g0", "g1"])
    lt.mark_launched("b")
    assert [x.job_id for x in lt.expire_unlaunched(now=100, ttl_s=10)] == ["a"]
    assert [x.job_id for x in lt.leases()] == ["b"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["grant", "release", "term"]),
            st.sampled_from(["j1", "j2", "j3"]),
            st.sets(st.sampled_from(["g0", "g1", "g2", "g3"]), min_size=1, max_size=3),
            st.integers(0, 5),
        ),
        max_size=30,
    )
)
def test_a_gpu_is_never_leased_twice(ops: list[tuple[str, str, set[str], int]]) -> None:
    lt = LeaseTable()
    offer = ["g0", "g1", "g2", "g3"]
    for op, job, gpus, term in ops:
        if op == "grant":
            before = lt.highest_term
            try:
                lease = lt.grant(job, gpus, term=term, coordinator="c", now=0, offerable=offer)
            except LeaseError:
                continue
            assert term >= before
            assert set(lease.gpus) == gpus
        elif op == "release":
            lt.release(job)
        else:
            lt.observe_term(term)
        owners: dict[str, str] = {}
        for lease in lt.leases():
            for g in lease.gpus:
                assert g not in owners, f"{g} leased to {owners[g]} and {lease.job_id}"
                owners[g] = lease.job_id
            assert lease.term <= lt.highest_term


@pytest.mark.parametrize("module", ["frenzyd.jobs.model", "frenzyd.jobs.status", "frenzyd.jobs.placement"])
def test_orchestration_core_is_pure(module: str) -> None:
    """jobs/state/placement are part of the pure core (DESIGN.md §2): no sockets, asyncio, torch..."""
    import subprocess
    import sys

    forbidden = ["socket", "asyncio", "torch", "zeroconf", "aiohttp", "threading", "pynvml", "transformers"]
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "from frenzyd.jobs.placement import schedule; schedule([], [], now_s=0.0); "
        f"bad = [m for m in {forbidden!r} if m in sys.modules]; print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
