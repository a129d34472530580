"""A rank host's delivery of a stopped attempt's checkpoint part and exit report to a slow submitter
(results/live.md, finding 3: a 10 s send timeout to a loaded submitter delayed a checkpoint copy and an
exit report by about 100 s).

The submitter is a fake ``send`` on a virtual clock: it answers after the time a loaded machine takes
(by the bytes it moves and, on a checkpoint part's last chunk, the bytes it merges), or raises
``TimeoutError`` when that exceeds the sender's limit, as the transport does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from frenzyd.errors import PeerError
from frenzyd.jobs.context import CHUNK, SEND_TIMEOUT_S, ClusterView, RoleContext
from frenzyd.jobs.messages import JobCheckpoint, JobExit
from frenzyd.jobs.outbox import MAX_CHECKPOINT_TRIES, delivery_timeout_s
from frenzyd.jobs.rank_host import RankHostRole
from frenzyd.net.wire import Body

MIB = 1 << 20


class SlowSubmitter:
    """A submitter whose cores its own ranks keep busy: ``per_mib_s`` a MiB received, a checkpoint
    part merged at ``merge_bytes_s`` before the last chunk is answered; ``fail`` raises on chosen
    messages instead (by kind, a countdown)."""

    def __init__(self, per_mib_s: float = 1.2, merge_bytes_s: float = 3e6) -> None:
        self.now = 0.0
        self.per_mib_s, self.merge_bytes_s = per_mib_s, merge_bytes_s
        self.got: list[tuple[str, int]] = []  # (kind, offset) of every message taken
        self.fail: dict[str, list[BaseException]] = {}

    async def send(self, node: str, msg: Body, limit: float) -> dict[str, Any]:
        del node
        await asyncio.sleep(0)
        kind = msg.KIND
        if self.fail.get(kind):
            exc = self.fail[kind].pop(0)
            if isinstance(exc, TimeoutError):
                self.now += limit
            raise exc
        need = 0.05
        offset = 0
        if isinstance(msg, JobCheckpoint):
            offset = msg.offset
            need += len(msg.data) / MIB * self.per_mib_s
            if msg.offset + len(msg.data) >= msg.total:
                need += msg.total / self.merge_bytes_s
        if need > limit:
            self.now += limit
            raise TimeoutError(f"no answer within {limit:.1f}s")
        self.now += need
        self.got.append((kind, offset))
        return {"ok": True}


class Host(RankHostRole):
    """The real rank host; only its backoff (the wait for an unreachable submitter) is recorded and
    skipped."""

    def __init__(self, ctx: RoleContext, data_dir: Path) -> None:
        super().__init__(ctx, data_dir=data_dir, gpus=list, launcher=None, rank_spec=dict,
                         unpack=lambda *a: None, collect_results=lambda *a: b"", max_payload_bytes=1 << 30,
                         max_result_bytes=1 << 30, socket_ifname=None)
        self.backoffs: list[float] = []

    async def _backoff(self, submitter: str, delay: float) -> None:
        self.backoffs.append(delay)


def host(tmp_path: Path, sub: SlowSubmitter) -> Host:
    peers: dict[str, dict[str, Any]] = {"sub": {}, "me": {}}
    ctx = RoleContext(node_id="me", node_name="me", send=sub.send, send_order=sub.send,
                      view=lambda: ClusterView("sub", 1, peers), spawn=lambda coro, name: coro.close(),
                      wake=lambda: None, clock=lambda: sub.now, heartbeat_s=0.001)
    return Host(ctx, tmp_path)


def stopped(h: Host, size: int, now: float) -> Any:
    report = JobExit("j-1", 1, 1, ((0, -15),), "me", vacated=True, reason="preempted", preempted=True)
    data = bytes(range(256)) * (size // 256)
    return h.outbox.put(report, "sub", None, now, (12, 1, data, "0" * 64))


def test_a_send_timeout_grows_with_the_bytes_and_the_work_they_start() -> None:
    assert delivery_timeout_s(0) == SEND_TIMEOUT_S
    assert delivery_timeout_s(MIB) == pytest.approx(SEND_TIMEOUT_S + 1.0)
    assert delivery_timeout_s(MIB, 90 * 10**6) > SEND_TIMEOUT_S + 40  # a 90 MB part's last chunk
    with pytest.raises(ValueError, match="non-negative"):
        delivery_timeout_s(-1)


async def test_a_large_checkpoint_part_reaches_a_loaded_submitter_at_the_first_try(tmp_path: Path) -> None:
    """30 MiB at 1.2 s a MiB, merged at 3 MB/s on the last chunk (11.7 s): with a flat 10 s timeout
    the last chunk never made it, and every retry sent the whole part again."""
    sub = SlowSubmitter()
    h = host(tmp_path, sub)
    entry = stopped(h, 30 * MIB, sub.now)
    await h._deliver(entry)
    chunks = [off for kind, off in sub.got if kind == JobCheckpoint.KIND]
    assert chunks == list(range(0, 30 * MIB, CHUNK))  # each chunk once, in order: no retry
    assert sub.got[-1] == (JobExit.KIND, 0)
    assert h.backoffs == []
    assert h.outbox.entries() == []  # delivered: removed


async def test_a_busy_submitter_is_tried_again_soon_and_a_taken_part_is_not_sent_again(
    tmp_path: Path
) -> None:
    """The part was taken but the exit report timed out twice (the submitter is in the view, only
    busy): it is retried after a heartbeat, not after a growing backoff, and the part is not resent."""
    sub = SlowSubmitter()
    sub.fail[JobExit.KIND] = [TimeoutError("busy"), PeerError("timeout", "busy")]
    h = host(tmp_path, sub)
    await h._deliver(stopped(h, 3 * MIB, sub.now))
    assert [k for k, _ in sub.got].count(JobCheckpoint.KIND) == 3
    assert sub.got[-1] == (JobExit.KIND, 0)
    assert h.backoffs == []


async def test_an_unreachable_submitter_gets_a_growing_backoff(tmp_path: Path) -> None:
    sub = SlowSubmitter()
    sub.fail[JobExit.KIND] = [PeerError("unreachable", "down")] * 3
    h = host(tmp_path, sub)
    await h._deliver(stopped(h, MIB, sub.now))
    assert h.backoffs == [0.001, 0.002, 0.004]
    assert sub.got[-1] == (JobExit.KIND, 0)


async def test_a_checkpoint_part_that_keeps_timing_out_does_not_hold_the_exit_report(tmp_path: Path) -> None:
    """A submitter that never takes the part in time gets the exit report after MAX_CHECKPOINT_TRIES
    tries (the next attempt resumes from the last copy it took while the job ran)."""
    sub = SlowSubmitter()
    sub.fail[JobCheckpoint.KIND] = [TimeoutError("busy")] * 10
    h = host(tmp_path, sub)
    await h._deliver(stopped(h, MIB, sub.now))
    assert len(sub.fail[JobCheckpoint.KIND]) == 10 - MAX_CHECKPOINT_TRIES
    assert sub.got == [(JobExit.KIND, 0)]


def test_a_checkpoint_pruned_while_it_is_packed_is_replaced_by_the_newer_one(tmp_path: Path) -> None:
    """The ranks save step 4 and prune step 2 while the host packs step 2 (every first copy of the live
    tests failed so, logged as "job results too large"): the host packs step 4 instead."""
    ckpt = tmp_path / "runs" / "j-1" / "a1" / "checkpoints"
    (ckpt / "step-00000002").mkdir(parents=True)
    (ckpt / "step-00000002" / "COMPLETE").write_text("2\n")
    packed: list[str] = []

    def collect(path: Path, cap: int) -> bytes:
        packed.append(path.name)
        if path.name == "step-00000002":  # the trainer: step 4 complete, step 2 removed
            (ckpt / "step-00000004").mkdir()
            (ckpt / "step-00000004" / "COMPLETE").write_text("4\n")
            (path / "COMPLETE").unlink()
            path.rmdir()
            raise PeerError("gone", f"cannot pack {path}: no such file")
        return path.name.encode()

    sub = SlowSubmitter()
    h = host(tmp_path, sub)
    h._collect = collect
    run = SimpleNamespace(key=("j-1", 1), job_id="j-1", attempt=1,
                          record=SimpleNamespace(peers=lambda: ["me"]))
    part = h._checkpoint_part(run)  # type: ignore[arg-type]
    assert part is not None
    assert part[:3] == (4, 1, b"step-00000004")
    assert packed == ["step-00000002", "step-00000004"]

    def broken(path: Path, cap: int) -> bytes:
        packed.append(path.name)
        raise OSError("disk full")

    h._collect = broken  # a checkpoint that is still there and fails to pack: reported, not retried
    assert h._checkpoint_part(run) is None  # type: ignore[arg-type]
    assert packed[2:] == ["step-00000004"]


class Copier(Host):
    """A rank host whose copies are timed on the fake submitter's clock and whose waits are recorded
    (and skipped); ``looks`` waits later the attempt ends."""

    def __init__(self, ctx: RoleContext, data_dir: Path, sub: SlowSubmitter, run: Any, looks: int) -> None:
        super().__init__(ctx, data_dir)
        self.sub, self.run, self.looks = sub, run, looks
        self.waits: list[float] = []

    def _now(self) -> float:
        return self.sub.now

    async def _pause(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        self.waits.append(seconds)
        if len(self.waits) >= self.looks:
            self.run.done = True


def copier(tmp_path: Path, looks: int, merge_bytes_s: float) -> tuple[Copier, Any, list[str], Path]:
    sub = SlowSubmitter(per_mib_s=0.1, merge_bytes_s=merge_bytes_s)
    peers: dict[str, dict[str, Any]] = {"sub": {}, "me": {}}
    ctx = RoleContext(node_id="me", node_name="me", send=sub.send, send_order=sub.send,
                      view=lambda: ClusterView("sub", 1, peers), spawn=lambda coro, name: coro.close(),
                      wake=lambda: None, clock=lambda: sub.now, heartbeat_s=0.001)
    run = SimpleNamespace(key=("j-1", 1), job_id="j-1", attempt=1, submitter="sub", done=False,
                          checkpoint_sent=0, record=SimpleNamespace(peers=lambda: ["me"]))
    h = Copier(ctx, tmp_path, sub, run, looks)
    packed: list[str] = []

    def collect(path: Path, cap: int) -> bytes:
        packed.append(path.name)
        return b"x" * (4 * MIB)

    h._collect = collect
    ckpt = tmp_path / "runs" / "j-1" / "a1" / "checkpoints"
    return h, run, packed, ckpt


def complete(ckpt: Path, step: int) -> None:
    d = ckpt / f"step-{step:08d}"
    d.mkdir(parents=True)
    (d / "COMPLETE").write_text(f"{step}\n")


async def test_the_next_checkpoint_copy_waits_twenty_times_the_whole_last_copy(tmp_path: Path) -> None:
    """The spacing counts the submitter's merge (its answer to the last chunk), not the packing
    alone: on a one-node pool the merge ran beside the ranks (bench_trainer_overhead: ~2.5x the
    packing's CPU)."""
    h, run, packed, ckpt = copier(tmp_path, looks=2, merge_bytes_s=1e6)  # 4 MiB merged: 4.2 s
    complete(ckpt, 5)
    await h._upload_checkpoints(run)
    assert packed == ["step-00000005"]
    assert run.checkpoint_sent == 5
    copy_s = h.sub.now  # 4 chunks at 0.05 + 0.1 s, then the merge
    assert copy_s > 4.0
    assert h.waits == [2.0, pytest.approx(20 * copy_s)]


async def test_a_checkpoint_already_sent_is_not_packed_again(tmp_path: Path) -> None:
    h, run, packed, ckpt = copier(tmp_path, looks=6, merge_bytes_s=1e9)
    complete(ckpt, 5)
    await h._upload_checkpoints(run)
    assert packed == ["step-00000005"]  # five more looks, nothing newer: listed, never packed
    assert h.waits[2:] == [2.0] * 4

    h2, run2, packed2, ckpt2 = copier(tmp_path / "b", looks=4, merge_bytes_s=1e9)
    complete(ckpt2, 5)
    complete(ckpt2, 10)
    await h2._upload_checkpoints(run2)
    assert packed2 == ["step-00000010"]
    assert run2.checkpoint_sent == 10
