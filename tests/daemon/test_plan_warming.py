"""The coordinator computes a model job's MARP plans in a worker thread (at admission, or when a pass
finds them missing), never in the pass or on the event loop, and places the job on a later pass."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from frenzyd.jobs import coordinator as coordinator_mod
from frenzyd.jobs import placement
from frenzyd.marp.plan_cache import PlanCache, set_default_cache

from .orch_harness import Pool, job_dir, pool, request, wait_state

__all__ = ["pool"]


async def test_a_model_job_is_planned_off_the_pass_then_placed(pool: Pool, tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    on_loop: list[bool] = []
    real = coordinator_mod.warm_plans

    def spy(spec: Any, offers: Any, **kw: Any) -> bool:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real(spec, offers, **kw)

    monkeypatch.setattr(coordinator_mod, "warm_plans", spy)
    inline: list[bool] = []
    planning: list[tuple[str, ...]] = []
    real_schedule = coordinator_mod.schedule

    def schedule(*args: Any, **kw: Any) -> Any:
        if not inline:  # the submitter's own check planned the job in this process: forget it
            set_default_cache(PlanCache())
        inline.append(kw.get("plan_inline", True))
        sched = real_schedule(*args, **kw)
        planning.append(sched.planning)
        return sched

    monkeypatch.setattr(coordinator_mod, "schedule", schedule)
    old = set_default_cache(PlanCache())  # nothing planned yet: the job's shape is new here
    placement._KNOWN.clear()
    try:
        pool.add("a", 2)
        c = pool.add("c", 0)
        pool.coordinator = "a"
        pool.start()
        req = request(job_dir(tmp_path))
        req.update(model="tiny-gpt2", seq_len=64, global_batch=4, nproc=None, mem_per_rank=None)
        job = await c.orch.submit(req)
        done = await wait_state(c, job.id, {"succeeded", "failed"})
    finally:
        set_default_cache(old)
    assert done["state"] == "succeeded", done
    assert done["plan"]["source"] == "marp"
    assert on_loop, "the coordinator never computed the job's plans ahead of a pass"
    assert not any(on_loop), "plans were computed on the event loop's thread"
    assert inline, "no pass ran"
    assert not any(inline), "a pass was allowed to enumerate plans itself"
    assert planning[0] == (job.id,)  # the first pass found no plans and left the job out
    assert len(planning) >= 2
