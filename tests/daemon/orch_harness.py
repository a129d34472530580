"""Test harness: several orchestrators with real launchers, linked by an in-process router.

The router encodes and decodes every message with the real wire codec (schemas checked) and
calls the receiving orchestrator's handler; the election view is set by the test.
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

from frenzyd.errors import DaemonUnreachable
from frenzyd.jobs.orchestrator import ClusterView, Orchestrator, Versions
from frenzyd.jobs.placement import RestartCosts
from frenzyd.net import wire
from frenzyd.node import launcher as launcher_mod
from frenzyd.node.launcher import Launcher, RankSpec

GIB = 1 << 30
LEASE_S = 6.0
"""Shrunken ``lease_timeout_s``: a silent peer's jobs are re-placed after ~6.4 s, not ~30 s."""
UNPLACEABLE_S = 2.0
"""Shrunken ``jobs.unplaceable_after_s``."""
TINY_RESTART_S = (0.0, 0.0)
"""Restart costs for a live preemption test that should not hang on the pool's own figures: MARP
predicts ~1 us a step for the tiny test model on a simulated T4, so a 100,000-step job has ~0.1 s
left by its plan until the coordinator has measured its steps (a trainer's, after 10 of them; a
checkpointable script reports none), and HAS stops a running job only when its time left exceeds
the newcomer's plus its restart.  ``test_a_short_job_preempts_a_long_one_...`` runs on the defaults."""
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
        self.cut: set[frozenset[str]] = set()
        """Pairs of nodes that cannot reach each other (a network partition)."""
        self.blind: set[str] = set()
        """Nodes that see no peer but themselves (a daemon just restarted, before any heartbeat)."""
        self.torch_version = "2.13.0"
        self.min_run_s = 120.0
        """``jobs.min_run_s`` of every node (a test of live preemption shrinks it)."""
        self.term_grace_s = 2.0
        """The launchers' SIGTERM-to-SIGKILL grace (the ranks get at most half the lease of it)."""
        self.lease_s = LEASE_S
        """Every node's lease (and ``lease_timeout_s``)."""
        self.restart_s: tuple[float, float] | None = None
        """(start, stop) seconds every coordinator tells HAS a re-placement costs, pinned (no learning);
        None: each measures its own from the defaults (``RestartCosts``).  :data:`TINY_RESTART_S` for
        a test whose preemption must pay off by HAS's exchange argument with the tiny test model."""

    def view(self, me: str | None = None) -> ClusterView:
        peers = {nid: n.orch.report() | {"name": nid, "address": "127.0.0.1:1"}
                 for nid, n in self.nodes.items()
                 if nid not in self.down and (me is None or nid == me or self.reachable(me, nid))}
        return ClusterView(self.coordinator, self.term, peers)

    def reachable(self, a: str, b: str) -> bool:
        return a not in self.blind and b not in self.blind and frozenset((a, b)) not in self.cut

    def sender(self, src: str) -> Any:
        async def send(dst: str, out: wire.Body, limit: float) -> dict[str, Any]:
            if dst in self.down or src in self.down or dst not in self.nodes or (
                    src != dst and frozenset((src, dst)) in self.cut):
                raise DaemonUnreachable(f"{dst} is down")
            msg = wire.decode(wire.encode_message(out))  # the same bytes and checks as the network
            handler = self.nodes[dst].orch.handlers()[msg.kind]
            reply = await asyncio.wait_for(handler(src, wire.parse(msg)), limit)
            return wire.decode(wire.encode("ok", reply)).body
        return send

    def add(self, nid: str, gpus: int, gpu_type: str = "T4", torch: str | None = None) -> Node:
        data = self.tmp / nid
        data.mkdir(parents=True, exist_ok=True)
        launcher = Launcher(data, term_grace_s=self.term_grace_s, lease_s=self.lease_s)
        decl = [{"uuid": f"SIM-{nid}-{i}", "index": i, "type": gpu_type, "memory_bytes": 16 * GIB,
                 "free_bytes": 16 * GIB, "simulated": True, "offered": True} for i in range(gpus)]
        orch = Orchestrator(
            node_id=nid, node_name=nid, data_dir=data,
            send=self.sender(nid), send_order=self.sender(nid), view=lambda: self.view(nid),
            gpus=lambda: decl,
            launcher=launcher, rank_spec=RankSpec, pack_dir=launcher_mod.pack_dir, unpack=launcher_mod.unpack,
            collect_results=launcher_mod.collect_results,
            versions=Versions(PY, torch or self.torch_version), heartbeat_s=0.2, lease_timeout_s=self.lease_s,
            unplaceable_after_s=UNPLACEABLE_S, min_run_s=self.min_run_s,
        )
        if self.restart_s is not None:
            start_s, stop_s = self.restart_s
            orch.coordinator.restart = RestartCosts(start_s=start_s, stop_s=stop_s, weight=0.0)
        node = Node(nid, orch, decl, asyncio.Event())
        self.nodes[nid] = node
        return node

    async def kill(self, nid: str) -> None:
        """The node's daemon dies at once (SIGKILL): no graceful shutdown, its ranks die with it."""
        node = self.nodes[nid]
        self.down.add(nid)
        if node.task is not None:
            node.task.cancel()
            with contextlib.suppress(BaseException):
                await node.task
        await node.orch.launcher.close()

    def restart(self, nid: str) -> Node:
        """A new daemon on the dead node's data directory (records, outbox, seen GPUs survive)."""
        old = self.nodes.pop(nid)
        self.down.discard(nid)
        node = self.add(nid, len(old.gpus), old.gpus[0]["type"] if old.gpus else "T4")
        node.task = asyncio.create_task(node.orch.run(node.stop))
        return node

    def start(self) -> None:
        for n in self.nodes.values():
            if n.task is None:
                n.task = asyncio.create_task(n.orch.run(n.stop))

    async def close(self) -> None:
        for n in self.nodes.values():
            n.stop.set()
        for n in self.nodes.values():
            try:
                if n.task is not None and not n.task.done():  # a killed node's task is over already
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(n.task, 20)
            finally:  # every launcher is closed, whatever a node's task did: no process outlives a test
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
