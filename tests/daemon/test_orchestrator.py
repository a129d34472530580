"""Orchestration flow with real launchers and real gloo ranks; daemons linked by an in-process router.

The router encodes and decodes every message with the real wire codec (schemas checked) and
calls the receiving orchestrator's handler; TLS, heartbeats and election are the daemon's and
are tested end to end in test_daemon_loopback.py.  Here the election view is set by the test,
so failover and stale terms can be driven exactly.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from frenzyd.jobs.messages import JobStop, LeaseRequest
from frenzyd.jobs.orchestrator import Orchestrator, Versions
from frenzyd.node import launcher as launcher_mod
from frenzyd.node.launcher import RankSpec

from .orch_harness import GIB, PY, Pool, eventually, job_dir, pool, request, wait_state

__all__ = ["pool"]


async def test_two_rank_gloo_job_runs_on_other_peers(pool: Pool, tmp_path: Path) -> None:
    a, b, c = pool.add("a", 1), pool.add("b", 1), pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    rec = await c.orch.submit(request(job_dir(tmp_path), args=("--lr", "3e-4")))
    done = await wait_state(c, rec.id, {"succeeded", "failed", "cancelled"})
    assert done["state"] == "succeeded", done
    assert sorted(r["peer"] for r in done["ranks"]) == ["a", "b"]
    out = "".join(ev["data"] for ev in c.orch.store.read_output(rec.id))
    assert "rank 0/2 sum 3 args --lr 3e-4" in out
    assert "rank 1/2 sum 3" in out
    results = c.orch.store.results(rec.id)
    assert results is not None
    dest = tmp_path / "res"
    launcher_mod.unpack(results, hashlib.sha256(results).hexdigest(), dest, 1 << 20)
    assert (dest / "result.txt").read_text() == "sum=3\n"
    # Leases are released on the GPU owners and the coordinator's view agrees.
    await eventually(lambda: not a.orch.leases.leases() and not b.orch.leases.leases())
    assert a.orch.table.get(rec.id).state == "succeeded"  # type: ignore[union-attr]
    assert {j["id"]: j["state"] for j in b.orch.jobs_view()}[rec.id] == "succeeded"


async def test_failing_rank_fails_the_job(pool: Pool, tmp_path: Path) -> None:
    pool.add("a", 2)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    script = "import sys\nprint('boom', flush=True)\nsys.exit(7)\n"
    rec = await c.orch.submit(request(job_dir(tmp_path, script), nproc=2))
    done = await wait_state(c, rec.id, {"succeeded", "failed"})
    assert done["state"] == "failed"
    assert "exited 7" in done["message"]


async def test_cancel_kills_running_ranks(pool: Pool, tmp_path: Path) -> None:
    a = pool.add("a", 1)
    pool.coordinator = "a"
    pool.start()
    script = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"
    rec = await a.orch.submit(request(job_dir(tmp_path, script), nproc=1))
    async with asyncio.timeout(60):
        async for ev in a.orch.store.follow(rec.id):
            if ev["type"] == "output" and "started" in ev["data"]:
                break
    attempt = a.orch.store.get(rec.id).attempt
    assert attempt == 1
    pids = {h.pid for h in a.orch.launcher.ranks(rec.id, attempt)}
    assert pids
    assert (await a.orch.cancel(rec.id)).state == "cancelled"
    await eventually(lambda: not a.orch.leases.leases())
    assert all(h.done for h in a.orch.launcher.ranks(rec.id, attempt))


async def test_unplaceable_jobs_wait_with_the_reason_then_the_submitter_fails_them(
    pool: Pool, tmp_path: Path
) -> None:
    pool.add("a", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d = job_dir(tmp_path)
    rec = await c.orch.submit(request(d, nproc=4))
    done = await wait_state(c, rec.id, {"failed"}, limit=30)
    assert "--nproc" in done["message"]
    assert "no GPUs seen in this pool can hold it" in done["message"]
    assert "T4 x1" in done["message"]  # says what it has seen
    rec = await c.orch.submit(request(d, nproc=1, mem=64 * GIB))
    done = await wait_state(c, rec.id, {"failed"}, limit=30)
    assert "--mem-per-rank" in done["message"]


async def test_version_mismatch_is_not_placed(pool: Pool, tmp_path: Path) -> None:
    pool.add("a", 2, torch="2.12.0")
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    rec = await c.orch.submit(request(job_dir(tmp_path), nproc=1))
    done = await wait_state(c, rec.id, {"failed"}, limit=30)
    assert "torch" in done["message"]


async def test_stale_term_lease_and_launch_are_refused(pool: Pool) -> None:
    a, b = pool.add("a", 1), pool.add("b", 1)
    pool.coordinator, pool.term = "b", 5
    h = b.orch.handlers()
    ok = await a.orch.handlers()["lease.request"]("b", LeaseRequest("j1", 1, ("SIM-a-0",), 5))
    assert ok["ok"]
    # A deposed coordinator (term 4) cannot lease or launch on a.
    stale = await a.orch.handlers()["lease.request"]("old", LeaseRequest("j2", 1, ("SIM-a-0",), 4))
    assert not stale["ok"]
    assert "term" in stale["reason"]
    # Not the coordinator of the current term either.
    other = await a.orch.handlers()["lease.request"]("a", LeaseRequest("j3", 1, ("SIM-a-0",), 5))
    assert not other["ok"]
    # The GPU stays leased to one job only.
    busy = await a.orch.handlers()["lease.request"]("b", LeaseRequest("j4", 1, ("SIM-a-0",), 5))
    assert not busy["ok"]
    assert "leased to job j1" in busy["reason"]
    stop = await a.orch.handlers()["job.stop"]("old", JobStop("j1", 1, 4))
    assert not stop["ok"]
    assert h  # b's handlers exist too (same table for every node)


async def test_queued_job_survives_coordinator_failover(pool: Pool, tmp_path: Path) -> None:
    a, b, c = pool.add("a", 0), pool.add("b", 1), pool.add("c", 0)
    pool.coordinator, pool.term = "a", 1
    pool.start()
    d = job_dir(tmp_path)
    slow = (d.parent / "slow")
    slow.mkdir()
    (slow / "train.py").write_text("import time\nprint('holding', flush=True)\ntime.sleep(4)\n")
    first = await c.orch.submit(request(slow, nproc=1))
    await wait_state(c, first.id, {"running"})
    queued = await c.orch.submit(request(d, nproc=1))
    await eventually(lambda: a.orch.table.get(queued.id) is not None)
    assert a.orch.table.get(queued.id).state == "queued"  # type: ignore[union-attr]
    # The coordinator dies; b is elected with a higher term and rebuilds its view.
    pool.down.add("a")
    a.stop.set()
    pool.coordinator, pool.term = "b", 2
    b.orch.wake()
    c.orch.wake()
    done = await wait_state(c, queued.id, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    assert done["ranks"][0]["peer"] == "b"
    first_done = await wait_state(c, first.id, {"succeeded", "failed"})
    assert first_done["state"] == "succeeded"


async def test_records_and_logs_survive_restart(pool: Pool, tmp_path: Path) -> None:
    a = pool.add("a", 1)
    pool.coordinator = "a"
    pool.start()
    rec = await a.orch.submit(request(job_dir(tmp_path, "print('hello from rank')\n"), nproc=1))
    await wait_state(a, rec.id, {"succeeded"})
    again = Orchestrator(
        node_id="a", node_name="a", data_dir=tmp_path / "a", send=pool.sender("a"),
        send_order=pool.sender("a"), view=pool.view, gpus=list, launcher=a.orch.launcher,
        rank_spec=RankSpec, pack_dir=launcher_mod.pack_dir, unpack=launcher_mod.unpack,
        collect_results=launcher_mod.collect_results,
        versions=Versions(PY, "2.13.0"),
    )
    assert again.store.get(rec.id).state == "succeeded"
    assert "hello from rank" in "".join(e["data"] for e in again.store.read_output(rec.id))


async def test_stopping_peer_vacates_and_the_job_reruns_elsewhere(pool: Pool, tmp_path: Path) -> None:
    a, b, c, d = pool.add("a", 0), pool.add("b", 1), pool.add("c", 0), pool.add("d", 1)
    pool.coordinator = "a"
    pool.start()
    script = "import os, time\nprint('attempt on', os.environ['FRENZY_JOB_ID'], flush=True)\ntime.sleep(2)\n"
    rec = await c.orch.submit(request(job_dir(tmp_path, script), nproc=1))
    first = await wait_state(c, rec.id, {"running"})
    where = first["ranks"][0]["peer"]
    node = pool.nodes[where]
    async with asyncio.timeout(60):
        async for ev in c.orch.store.follow(rec.id):
            if ev["type"] == "output" and "attempt on" in ev["data"]:
                break
    node.stop.set()  # the daemon running the rank shuts down: its rank is vacated, not failed
    assert node.task is not None
    await node.task
    pool.down.add(where)
    done = await wait_state(c, rec.id, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    assert done["attempt"] >= 2  # attempt numbers may skip one whose placement failed
    assert c.orch.store.get(rec.id).lost == 0  # a reported shutdown is not the job's doing
    assert done["ranks"][0]["peer"] == ({"b", "d"} - {where}).pop()
    await eventually(lambda: a.orch.table.get(rec.id).state == "succeeded")  # type: ignore[union-attr]
    assert b is not d


async def test_owner_process_vacates_the_job_which_reruns_elsewhere(pool: Pool, tmp_path: Path) -> None:
    a, b, c = pool.add("a", 1), pool.add("b", 1), pool.add("c", 0)
    pool.coordinator = "c"
    pool.start()
    script = "import time\nprint('training', flush=True)\ntime.sleep(2)\n"
    rec = await c.orch.submit(request(job_dir(tmp_path, script), nproc=1))
    first = await wait_state(c, rec.id, {"running"})
    where = pool.nodes[first["ranks"][0]["peer"]]
    async with asyncio.timeout(60):
        async for ev in c.orch.store.follow(rec.id):
            if ev["type"] == "output" and "training" in ev["data"]:
                break
    where.gpus[0]["foreign_processes"] = 1  # the workstation's owner starts something on that GPU
    where.gpus[0]["offered"] = False
    assert await where.orch.protect_owner(where.gpus) == [rec.id]
    done = await wait_state(c, rec.id, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    assert done["attempt"] >= 2  # attempt numbers may skip one whose placement failed
    assert c.orch.store.get(rec.id).lost == 0  # the owner's reclaim is not the job's doing
    assert done["ranks"][0]["peer"] != where.nid
    assert a is not b


async def test_model_job_is_sized_by_marp_and_ranks_see_the_plan(pool: Pool, tmp_path: Path) -> None:
    pool.add("a", 2)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    script = ("import json, os\nplan = json.loads(os.environ['FRENZY_PLAN'])\n"
              "print('world', os.environ['WORLD_SIZE'], 'plan', plan['gpus'], plan['source'], flush=True)\n"
              "print('steps', os.environ['FRENZY_STEPS'], flush=True)\n")
    req = {"workdir": str(job_dir(tmp_path, script)), "argv": ["train.py"], "model": "tiny-gpt2",
           "seq_len": 64, "micro_batch": 1, "global_batch": 4, "dtype": "fp32", "steps": 7}
    rec = await c.orch.submit(req)
    done = await wait_state(c, rec.id, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    plan = done["plan"]
    assert plan["source"] == "marp"
    assert plan["policy"] == "frenzy"
    assert 0 < plan["bytes_per_gpu"] < 16 * GIB
    out = "".join(e["data"] for e in c.orch.store.read_output(rec.id))
    assert f"world {plan['gpus']} plan {plan['gpus']} marp" in out
    assert "steps 7" in out  # the declared work reaches the ranks
