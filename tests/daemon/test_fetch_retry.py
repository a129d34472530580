"""A launch asks a slow submitter again for a chunk of the job's payload instead of failing the
attempt at the first timeout (``rank_host.FETCH_TRIES``); a submitter that never answers still fails
it after those tries, and the job is placed again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from frenzyd.jobs import rank_host as rank_host_mod
from frenzyd.jobs.messages import PayloadFetch

from .orch_harness import Pool, job_dir, pool, request, wait_state

__all__ = ["pool"]


async def test_a_slow_submitter_is_asked_again_for_the_payload(
    pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_host_mod, "fetch_timeout_s", lambda nbytes: 1.0)
    a, _b = pool.add("a", 0), pool.add("b", 2)
    pool.coordinator = "a"
    handlers = a.orch.handlers
    fetches: list[float] = []

    def slow_handlers() -> dict[str, Any]:
        table = handlers()
        inner = table[PayloadFetch.KIND]

        async def slow_once(peer: str, msg: Any) -> dict[str, Any]:
            fetches.append(asyncio.get_running_loop().time())
            if len(fetches) == 1:
                await asyncio.sleep(3.0)  # busy: past the 1 s the fetch waits
            return await inner(peer, msg)

        return {**table, PayloadFetch.KIND: slow_once}

    a.orch.handlers = slow_handlers  # type: ignore[method-assign]
    pool.start()
    rec = await a.orch.submit(request(job_dir(tmp_path), nproc=2))
    done = await wait_state(a, rec.id, {"succeeded", "failed", "cancelled"})
    assert done["state"] == "succeeded", done
    assert len(fetches) >= 2
    assert a.orch.store.get(rec.id).attempt == 1  # the slow fetch cost no attempt
