"""``[jobs] restart_start_s``/``restart_stop_s`` reach the coordinator a daemon runs: what it tells HAS
a re-placement costs until it has measured its own (the status JSON's ``scheduler``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from frenzyd.daemon import Daemon
from frenzyd.net import auth

from .conftest import fast_config


async def test_a_daemon_seeds_its_coordinator_with_the_configured_restart_costs(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    cfg = fast_config(tmp_path, pool_creds["n1"])
    cfg = replace(cfg, jobs=replace(cfg.jobs, restart_start_s=9.5, restart_stop_s=1.5))
    d, stop = Daemon(cfg), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 30)
        costs = d.orch.coordinator.restart_costs()
        assert (costs["start_s"], costs["stop_s"], costs["starts_measured"]) == (9.5, 1.5, 0)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
