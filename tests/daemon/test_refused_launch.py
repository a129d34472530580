"""A peer that refuses a job's launch is not asked again every pass: the coordinator keeps the job
off that peer for a while (doubling), so its attempt numbers do not climb, and places it elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from frenzyd.errors import LaunchError
from frenzyd.jobs import coordinator as coordinator_mod

from .orch_harness import Pool, eventually, job_dir, pool, request, wait_state

__all__ = ["pool"]


async def test_a_refusing_peer_is_asked_once_per_bar_and_the_job_runs_elsewhere(
        pool: Pool, tmp_path: Path) -> None:
    a, b, _c = pool.add("a", 0), pool.add("b", 2), pool.add("c", 2)
    pool.coordinator = "a"
    pool.down.add("c")  # only the refusing peer is there at first
    asked: list[str] = []

    def refuse(job_id: str, owner: str | None, trainer: bool) -> None:
        asked.append(job_id)
        raise LaunchError(f"job {job_id}: this node's execute directory is full (test)")

    b.orch.launcher.admit = refuse  # type: ignore[method-assign]
    pool.start()
    rec = await a.orch.submit(request(job_dir(tmp_path), nproc=2))
    await eventually(lambda: asked, limit=30)
    await asyncio.sleep(3.0)  # ~15 coordinator passes at heartbeat 0.2 s: before the fix, ~15 launches
    assert asked == [rec.id]
    queued = a.orch.store.get(rec.id)
    assert queued is not None
    assert queued.state == "queued"
    assert queued.attempt == 1, queued  # one attempt spent, not one per pass
    assert coordinator_mod.REFUSED_BAR_S > 3.0
    pool.down.discard("c")
    done = await wait_state(a, rec.id, {"succeeded", "failed", "cancelled"})
    assert done["state"] == "succeeded", done
    assert {r["peer"] for r in done["ranks"]} == {"c"}
    assert asked == [rec.id]


def test_the_bar_doubles_and_is_capped(monkeypatch: Any) -> None:
    role = coordinator_mod.CoordinatorRole.__new__(coordinator_mod.CoordinatorRole)
    now = [100.0]

    class Ctx:
        def clock(self) -> float:
            return now[0]

    class Table:
        def get(self, job_id: str) -> Any:
            return None if job_id == "gone" else type("R", (), {"terminal": False})()

    role.ctx, role.table, role._refused = Ctx(), Table(), {}  # type: ignore[assignment]
    waits = []
    for _ in range(7):
        role._bar("j", "p")
        waits.append(role._refused[("j", "p")][0] - now[0])
    assert waits == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    assert role._barred(now[0]) == {"j": {"p"}}
    now[0] += 601.0
    assert role._barred(now[0]) == {}  # the bar is over; its count stays for the next refusal
    role._bar("j", "p")
    assert role._refused[("j", "p")][1] == 8
    role._bar("gone", "p")
    assert "gone" not in role._barred(now[0])  # a job no longer in the table is forgotten
    assert ("gone", "p") not in role._refused
