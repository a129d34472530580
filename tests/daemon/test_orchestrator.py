"""Orchestration flow with real launchers and real gloo ranks; daemons linked by an in-process router.

The router encodes and decodes every message with the real wire codec (schemas checked) and
calls the receiving orchestrator's handler; TLS, heartbeats and election are the daemon's and
are tested end to end in test_daemon_loopback.py.  Here the election view is set by the test,
so failover and stale terms can be driven exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from frenzyd import launcher as launcher_mod
from frenzyd import wire
from frenzyd.errors import DaemonUnreachable
from frenzyd.launcher import Launcher, RankSpec
from frenzyd.orchestrator import ClusterView, Orchestrator, Versions

GIB = 1 << 30
PY = ".".join(map(str, sys.version_info[:3]))

DDP_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(r + 1)])
    dist.all_reduce(t)
    print(f"rank {r}/{w} sum {t.item():.0f} args {' '.join(sys.argv[1:])}", flush=True)
    if r == 0:
        out = os.environ["FRENZY_OUTPUT_DIR"]
        with open(os.path.join(out, "result.txt"), "w") as f:
            f.write(f"sum={t.item():.0f}\\n")
    dist.destroy_process_group()
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
    """
)


@dataclass
class Node:
    nid: str
    orch: Orchestrator
    gpus: list[dict[str, Any]]
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None


class Pool:
    """N orchestrators, an in-process router, and an election view the test controls."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nodes: dict[str, Node] = {}
        self.coordinator: str | None = None
        self.term = 1
        self.down: set[str] = set()
        self.torch_version = "2.13.0"

    def view(self) -> ClusterView:
        peers = {nid: n.orch.report() | {"name": nid, "address": "127.0.0.1:1"}
                 for nid, n in self.nodes.items() if nid not in self.down}
        return ClusterView(self.coordinator, self.term, peers)

    def sender(self, src: str) -> Any:
        async def send(dst: str, kind: str, body: dict[str, Any], limit: float) -> dict[str, Any]:
            if dst in self.down or src in self.down or dst not in self.nodes:
                raise DaemonUnreachable(f"{dst} is down")
            msg = wire.decode(wire.encode(kind, body))
            handler = self.nodes[dst].orch.handlers()[msg.kind]
            reply = await asyncio.wait_for(handler(src, msg.body), limit)
            return wire.decode(wire.encode("job.reply", reply)).body
        return send

    def add(self, nid: str, gpus: int, gpu_type: str = "T4", torch: str | None = None) -> Node:
        data = self.tmp / nid
        data.mkdir(parents=True, exist_ok=True)
        launcher = Launcher(data, term_grace_s=2.0)
        decl = [{"uuid": f"SIM-{nid}-{i}", "index": i, "type": gpu_type, "memory_bytes": 16 * GIB,
                 "free_bytes": 16 * GIB, "simulated": True, "offered": True} for i in range(gpus)]
        orch = Orchestrator(
            node_id=nid, node_name=nid, data_dir=data, host="127.0.0.1",
            send=self.sender(nid), send_order=self.sender(nid), view=self.view, gpus=lambda: decl,
            launcher=launcher, rank_spec=RankSpec, pack_dir=launcher_mod.pack_dir, unpack=launcher_mod.unpack,
            collect_results=launcher_mod.collect_results,
            versions=Versions(PY, torch or self.torch_version), heartbeat_s=0.2,
        )
        node = Node(nid, orch, decl, asyncio.Event())
        self.nodes[nid] = node
        return node

    def start(self) -> None:
        for n in self.nodes.values():
            if n.task is None:
                n.task = asyncio.create_task(n.orch.run(n.stop))

    async def close(self) -> None:
        for n in self.nodes.values():
            n.stop.set()
        for n in self.nodes.values():
            if n.task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(n.task, 20)
            await n.orch.launcher.close()


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[Pool]:
    p = Pool(tmp_path)
    try:
        yield p
    finally:
        await p.close()


def job_dir(tmp: Path, script: str = DDP_SCRIPT) -> Path:
    d = tmp / "job"
    d.mkdir(exist_ok=True)
    (d / "train.py").write_text(script)
    return d


async def wait_state(node: Node, job_id: str, states: set[str], limit: float = 90) -> dict[str, Any]:
    async with asyncio.timeout(limit):
        async for ev in node.orch.store.follow(job_id):
            if ev["type"] == "state" and ev["job"]["state"] in states:
                return dict(ev["job"])
    raise AssertionError(f"job {job_id} never reached {states}")


async def eventually(pred: Any, limit: float = 30) -> None:
    """Wait until ``pred()`` holds (state that has no event to await: leases, table entries)."""
    async with asyncio.timeout(limit):
        while True:
            if pred():
                return
            await asyncio.sleep(0.05)


def request(d: Path, nproc: int = 2, mem: int = GIB, args: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"workdir": str(d), "argv": ["train.py", *args], "nproc": nproc, "mem_per_rank": mem}


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
    launcher_mod.unpack(results, __import__("hashlib").sha256(results).hexdigest(), dest, 1 << 20)
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
    pids = {h.pid for h in a.orch.launcher.ranks(rec.id)}
    assert pids
    assert (await a.orch.cancel(rec.id)).state == "cancelled"
    await eventually(lambda: not a.orch.leases.leases())
    assert all(h.done for h in a.orch.launcher.ranks(rec.id))


async def test_infeasible_and_version_mismatch_fail_with_reason(pool: Pool, tmp_path: Path) -> None:
    pool.add("a", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    d = job_dir(tmp_path)
    rec = await c.orch.submit(request(d, nproc=4))
    done = await wait_state(c, rec.id, {"failed"}, limit=30)
    assert "--nproc" in done["message"]
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
    ok = await a.orch.handlers()["lease.request"]("b", {"job_id": "j1", "gpus": ["SIM-a-0"], "term": 5})
    assert ok["ok"]
    # A deposed coordinator (term 4) cannot lease or launch on a.
    stale = await a.orch.handlers()["lease.request"]("old", {"job_id": "j2", "gpus": ["SIM-a-0"], "term": 4})
    assert not stale["ok"]
    assert "term" in stale["reason"]
    # Not the coordinator of the current term either.
    other = await a.orch.handlers()["lease.request"]("a", {"job_id": "j3", "gpus": ["SIM-a-0"], "term": 5})
    assert not other["ok"]
    # The GPU stays leased to one job only.
    busy = await a.orch.handlers()["lease.request"]("b", {"job_id": "j4", "gpus": ["SIM-a-0"], "term": 5})
    assert not busy["ok"]
    assert "leased to job j1" in busy["reason"]
    stop = await a.orch.handlers()["job.stop"]("old", {"job_id": "j1", "term": 4})
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
        node_id="a", node_name="a", data_dir=tmp_path / "a", host="127.0.0.1", send=pool.sender("a"),
        send_order=pool.sender("a"), view=pool.view, gpus=list, launcher=a.orch.launcher,
        rank_spec=RankSpec, pack_dir=launcher_mod.pack_dir, unpack=launcher_mod.unpack,
        collect_results=launcher_mod.collect_results,
        versions=Versions(PY, "2.13.0"),
    )
    assert again.store.get(rec.id).state == "succeeded"
    assert "hello from rank" in "".join(e["data"] for e in again.store.read_output(rec.id))
