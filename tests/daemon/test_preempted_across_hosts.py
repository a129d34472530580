"""A preempted attempt whose ranks span two hosts: once one host has reported its ranks stopped as
ordered, the other host dropping the attempt's lease before its own report arrives is the same
ordered stop, not a lost attempt (three of those failed a job in bench_live)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frenzyd.jobs.context import ClusterView, RoleContext, Versions
from frenzyd.jobs.lifecycle import run_attempt
from frenzyd.jobs.messages import JobExit
from frenzyd.jobs.model import JobPlan, JobSpec, RankAssignment, new_record
from frenzyd.jobs.store import JobStore
from frenzyd.jobs.submitter import SubmitterRole
from frenzyd.node.launcher import pack_dir

SPEC = JobSpec(argv=("ddp.py",), payload_sha256="cd" * 32, payload_size=10, python_version="3.11.7",
               torch_version="2.13.0", nproc=2, mem_per_rank=1 << 30)
PLAN = JobPlan(gpu_type="T4", gpus=2, dp=2, tp=1, pp=1, zero=0, micro_batch=1, grad_accum=1,
               bytes_per_gpu=1 << 30, gpu_memory_bytes=16 << 30, source="declared", policy="frenzy", peers=2,
               backend="gloo")
A, B = "a" * 32, "b" * 32


def submitter(tmp_path: Path, clock: list[float]) -> SubmitterRole:
    async def no_send(node: str, msg: Any, limit_s: float) -> dict[str, Any]:
        raise AssertionError("nothing is sent here")

    ctx = RoleContext(node_id="s" * 32, node_name="s", send=no_send, send_order=no_send,
                      view=lambda: ClusterView(None, 0, {}), spawn=lambda coro, name: coro.close(),
                      wake=lambda: None, clock=lambda: clock[0])
    sub = SubmitterRole(ctx, JobStore(tmp_path / "data"), pack_dir=pack_dir,
                        versions=Versions("3.11.7", "2.13.0"), max_payload_bytes=1 << 20,
                        max_result_bytes=1 << 20)
    ranks = (RankAssignment(0, A, "a", "GPU-0", 0, 0), RankAssignment(1, B, "b", "GPU-0", 1, 0))
    rec = run_attempt(new_record("j", SPEC, "s" * 32, "s", 0.0), ranks, now=1.0, term=1, plan=PLAN)
    sub.store.create(rec, b"payload")
    return sub


async def run_case(tmp_path: Path, preempted: bool) -> tuple[str, int, str]:
    clock = [1000.0]  # long after the daemon's start and the attempt's: no start-up grace
    sub = submitter(tmp_path, clock)
    sub._born = 0.0
    if preempted:
        sub.on_exit(A, JobExit("j", 1, 1, ((0, 143),), A, vacated=True, reason="making room", preempted=True))
        assert sub.store.get("j").state == "running"  # B's report is still to come
    # Both peers live; neither lists the attempt (B's heartbeat dropped the lease before its report).
    await sub.tick(ClusterView(None, 1, {A: {"jobs": []}, B: {"jobs": []}}))
    rec = sub.store.get("j")
    return rec.state, rec.lost, rec.message


async def test_a_peer_gone_quiet_while_the_attempt_is_preempted_is_not_a_lost_attempt(tmp_path: Path) -> None:
    state, lost, message = await run_case(tmp_path / "p", preempted=True)
    assert (state, lost) == ("queued", 0), message
    assert "preempted" in message


async def test_without_a_preemption_the_same_silence_is_a_lost_attempt(tmp_path: Path) -> None:
    state, lost, message = await run_case(tmp_path / "l", preempted=False)
    assert (state, lost) == ("queued", 1), message
    assert "lost ranks" in message
