"""Jobs keep their promises (issue 13): the cases a new user hit on a three-daemon pool, each on real
orchestrators with real launchers, supervisors and rank processes, linked by the harness's router
(the real wire codec), with shrunken timing (heartbeat 0.2 s, lease 6 s).

Each test names the case it covers.  Ranks append ``{attempt, rank, event, t}`` lines to a ledger
file outside every data directory, which no daemon touches, every 0.1 s while they work: that is
how "ran twice at once" (a rank killed without warning is alive until its last line) and "ran
again after it succeeded" are checked.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import time
from pathlib import Path
from typing import Any

from frenzyd.errors import DaemonUnreachable, LaunchError
from frenzyd.jobs.messages import JobState
from frenzyd.node.launcher import Launcher

from .orch_harness import LEASE_S, Pool, eventually, job_dir, pool, request, wait_state

assert pool  # the fixture

LEDGER_SCRIPT = """
import json, os, sys, time
ledger = {ledger!r}
def note(event):
    with open(ledger, "a") as f:
        f.write(json.dumps({{"attempt": int(os.environ["FRENZY_ATTEMPT"]), "rank": int(os.environ["RANK"]),
                            "event": event, "t": time.time()}}) + "\\n")
note("start")
print(f"attempt {{os.environ['FRENZY_ATTEMPT']}} rank {{os.environ['RANK']}}", flush=True)
{body}
note("end")
out = os.environ["FRENZY_OUTPUT_DIR"]
if os.environ["RANK"] == "0":
    with open(os.path.join(out, "result.txt"), "w") as f:
        f.write("attempt " + os.environ["FRENZY_ATTEMPT"] + "\\n")
"""


def ledger_job(tmp: Path, body: str) -> tuple[Path, Path]:
    ledger = tmp / "ledger.ndjson"
    d = job_dir(tmp, LEDGER_SCRIPT.format(ledger=str(ledger), body=body))
    return d, ledger


def entries(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]


def work(seconds: float) -> str:
    """Rank code that works for ``seconds``, noting in the ledger every 0.1 s that it is alive."""
    return f"for _ in range(int({seconds} * 10)):\n    note('alive')\n    time.sleep(0.1)"


def overlapping_attempts(ledger: Path) -> list[tuple[int, int]]:
    """Pairs of different attempts whose ranks were alive at the same time (first to last line)."""
    spans: dict[tuple[int, int], list[float]] = {}
    for e in entries(ledger):
        span = spans.setdefault((e["attempt"], e["rank"]), [e["t"], e["t"]])
        span[1] = max(span[1], e["t"])
    keys = sorted(spans)
    return [(a[0], b[0]) for i, a in enumerate(keys) for b in keys[i + 1:]
            if a[0] != b[0] and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]


async def output_has(node: Any, job_id: str, text: str, limit: float = 60) -> None:
    """Wait until the job's output so far contains ``text`` (a line may arrive in pieces)."""
    seen = ""
    async with asyncio.timeout(limit):
        async for ev in node.orch.store.follow(job_id):
            if ev["type"] == "output":
                seen += ev["data"]
                if text in seen:
                    return


async def test_case1_a_finished_attempts_store_never_touches_the_next(tmp_path: Path) -> None:
    """Case 1: the rendezvous store (and every timer) is keyed by attempt: attempt 1's store
    closing late does not close attempt 2's."""
    launcher = Launcher(tmp_path / "data")
    p1 = await launcher.start_store("job", 1, "127.0.0.1")
    p2 = await launcher.start_store("job", 2, "127.0.0.1")
    assert p1 != p2
    await launcher.cancel("job", 1)  # what attempt 1's linger timer does when it fires
    reader, writer = await asyncio.open_connection("127.0.0.1", p2)  # attempt 2's store still listens
    writer.close()
    await writer.wait_closed()
    assert reader is not None
    await launcher.close()


async def test_case3_a_cancelled_placement_releases_its_reservation(pool: Pool, tmp_path: Path) -> None:
    """Case 3: the submitter says "cancelled" while the coordinator places the job: the GPU is
    released at once and the next job runs on it."""
    a, b, c = pool.add("a", 0), pool.add("b", 1), pool.add("c", 0)
    pool.coordinator = "a"
    on_state = c.orch.submitter.on_state

    async def cancel_first(peer: str, msg: Any) -> Any:
        if msg.record.state == "running" and not c.orch.store.get(msg.record.id).terminal:
            await c.orch.cancel(msg.record.id)  # the user cancels just as the placement lands
        return await on_state(peer, msg)

    c.orch.submitter.on_state = cancel_first  # type: ignore[method-assign]
    pool.start()
    first = await c.orch.submit(request(job_dir(tmp_path, "import time\ntime.sleep(30)\n"), nproc=1))
    await wait_state(c, first.id, {"cancelled"})
    c.orch.submitter.on_state = on_state  # type: ignore[method-assign]
    await eventually(lambda: not a.orch.coordinator._reserved, limit=15)
    second = await c.orch.submit(request(job_dir(tmp_path, "print('second runs')\n"), nproc=1))
    done = await wait_state(c, second.id, {"succeeded", "failed"}, limit=30)
    assert done["state"] == "succeeded", done
    assert b.nid == done["ranks"][0]["peer"]


async def test_case4_a_job_waits_for_its_rebooting_peer(pool: Pool, tmp_path: Path) -> None:
    """Case 4: the only peer that fits restarts: the job waits with the reason shown (well past
    ``unplaceable_after_s``, since a GPU that fits has been seen) and runs when the peer is back."""
    pool.add("a", 0)
    b, c = pool.add("b", 2), pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    warm = await c.orch.submit(request(job_dir(tmp_path, "print('hi')\n"), nproc=1))
    await wait_state(c, warm.id, {"succeeded"})  # c has seen b's two GPUs
    await pool.kill("b")
    rec = await c.orch.submit(request(job_dir(tmp_path, "print('ran after the reboot')\n"), nproc=2))
    await asyncio.sleep(3 * 2.0)  # three times UNPLACEABLE_S
    waiting = c.orch.store.get(rec.id)
    assert (waiting.state, waiting.phase) == ("queued", "waiting")
    assert "--nproc" in waiting.message  # the reason: no live peer has two GPUs now
    pool.restart("b")
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=60)
    assert done["state"] == "succeeded", done
    assert b.nid == done["ranks"][0]["peer"]


async def test_case5_one_failing_rank_stops_the_others(pool: Pool, tmp_path: Path) -> None:
    """Case 5: rank 1 exits 3 while rank 0 (on another peer) would wait for ten minutes: the job
    fails within seconds and names rank 1, with its last output."""
    pool.add("a", 1)
    pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    script = ("import os, sys, time\nif os.environ['RANK'] == '1':\n"
              "    print('rank 1 gives up', flush=True)\n    sys.exit(3)\ntime.sleep(600)\n")
    started = time.monotonic()
    rec = await c.orch.submit(request(job_dir(tmp_path, script), nproc=2))
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=60)
    assert done["state"] == "failed"
    assert done["failed_rank"] == 1
    assert "rank 1 exited 3 first" in done["message"]
    assert time.monotonic() - started < 40  # not the 600 s rank 0 would have slept
    assert "rank 1 gives up" in "".join(e["data"] for e in c.orch.store.read_output(rec.id))


async def test_case6_a_restarted_submitter_reattaches_to_its_running_job(
    pool: Pool, tmp_path: Path
) -> None:
    """Case 6: the submitter is killed and restarts at once; before it hears any peer its running
    job looks lost.  It re-attaches instead: one attempt, never restarted."""
    pool.add("a", 0)
    pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, "time.sleep(8)")
    rec = await c.orch.submit(request(d, nproc=1))
    await output_has(c, rec.id, "attempt 1")
    await pool.kill("c")
    await asyncio.sleep(0.5)
    pool.blind.add("c")  # the restarted daemon has heard no heartbeat yet
    c = pool.restart("c")
    await asyncio.sleep(1.5)
    pool.blind.discard("c")
    done = await wait_state(c, rec.id, {"succeeded", "failed", "queued"}, limit=60)
    assert done["state"] == "succeeded", done
    assert done["attempt"] == 1
    assert {e["attempt"] for e in entries(ledger)} == {1}


async def test_case7_a_job_that_finished_while_its_submitter_was_down_is_never_rerun(
    pool: Pool, tmp_path: Path
) -> None:
    """Case 7: the submitter is down while its job finishes, longer than any retry of the old
    exit report; the rank host keeps the report and results on disk and delivers them when it is
    back.  The job is succeeded with its results, and never runs again."""
    pool.add("a", 0)
    b = pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, "time.sleep(0.5)")
    rec = await c.orch.submit(request(d, nproc=1))
    await output_has(c, rec.id, "attempt 1")
    await pool.kill("c")
    await eventually(lambda: any(e["event"] == "end" for e in entries(ledger)), limit=30)
    await eventually(lambda: b.orch.rank_host.outbox.entries() != [], limit=30)
    await asyncio.sleep(10.0)  # the old code gave up after 30 heartbeats (6 s here)
    c = pool.restart("c")
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=90)
    assert done["state"] == "succeeded", done
    await eventually(lambda: c.orch.store.results(rec.id) is not None, limit=30)
    await eventually(lambda: b.orch.rank_host.outbox.entries() == [], limit=30)
    await asyncio.sleep(3.0)
    assert {e["attempt"] for e in entries(ledger)} == {1}
    assert c.orch.store.get(rec.id).attempt == 1


async def test_case8_a_cut_off_rank_host_never_runs_beside_the_new_attempt(
    pool: Pool, tmp_path: Path
) -> None:
    """Case 8: the rank host is cut off from the rest of the pool (as when it is frozen or
    partitioned) while its ranks run.  Its supervisor kills them when the lease cannot be renewed;
    the coordinator re-places the job only after that, so no two attempts ever overlap."""
    pool.add("a", 0)
    b = pool.add("b", 1)
    pool.add("d", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, work(6 * 6))
    rec = await c.orch.submit(request(d, nproc=1))
    first = await wait_state(c, rec.id, {"running"})
    host = first["ranks"][0]["peer"]
    await output_has(c, rec.id, "attempt 1")
    for other in ("a", "c", "d" if host == b.nid else "b"):
        pool.cut.add(frozenset((host, other)))
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=150)
    assert done["state"] == "succeeded", done
    assert done["attempt"] >= 2
    assert done["ranks"][0]["peer"] != host
    assert overlapping_attempts(ledger) == []
    assert c.orch.store.get(rec.id).lost == 1


class FailingFirstLaunch(Launcher):
    """A launcher whose first rank start fails (a rank host that cannot start the job)."""

    failed = False

    async def launch(self, spec: Any, on_output: Any = None) -> Any:
        if not FailingFirstLaunch.failed:
            FailingFirstLaunch.failed = True
            raise LaunchError("cannot start the rank (test)")
        return await super().launch(spec, on_output)


async def test_case9_the_client_never_sees_a_placement_that_did_not_happen(
    pool: Pool, tmp_path: Path
) -> None:
    """Case 9: a placement whose launch fails is never shown as running; the job goes back to
    waiting, and the placement that does happen is shown with its attempt."""
    pool.add("a", 0)
    b = pool.add("b", 1)
    c = pool.add("c", 0)
    b.orch.rank_host.launcher = FailingFirstLaunch(tmp_path / "b", term_grace_s=2.0, lease_s=LEASE_S)
    pool.coordinator = "a"
    pool.start()
    rec = await c.orch.submit(request(job_dir(tmp_path, "print('ok')\n"), nproc=1))
    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(60):
        async for ev in c.orch.store.follow(rec.id):
            if ev["type"] == "state":
                seen.append(ev["job"])
                if ev["job"]["state"] in ("succeeded", "failed"):
                    break
    assert FailingFirstLaunch.failed
    running = [j for j in seen if j["state"] == "running"]
    assert running, seen
    assert {j["attempt"] for j in running} == {seen[-1]["attempt"]}  # only the real placement
    assert seen[-1]["state"] == "succeeded"
    assert seen[-1]["attempt"] >= 2
    assert any(j["phase"] == "placing" for j in seen)


async def test_a_coordinator_cut_off_from_the_rank_host_cannot_start_a_second_copy(
    pool: Pool, tmp_path: Path
) -> None:
    """An asymmetric cut: the coordinator loses the rank host, the submitter still sees it running
    the attempt.  The coordinator's requeue is refused, so the job finishes as attempt 1."""
    pool.add("a", 0)
    pool.add("b", 1)
    pool.add("d", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, work(3 * LEASE_S))
    rec = await c.orch.submit(request(d, nproc=1))
    first = await wait_state(c, rec.id, {"running"})
    host = first["ranks"][0]["peer"]
    await output_has(c, rec.id, "attempt 1")
    pool.cut.add(frozenset(("a", host)))
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=120)
    assert done["state"] == "succeeded", done
    assert done["attempt"] == 1
    assert {e["attempt"] for e in entries(ledger)} == {1}


async def test_a_coordinator_that_dies_between_launch_and_telling_the_submitter_starts_no_second_copy(
    pool: Pool, tmp_path: Path
) -> None:
    """Found by scripts/bench_chaos.py: the coordinator launches attempt 1 and dies before the
    submitter hears of it, so the record stays "placing" while the ranks run (their lease renewed,
    since the submitter confirms a placing attempt).  The next coordinator must not get attempt 2
    while attempt 1 is held on a peer: attempt 1 finishes, its exit report (which carries the
    placement) settles the job, and no two attempts ever overlap."""
    router = pool.sender

    def sender(src: str) -> Any:
        send = router(src)

        async def lose_placement_news(dst: str, out: Any, limit: float) -> dict[str, Any]:
            if src == "a" and dst == "c" and isinstance(out, JobState) and out.record.state == "running":
                raise DaemonUnreachable("the coordinator died before the submitter heard of the placement")
            return dict(await send(dst, out, limit))

        return lose_placement_news

    pool.sender = sender  # type: ignore[method-assign]
    pool.add("a", 0)
    pool.add("b", 1)
    pool.add("d", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, work(2 * LEASE_S))
    rec = await c.orch.submit(request(d, nproc=1))
    await eventually(lambda: any(e["attempt"] == 1 for e in entries(ledger)), limit=60)
    assert c.orch.store.get(rec.id).phase == "placing"
    await pool.kill("a")
    pool.nodes.pop("a")  # it stays dead
    pool.coordinator, pool.term = "d", 2
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=120)
    assert done["state"] == "succeeded", done
    assert overlapping_attempts(ledger) == []
    assert {e["attempt"] for e in entries(ledger)} == {1}


async def test_a_frozen_coordinator_does_not_stall_lease_renewals(pool: Pool, tmp_path: Path) -> None:
    """Found by scripts/bench_chaos.py: the coordinator freezes (its connections stay up, nothing
    answers); a rank host that resubmits its own queued job to it waits ``SEND_TIMEOUT_S`` (10 s)
    per try, longer than the lease.  Its leases must still be renewed while the submitter confirms
    the attempt: the running job finishes as attempt 1 instead of being killed by its supervisor."""
    frozen: set[str] = set()
    router = pool.sender

    def sender(src: str) -> Any:
        send = router(src)

        async def maybe_hang(dst: str, out: Any, limit: float) -> dict[str, Any]:
            if dst in frozen:  # a frozen peer: the connection is up and no answer comes
                await asyncio.sleep(limit)
                raise DaemonUnreachable(f"{dst} did not answer within {limit:.0f}s")
            return dict(await send(dst, out, limit))

        return maybe_hang

    pool.sender = sender  # type: ignore[method-assign]
    pool.add("a", 0)
    b = pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, work(2 * LEASE_S))
    rec = await c.orch.submit(request(d, nproc=1))
    await wait_state(c, rec.id, {"running"})
    await output_has(c, rec.id, "attempt 1")
    frozen.add("a")
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.py").write_text("print('queued behind the running job')\n")
    queued = asyncio.create_task(b.orch.submit(request(other, nproc=1)))  # b resubmits it to "a"
    done = await wait_state(c, rec.id, {"succeeded", "failed", "queued"}, limit=90)
    assert done["state"] == "succeeded", done
    assert {e["attempt"] for e in entries(ledger)} == {1}
    assert any(e["event"] == "end" for e in entries(ledger))
    await queued


async def test_a_restarted_submitter_whose_placement_news_was_lost_does_not_stop_its_job(
    pool: Pool, tmp_path: Path
) -> None:
    """Found by scripts/bench_chaos.py: the submitter dies while its job is being placed and never
    hears of the placement; restarted, it resubmits its record, still "placing" attempt 1.  The
    coordinator must not take that for a requeue and stop the running attempt (whose -15 then
    failed the job): attempt 1 finishes and its exit report settles the job."""
    router = pool.sender

    def sender(src: str) -> Any:
        send = router(src)

        async def lose_placement_news(dst: str, out: Any, limit: float) -> dict[str, Any]:
            if src == "a" and dst == "c" and isinstance(out, JobState) and out.record.state == "running":
                raise DaemonUnreachable("the submitter is down")
            return dict(await send(dst, out, limit))

        return lose_placement_news

    pool.sender = sender  # type: ignore[method-assign]
    pool.add("a", 0)
    pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, work(2 * LEASE_S))
    rec = await c.orch.submit(request(d, nproc=1))
    await eventually(lambda: any(e["attempt"] == 1 for e in entries(ledger)), limit=60)
    await pool.kill("c")
    c = pool.restart("c")
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=120)
    assert done["state"] == "succeeded", done
    assert {e["attempt"] for e in entries(ledger)} == {1}


async def test_a_late_success_stands_and_the_newer_attempt_is_stopped(pool: Pool, tmp_path: Path) -> None:
    """Found by scripts/bench_chaos.py: attempt 1's host is cut off near the end of the job; attempt
    1 finishes during the cut (before its lease runs out), its report waits in the host's outbox,
    and the job is, rightly, placed again.  When the host is back, attempt 1's success stands: the
    job succeeded with attempt 1's results, and attempt 2 is stopped instead of running the job a
    second time."""
    pool.add("a", 0)
    pool.add("b", 1)
    pool.add("d", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    body = "seconds = 2 if os.environ['FRENZY_ATTEMPT'] == '1' else 90\n" + work("seconds")  # type: ignore[arg-type]
    d, ledger = ledger_job(tmp_path, body)
    rec = await c.orch.submit(request(d, nproc=1))
    first = await wait_state(c, rec.id, {"running"})
    host = first["ranks"][0]["peer"]
    await output_has(c, rec.id, "attempt 1")
    for other in pool.nodes:
        if other != host:
            pool.cut.add(frozenset((host, other)))
    ended = lambda: any(e["event"] == "end" and e["attempt"] == 1 for e in entries(ledger))  # noqa: E731
    await eventually(ended, limit=30)
    await eventually(lambda: pool.nodes[host].orch.rank_host.outbox.entries() != [], limit=30)
    await eventually(lambda: any(e["attempt"] == 2 for e in entries(ledger)), limit=90)
    pool.cut.clear()
    done = await wait_state(c, rec.id, {"succeeded", "failed", "cancelled"}, limit=60)
    assert done["state"] == "succeeded", done
    assert "attempt 1 succeeded" in done["message"]
    assert done["ranks"][0]["peer"] == host
    results = c.orch.store.results(rec.id)
    assert results is not None
    with tarfile.open(fileobj=io.BytesIO(results), mode="r:gz") as tar:
        member = tar.extractfile("result.txt")
        assert member is not None
        assert member.read() == b"attempt 1\n"
    last = await _last_line_of_attempt(ledger, 2)
    assert not any(e["event"] == "end" and e["attempt"] == 2 for e in entries(ledger))
    assert time.time() - last > 2.0
    assert overlapping_attempts(ledger) == []


async def _last_line_of_attempt(ledger: Path, attempt: int, quiet_s: float = 3.0, limit: float = 45) -> float:
    """Wait until ``attempt``'s ranks have written nothing for ``quiet_s`` (they were stopped); return
    the time of their last line."""
    async with asyncio.timeout(limit):
        while True:
            last = max(e["t"] for e in entries(ledger) if e["attempt"] == attempt)
            if time.time() - last > quiet_s:
                return last
            await asyncio.sleep(0.2)


async def test_a_success_reported_after_its_job_was_requeued_stands_and_nothing_reruns(
    pool: Pool, tmp_path: Path
) -> None:
    """Found by scripts/bench_chaos.py: the rank host is cut off while the job finishes; the job is
    requeued (its host is silent past the lease) but not placed again yet.  When the cut heals, the
    host's report of the finished attempt, the record's own last attempt, is late news, not stale:
    the job succeeded, no second attempt ever starts (the submitter numbers none while a peer still
    lists the attempt's undelivered report)."""
    pool.add("a", 0)
    b = pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d, ledger = ledger_job(tmp_path, work(2))
    rec = await c.orch.submit(request(d, nproc=1))
    await wait_state(c, rec.id, {"running"})
    await output_has(c, rec.id, "attempt 1")
    for other in ("a", "c"):
        pool.cut.add(frozenset((b.nid, other)))
    await eventually(lambda: b.orch.rank_host.outbox.entries() != [], limit=30)
    await eventually(lambda: c.orch.store.get(rec.id).state == "queued", limit=60)
    pool.cut.clear()
    done = await wait_state(c, rec.id, {"succeeded", "failed"}, limit=60)
    assert done["state"] == "succeeded", done
    assert done["attempt"] == 1
    await asyncio.sleep(2.0)
    assert {e["attempt"] for e in entries(ledger)} == {1}
