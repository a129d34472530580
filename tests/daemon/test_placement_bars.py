"""Peers a job must not go to: a peer that runs only its own user's jobs (no slot accounts) and a
peer that refused the job's launch lately.  HAS does not know these bars; the pass must never
place the job there, and must still place it on the GPUs that are left."""

from __future__ import annotations

from dataclasses import replace

from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import OfferedGpu, PeerOffer, QueuedJob, offers_from_reports, schedule

GIB = 1 << 30


def peer(nid: str, gtype: str, gib: int, n: int = 2, only: str | None = None) -> PeerOffer:
    return PeerOffer(nid, nid.upper(), f"{nid}:1", "3.11.9", "2.13.0",
                     tuple(OfferedGpu(f"{nid}-{i}", i, gtype, gib * GIB, gib * GIB, True, True)
                           for i in range(n)),
                     only_jobs_of=only)


def model_job(job_id: str, owner: str | None) -> QueuedJob:
    s = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                torch_version="2.13.0", model="tiny-gpt2", seq_len=128, micro_batch=1, global_batch=4,
                dtype="fp32")
    return QueuedJob(job_id, s, 0.0, owner=owner)


def declared_job(job_id: str, owner: str | None) -> QueuedJob:
    s = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                torch_version="2.13.0", nproc=2, mem_per_rank=8 * GIB)
    return QueuedJob(job_id, s, 0.0, owner=owner)


def peers_of(sched_start: tuple) -> set[str]:
    return {r.peer for _, pl in sched_start for r in pl.ranks}


def test_the_report_says_whose_jobs_a_peer_runs() -> None:
    gpu = {"uuid": "u0", "index": 0, "type": "T4", "memory_bytes": 16 * GIB, "free_bytes": 16 * GIB,
           "offered": True}
    rep = {"python": "3.11.9", "torch": "2.13.0", "gpus": [gpu],
           "launcher": {"runs_as": "own-user", "user": "alice", "only_jobs_of": "alice"}}
    assert offers_from_reports({"a": rep})[0].only_jobs_of == "alice"
    rep["launcher"]["only_jobs_of"] = None
    assert offers_from_reports({"a": rep})[0].only_jobs_of is None
    rep["launcher"] = "garbage"
    assert offers_from_reports({"a": rep})[0].only_jobs_of is None


def test_a_job_of_another_user_never_goes_to_an_own_user_peer_and_is_placed_on_the_rest() -> None:
    # HAS would take the A100 (faster); it runs only alice's jobs, so bob's job gets the T4s.
    offers = [peer("fast", "A100-80GB", 80, only="alice"), peer("slow", "T4", 16)]
    sched = schedule([model_job("m", "bob")], offers, now_s=0.0)
    assert peers_of(sched.start) == {"slow"}
    (_, pl), = sched.start
    assert pl.plan.policy.endswith("(rerouted)")
    alone = schedule([model_job("m", "bob")], offers[:1], now_s=0.0)
    assert not alone.start  # waits: it is not infeasible, alice's peer may get slot accounts
    # alice's job, and a job with no owner (submitted in-process by the daemon's own user), may go there
    for owner in ("alice", None):
        sched = schedule([model_job("m", owner)], offers, now_s=0.0)
        assert peers_of(sched.start) == {"fast"}


def test_a_declared_job_of_another_user_skips_an_own_user_peer() -> None:
    offers = [peer("own", "RTX-3090", 24, only="alice"), peer("any", "RTX-A6000", 48)]
    sched = schedule([declared_job("d", "bob")], offers, now_s=0.0)
    assert peers_of(sched.start) == {"any"}
    sched = schedule([declared_job("d", "alice")], offers, now_s=0.0)
    assert peers_of(sched.start) == {"own"}  # unbarred, HAS's choice stands


def test_a_peer_that_refused_the_job_lately_is_skipped_for_that_job_only() -> None:
    offers = [peer("fast", "A100-80GB", 80), peer("slow", "T4", 16)]
    first = schedule([model_job("m", None)], offers, now_s=0.0)
    assert peers_of(first.start) == {"fast"}
    sched = schedule([model_job("m", None), replace(model_job("n", None))], offers, now_s=0.0,
                     refused={"m": {"fast"}})
    by_job = {j: {r.peer for r in pl.ranks} for j, pl in sched.start}
    assert by_job["m"] == {"slow"}
    assert "fast" in by_job.get("n", set())  # another job may still go there
    # every GPU of the pool is barred to it: it waits
    sched = schedule([model_job("m", None)], offers, now_s=0.0, refused={"m": {"fast", "slow"}})
    assert not sched.start
    assert not sched.infeasible
