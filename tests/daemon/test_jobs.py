"""Job specs, records, the coordinator's job table and per-node GPU leases (the lifecycle's events
are tested in test_lifecycle.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import ConfigError, JobStateError, LeaseError, WireError
from frenzyd.jobs.lifecycle import Cancel, run_attempt, step
from frenzyd.jobs.model import (
    JobPlan,
    JobRecord,
    JobSpec,
    JobTable,
    LeaseTable,
    RankAssignment,
    new_record,
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


def test_job_table_queue_order_and_idempotent_submit() -> None:
    t = JobTable()
    a = new_record("a", spec(), "n1", "n1", 2.0)
    b = new_record("b", spec(), "n2", "n2", 1.0)
    t.submit(a)
    t.submit(b)
    assert [r.id for r in t.queued()] == ["b", "a"]
    running = run_attempt(a, ranks(1), now=3, term=1)
    t.update(running)
    assert t.submit(a) is running  # resubmission keeps the table's newer record
    assert [r.id for r in t.running()] == ["a"]
    with pytest.raises(JobStateError):
        t.update(new_record("zz", spec(), "n", "n", 0.0))


def test_job_table_forget_finished_is_bounded() -> None:
    t = JobTable()
    for i in range(10):
        r = t.submit(new_record(f"j{i}", spec(), "n", "n", float(i)))
        t.update(step(r, Cancel(), now=float(i)))
    t.forget_finished(keep=3)
    assert [r.id for r in t.all()] == ["j7", "j8", "j9"]


def test_lease_refuses_busy_unoffered_and_stale() -> None:
    lt = LeaseTable()
    offer = ["g0", "g1", "g2"]
    lt.grant("j1", 1, ["g0", "g1"], term=2, coordinator="c", now=0, offerable=offer)
    with pytest.raises(LeaseError, match="leased to job j1"):
        lt.grant("j2", 1, ["g1"], term=2, coordinator="c", now=0, offerable=offer)
    with pytest.raises(LeaseError, match="not offered"):
        lt.grant("j2", 1, ["g9"], term=2, coordinator="c", now=0, offerable=offer)
    with pytest.raises(LeaseError, match="stale term"):
        lt.grant("j2", 1, ["g2"], term=1, coordinator="old", now=0, offerable=offer)
    # Idempotent re-grant with a newer term.
    assert lt.grant("j1", 1, ["g1", "g0"], term=3, coordinator="c2", now=1, offerable=offer).term == 3
    with pytest.raises(LeaseError, match="stale term"):
        lt.check_order("j1", 1, 2)
    assert lt.check_order("j1", 1, 3).gpus == ("g0", "g1")
    with pytest.raises(LeaseError, match="no lease"):
        lt.check_order("j2", 1, 3)
    with pytest.raises(LeaseError, match="no lease"):
        lt.check_order("j1", 2, 3)  # an order for another attempt finds no lease
    assert lt.release("j1", 1) is not None
    assert lt.holder("g0") is None


def test_leases_are_per_attempt() -> None:
    """A later attempt supersedes an unlaunched lease of an earlier one; a late grant for an older
    attempt is refused; a launched older attempt keeps its GPUs until it is released."""
    lt = LeaseTable()
    offer = ["g0", "g1"]
    lt.grant("j", 1, ["g0"], term=1, coordinator="c", now=0, offerable=offer)
    lt.grant("j", 2, ["g0"], term=1, coordinator="c", now=0, offerable=offer)  # 1 never launched
    assert [(x.attempt, x.gpus) for x in lt.leases()] == [(2, ("g0",))]
    with pytest.raises(LeaseError, match="stale attempt 1"):
        lt.grant("j", 1, ["g1"], term=1, coordinator="c", now=0, offerable=offer)
    lt.mark_launched("j", 2)
    with pytest.raises(LeaseError, match="leased to job j"):
        lt.grant("j", 3, ["g0"], term=1, coordinator="c", now=0, offerable=offer)
    lt.grant("j", 3, ["g1"], term=1, coordinator="c", now=0, offerable=offer)
    assert lt.newest_attempt("j") == 3
    assert lt.release("j", 2) is not None
    assert lt.leased_gpus() == {"g1": "j"}


def test_unlaunched_leases_expire() -> None:
    lt = LeaseTable()
    lt.grant("a", 1, ["g0"], term=1, coordinator="c", now=0, offerable=["g0", "g1"])
    lt.grant("b", 1, ["g1"], term=1, coordinator="c", now=0, offerable=["g0", "g1"])
    lt.mark_launched("b", 1)
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
            st.integers(1, 3),
        ),
        max_size=30,
    )
)
def test_a_gpu_is_never_leased_twice(ops: list[tuple[str, str, set[str], int, int]]) -> None:
    lt = LeaseTable()
    offer = ["g0", "g1", "g2", "g3"]
    for op, job, gpus, term, attempt in ops:
        if op == "grant":
            before, newest = lt.highest_term, lt.newest_attempt(job)
            try:
                lease = lt.grant(job, attempt, gpus, term=term, coordinator="c", now=0, offerable=offer)
            except LeaseError:
                continue
            assert term >= before
            assert attempt >= newest
            assert set(lease.gpus) == gpus
        elif op == "release":
            lt.release(job, attempt)
        else:
            lt.observe_term(term)
        owners: dict[str, str] = {}
        for lease in lt.leases():
            for g in lease.gpus:
                assert g not in owners, f"{g} leased to {owners[g]} and {lease.job_id}"
                owners[g] = lease.job_id
            assert lease.term <= lt.highest_term


@pytest.mark.parametrize("module", ["frenzyd.jobs.model", "frenzyd.jobs.lifecycle", "frenzyd.jobs.status",
                                    "frenzyd.jobs.placement"])
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


def test_status_shows_phase_reason_queue_position_and_members_to_upgrade() -> None:
    from frenzyd.jobs.lifecycle import Wait
    from frenzyd.jobs.status import build_status

    old = step(new_record("old", spec(), "n", "n", 1.0), Wait("no GPU fits now"), now=2.0)
    new = new_record("new", spec(), "n", "n", 5.0)
    running = run_attempt(new_record("run", spec(), "n", "n", 0.5), ranks(1), now=3.0)
    st = build_status(node_id="n", node_name="n", term=1, coordinator=None, peers=[],
                      jobs=[r.summary() for r in (new, running, old)], other_versions={"m" * 64: 1})
    by_id = {j["id"]: j for j in st["jobs"]}
    assert (by_id["old"]["queue_position"], by_id["new"]["queue_position"]) == (1, 2)
    assert by_id["run"]["queue_position"] is None
    assert (by_id["old"]["phase"], by_id["old"]["reason"]) == ("waiting", "no GPU fits now")
    assert (by_id["run"]["phase"], by_id["run"]["attempt"]) == ("running", 1)
    assert {j["state"] for j in st["jobs"]} <= {"queued", "running", "succeeded", "failed", "cancelled"}
    assert st["other_versions"] == [{"id": "m" * 64, "protocol": 1}]
