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


def _config(tmp_path: Path, c: auth.Credentials, priority: int, seeds: list[str]) -> Any:
    name = c.node_name
    return config_from_dict({
        "node": {"name": name, "data_dir": str(tmp_path / name), "priority": priority},
        "network": {"listen": "127.0.0.1:0", "mdns": False, "membership": "swim", "peers": seeds},
        "pool": {"credentials": str(c.node_cert.parent)},
        "web": {"listen": "127.0.0.1:0"},
        "client": {"listen": f"unix:{tmp_path / name / 'client.sock'}"},
        "devices": [{"type": TYPES[name], "count": 1}],
        "timing": {"heartbeat_s": 0.2, "peer_timeout_s": 1.2, "election_grace_s": 0.6,
                   "request_timeout_s": 2.0},
    }, {}, base=tmp_path)


async def _status(d: Daemon) -> dict[str, Any]:
    assert d.web is not None
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{d.web.port}/api/v1/status") as r:
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def test_a_swim_member_shows_every_members_gpus(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials],
) -> None:
    stop = asyncio.Event()
    daemons: dict[str, Daemon] = {}
    tasks: list[asyncio.Task[None]] = []
    try:
        d1 = daemons["n1"] = Daemon(_config(tmp_path, pool_creds["n1"], 5, []))
        tasks.append(asyncio.create_task(d1.run(stop)))
        await asyncio.wait_for(d1.ready.wait(), 30)
        assert d1.net is not None
        for name in ("n2", "n3"):
            d = daemons[name] = Daemon(_config(tmp_path, pool_creds[name], 0, [d1.net.address]))
            tasks.append(asyncio.create_task(d.run(stop)))
            await asyncio.wait_for(d.ready.wait(), 30)
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
    finally:
        stop.set()
        for t in tasks:
            await asyncio.wait_for(t, 30)
