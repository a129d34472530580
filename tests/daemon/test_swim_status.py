"""``[network] membership = "swim"``: a member's status lists every member with its GPUs and every member's
jobs, though it holds full reports only from the coordinator (the rest come from the coordinator's view when
the status is read)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp

from frenzyd.config import config_from_dict
from frenzyd.daemon import Daemon
from frenzyd.net import auth

from .orch_harness import job_dir, request

TYPES = {"n1": "A100-80GB", "n2": "RTX-A6000", "n3": "T4"}


def _config(tmp_path: Path, c: auth.Credentials, priority: int, seeds: list[str], mode: str = "swim") -> Any:
    name = c.node_name
    return config_from_dict({
        "node": {"name": name, "data_dir": str(tmp_path / name), "priority": priority},
        "network": {"listen": "127.0.0.1:0", "mdns": False, "membership": mode, "peers": seeds},
        "pool": {"credentials": str(c.node_cert.parent)},
        "web": {"listen": "127.0.0.1:0"},
        "client": {"listen": f"unix:{tmp_path / name / 'client.sock'}"},
        "devices": [{"type": TYPES[name], "count": 1}],
        "timing": {"heartbeat_s": 0.2, "peer_timeout_s": 1.2, "election_grace_s": 0.6,
                   "request_timeout_s": 2.0},
    }, {}, base=tmp_path)


class _Pool:
    """In-process daemons started one after another (each ready before the next); ``close`` stops all."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.daemons: dict[str, Daemon] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, name: str, config: Any) -> Daemon:
        d = self.daemons[name] = Daemon(config)
        self._tasks.append(asyncio.create_task(d.run(self.stop)))
        await asyncio.wait_for(d.ready.wait(), 30)
        assert d.net is not None
        return d

    async def close(self) -> None:
        self.stop.set()
        for t in self._tasks:
            await asyncio.wait_for(t, 30)


async def _status(d: Daemon) -> dict[str, Any]:
    assert d.web is not None
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{d.web.port}/api/v1/status") as r:
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def test_a_swim_member_shows_every_members_gpus(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials],
) -> None:
    pool = _Pool()
    daemons = pool.daemons
    try:
        d1 = await pool.start("n1", _config(tmp_path, pool_creds["n1"], 5, []))
        assert d1.net is not None
        for name in ("n2", "n3"):
            await pool.start(name, _config(tmp_path, pool_creds[name], 0, [d1.net.address]))
        id1 = pool_creds["n1"].node_id
        d2 = daemons["n2"]
        assert d2.net is not None
        assert d2.net.members is not None

        deadline = time.monotonic() + 30
        while True:
            sts = {n: await _status(d) for n, d in daemons.items()}
            agreed = all((s["coordinator"] or {}).get("id") == id1 for s in sts.values())
            types = {n: {g["type"] for p in s["peers"] if p["alive"] for g in p["gpus"]}
                     for n, s in sts.items()}
            if agreed and all(t == set(TYPES.values()) for t in types.values()):
                break
            assert time.monotonic() < deadline, f"statuses never showed every GPU: {types}"
            await asyncio.sleep(0.3)
        # n2 did not hear n3's report itself: its GPUs came from the coordinator's view.
        assert pool_creds["n3"].node_id in d2.net.members.pool_view
        assert d1.net.counters.received["pool.view"] >= 1

        # A job submitted on n3 (5 ranks: it waits) shows on n2, which never heard n3's report.
        d3 = daemons["n3"]
        assert d3.orch is not None
        rec = await d3.orch.submit(request(job_dir(tmp_path), nproc=5))
        while rec.id not in {j["id"] for j in (await _status(d2))["jobs"]}:
            assert time.monotonic() < deadline + 30, "n3's job never showed on n2"
            await asyncio.sleep(0.3)

        # A member the protocol holds live but whose report reached neither n2 nor the coordinator is
        # listed as not alive yet (joining): "alive" in a status means its GPUs are known.
        d2.net.table.member("f" * 32, name="joining", address="127.0.0.1:9", priority=0, term=0,
                            coordinator=None, live=True, now=time.monotonic())
        assert d2.net.table.is_alive("f" * 32, time.monotonic())
        joining = next(p for p in (await _status(d2))["peers"] if p["name"] == "joining")
        assert joining["alive"] is False
    finally:
        await pool.close()


async def test_a_mesh_node_among_swim_members_stays_whole(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials],
) -> None:
    """A pool mid-way through switching modes (or a rolling upgrade from a release before swim, whose
    default was the mesh): a ``mesh`` node heartbeats every peer and hears a swim member in the reply
    (a heartbeat answers with one), and the swim members hear it by its heartbeats.  Every node lists
    all three alive, steadily, under one coordinator."""
    pool = _Pool()
    daemons = pool.daemons
    try:
        d1 = await pool.start("n1", _config(tmp_path, pool_creds["n1"], 5, []))
        assert d1.net is not None
        d2 = await pool.start("n2", _config(tmp_path, pool_creds["n2"], 0, [d1.net.address]))
        assert d2.net is not None
        d3 = await pool.start("n3", _config(tmp_path, pool_creds["n3"], 0, [d1.net.address, d2.net.address],
                                            mode="mesh"))
        assert d3.net is not None
        assert d3.net.members is None  # n3 runs the mesh
        ids = {pool_creds[n].node_id for n in daemons}
        id1 = pool_creds["n1"].node_id

        def whole(sts: dict[str, dict[str, Any]]) -> bool:
            return all({p["id"] for p in s["peers"] if p["alive"]} == ids
                       and (s["coordinator"] or {}).get("id") == id1 for s in sts.values())

        deadline = time.monotonic() + 30
        while not whole({n: await _status(d) for n, d in daemons.items()}):
            assert time.monotonic() < deadline, "the mixed pool never formed"
            await asyncio.sleep(0.3)
        # Steady for three peer timeouts: n3 would drop n2 after one without n2's heartbeats.
        until = time.monotonic() + 3 * 1.2
        while time.monotonic() < until:
            sts = {n: await _status(d) for n, d in daemons.items()}
            alive = {n: sorted(p["name"] for p in s["peers"] if p["alive"]) for n, s in sts.items()}
            assert whole(sts), alive
            await asyncio.sleep(0.3)
    finally:
        await pool.close()
