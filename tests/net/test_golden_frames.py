"""Golden frames: the exact bytes of every wire message kind.

Protocol 1 was pinned from the dict-based senders at commit fb519af; protocol 2 (attempts: every job
order, lease, report, output and result carries ``(job_id, attempt)``; ``job.attempt``; records with a
``schema``) was pinned when it was introduced.  A change here is a wire-protocol change: it needs a
new protocol version and a note in the README's "Upgrading".  Regenerate with
``python tests/net/test_golden_frames.py`` only together with such a bump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzyd.jobs.lifecycle import Exits, run_attempt, step
from frenzyd.jobs.messages import (
    Ack,
    AttemptAck,
    JobAttempt,
    JobCancel,
    JobCheckpoint,
    JobExit,
    JobFinished,
    JobLaunch,
    JobOutput,
    JobResults,
    JobState,
    JobStop,
    JobSubmit,
    LaunchAck,
    LeaseRelease,
    LeaseRequest,
    OutputChunk,
    PayloadChunk,
    PayloadFetch,
    StateAck,
)
from frenzyd.jobs.model import JobPlan, JobSpec, RankAssignment, new_record
from frenzyd.net import messages as swim
from frenzyd.net import wire
from frenzyd.net.messages import Heartbeat, HeartbeatReport, Revocations

SPEC = JobSpec(argv=("train.py", "--lr", "3e-4"), payload_sha256="ab" * 32, payload_size=1234,
               python_version="3.11.7", torch_version="2.13.0", name="golden", model="gpt2",
               seq_len=128, micro_batch=2, global_batch=8, dtype="bf16-mixed", steps=50)
DECL = JobSpec(argv=("ddp.py",), payload_sha256="cd" * 32, payload_size=10, python_version="3.11.7",
               torch_version="2.13.0", nproc=2, mem_per_rank=1 << 30)
RANKS = (RankAssignment(0, "n" * 64, "ws-01", "GPU-0", 0, 0),
         RankAssignment(1, "m" * 64, "ws-02", "GPU-1", 1, 0))
MARP_PLAN = JobPlan(gpu_type="A100-80GB", gpus=2, dp=2, tp=1, pp=1, zero=0, micro_batch=2, grad_accum=2,
                    bytes_per_gpu=5 << 30, gpu_memory_bytes=80 << 30, step_time_s=0.25, source="marp",
                    policy="frenzy", peers=2, backend="gloo")
DECL_PLAN = JobPlan(gpu_type="RTX-3090", gpus=2, dp=2, tp=1, pp=1, zero=0, micro_batch=1, grad_accum=1,
                    bytes_per_gpu=1 << 30, gpu_memory_bytes=24 << 30, source="declared", policy="frenzy",
                    peers=2, backend="nccl")


def frames() -> dict[str, bytes]:
    """One representative frame per kind (and per sender variant), built as the daemons build them."""
    q = new_record("ws-01-20261201-143000-ab12", SPEC, "n" * 64, "ws-01", 1_700_000_000.5)
    run = run_attempt(q, RANKS, now=1_700_000_010.25, term=3, plan=MARP_PLAN)
    done = step(run, Exits(1, {0: 0, 1: 0}), now=1_700_000_100.0)
    dq = new_record("ws-01-20261201-143001-cd34", DECL, "n" * 64, "ws-01", 1_700_000_001.0)
    drun = run_attempt(dq, RANKS, now=1_700_000_011.0, term=3, plan=DECL_PLAN)
    gpu = {"uuid": "GPU-0", "index": 0, "type": "A100-80GB", "memory_bytes": 80 << 30, "free_bytes": 70 << 30,
           "utilization": 0, "simulated": True, "offered": True, "foreign_processes": 0, "leased_to": run.id}
    lease = {"job_id": run.id, "attempt": 1, "gpus": ["GPU-0"], "term": 3, "coordinator": "c" * 64,
             "launched": True}
    report = {"python": "3.11.7", "torch": "2.13.0", "gpus": [gpu], "leases": [lease],
              "jobs": [q.summary(), run.summary()]}
    enc = wire.encode_message
    launch = JobLaunch(run.id, 1, 3, run, "10.0.0.1", master_port=0, start_store=True, backend="gloo")
    stop = enc(JobStop(run.id, 1, 3))
    member = swim.MemberEntry("n" * 64, "ws-01", "10.0.0.1:7470", 2, 1764600000, 0, 3, "c" * 64)
    other = swim.MemberEntry("m" * 64, "ws-02", "10.0.0.2:7470", 0, 1764600001, 1, 3, None)
    return {
        "swim.ping": enc(swim.SwimPing(41, member, (other,))),
        "swim.ping_req": enc(swim.SwimPingReq(42, member, "m" * 64, "10.0.0.2:7470", ())),
        "swim.ack": enc(swim.SwimAck(41, other, "m" * 64, (member,))),
        "swim.sync": enc(swim.SwimSync(member, (member, other), True)),
        "heartbeat": enc(Heartbeat("n" * 64, "ws-01", "10.0.0.1:7470", 2, 3, "c" * 64,
                                   HeartbeatReport.from_dict(report))),
        "heartbeat.bare": enc(Heartbeat("n" * 64, "ws-01", "10.0.0.1:7470", 0, 0, None,
                                        HeartbeatReport(python="3.11.7"))),
        "ok": wire.encode("ok", {}),
        "error": wire.encode("error", {"reason": "stale_term", "detail": "term 2 < 3"}),
        "job.submit": enc(JobSubmit(q)),
        "job.cancel": enc(JobCancel(run.id)),
        "job.state": enc(JobState(run)),
        "job.state.declared": enc(JobState(drun)),
        "job.attempt": enc(JobAttempt(q.id, 3, 0)),
        "lease.request": enc(LeaseRequest(run.id, 1, ("GPU-0", "GPU-1"), 3)),
        "lease.release": enc(LeaseRelease(run.id, 1, 3)),
        "job.launch": enc(launch),
        "job.launch.others": enc(JobLaunch(run.id, 1, 3, run, "10.0.0.1", 29500, start_store=False,
                                           backend="gloo")),
        "job.stop": stop,
        "payload.fetch": enc(PayloadFetch(run.id, 1, 0, 1 << 20)),
        "job.output": enc(JobOutput(run.id, 1, (OutputChunk(-1, "frenzy", b"[12 bytes of output dropped]\n"),
                                                OutputChunk(0, "stdout", b"step 1 loss 3.2\n"),
                                                OutputChunk(1, "stderr", b"warn\n")))),
        "job.results": enc(JobResults(run.id, 1, 0, 5, b"hello")),
        "job.checkpoint": enc(JobCheckpoint(run.id, 1, 10, 1, 0, 5, "ab" * 32, b"hello")),
        "job.exit": enc(JobExit(run.id, 1, 3, ((0, 0), (1, 0)), "n" * 64, run, vacated=False, reason="")),
        "job.exit.vacated": enc(JobExit(run.id, 1, 3, ((1, -15),), "m" * 64, run, vacated=True,
                                        reason="the owner of GPU GPU-1 is using it")),
        "job.finished": enc(JobFinished(done.id, 1)),
        "signed": wire.encode("signed", {"frame": stop, "cert": b"-----BEGIN CERTIFICATE-----\n",
                                         "sig": bytes(range(64))}),
        "reply.ack": wire.encode("ok", Ack().to_body()),
        "reply.refused": wire.encode("ok", Ack(False, "not the coordinator").to_body()),
        "reply.state": wire.encode("ok", StateAck("running").to_body()),
        "reply.launch": wire.encode("ok", LaunchAck(29500).to_body()),
        "reply.attempt": wire.encode("ok", AttemptAck(2, "queued").to_body()),
        "reply.payload": wire.encode("ok", PayloadChunk(b"\x00\x01payload", 1234).to_body()),
        "revocations": enc(Revocations(2, b'{"format":"frenzy-revocations","version":2}', bytes(range(64)))),
        "revocations.version": enc(Revocations(0)),
        "pool.view": enc(swim.PoolView(128)),
        "pool.peers": enc(swim.PoolPeers(0, 2, (swim.PeerSummary.of("m" * 64, "ws-02", "10.0.0.2:7470", True,
                                                                    report),))),
    }


GOLDEN: dict[str, str] = json.loads((Path(__file__).parent / "golden_frames.json").read_text())


def test_every_kind_is_pinned() -> None:
    """Every kind the daemon speaks (the peer layer's own and every typed class) has a golden frame."""
    pinned = {wire.decode(bytes.fromhex(h)).kind for h in GOLDEN.values()}
    spoken = {"heartbeat", "ok", "error", wire.SIGNED_KIND} | set(wire.TYPES)
    assert spoken <= pinned, f"no golden frame for {sorted(spoken - pinned)}"


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_frame_bytes_are_unchanged(name: str) -> None:
    assert frames()[name].hex() == GOLDEN[name]


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_typed_messages_round_trip(name: str) -> None:
    """Decoding a golden frame into its class and encoding it again gives the same bytes."""
    msg = wire.decode(bytes.fromhex(GOLDEN[name]))
    typed = wire.parse(msg)
    if isinstance(typed, wire.Body):
        assert wire.encode_message(typed).hex() == GOLDEN[name]


if __name__ == "__main__":  # re-pin (only with a protocol version bump)
    out = Path(__file__).parent / "golden_frames.json"
    out.write_text(json.dumps({k: v.hex() for k, v in sorted(frames().items())}, indent=1) + "\n")
    print(f"wrote {out}")
