"""The coordinator's pass at scale: MARP's plans warmed off the pass, a job waiting for its plans placed
on the next pass, and what a pass keeps per job (candidates, HAS's view) invalidated when its inputs
change (the job's spec, its version group's GPUs, the headroom, the restart costs)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzyd.jobs import placement
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import (
    OfferedGpu,
    PeerOffer,
    QueuedJob,
    RestartCosts,
    marp_plans,
    schedule,
    warm_plans,
)
from frenzyd.marp.model import load_model
from frenzyd.marp.plan_cache import PlanCache, set_default_cache
from frenzyd.marp.spec import GpuPool, TrainingSetup

GIB = 1 << 30


@pytest.fixture(autouse=True)
def fresh_cache() -> object:
    """Each test on an empty plan cache and empty per-job memories."""
    old = set_default_cache(PlanCache())
    placement._KNOWN.clear()
    placement._VIEWS.clear()
    yield
    set_default_cache(old)


def model_job(seq: int = 128, gb: int = 4, **kw: object) -> JobSpec:
    return JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                   torch_version="2.13.0", model="tiny-gpt2", seq_len=seq, micro_batch=1, global_batch=gb,
                   dtype="fp32", **kw)  # type: ignore[arg-type]


def peer(nid: str, gpus: list[tuple[str, int]], torch: str = "2.13.0") -> PeerOffer:
    return PeerOffer(nid, nid.upper(), f"{nid}:1", "3.11.9", torch,
                     tuple(OfferedGpu(f"{nid}-{i}", i, t, gib * GIB, gib * GIB, True, True)
                           for i, (t, gib) in enumerate(gpus)))


OFFERS = [peer("a", [("T4", 16)] * 2), peer("b", [("A100-80GB", 80)])]


def test_plan_cache_lookup_only_answers_from_the_cache_or_none() -> None:
    cache = PlanCache()
    model = load_model("tiny-gpt2")
    job = TrainingSetup(seq_len=128, micro_batch=1, global_batch=4)
    pools = [GpuPool("T4", 4, 16 * GIB, 0.3, 2)]
    assert cache.plans(model, job, pools, compute=False) is None  # nothing cached: nothing computed
    assert cache.stats().counts_computed == 0
    full = cache.plans(model, job, pools)
    assert full
    assert cache.plans(model, job, pools, compute=False) is full
    fewer = [replace(pools[0], count=2)]  # a smaller bound is answered from the same entry
    assert cache.plans(model, job, fewer, compute=False) == cache.plans(model, job, fewer)
    more = [replace(pools[0], count=8)]  # a larger bound would need counts past the cached ones
    before = cache.stats().counts_computed
    assert cache.plans(model, job, more, compute=False) is None
    assert cache.stats().counts_computed == before
    assert cache.plans(model, job, [GpuPool("A10", 1, 24 * GIB, 1.0, 1)], compute=False) is None
    assert PlanCache(0).plans(model, job, pools, compute=False) is None  # no cache: never ready


def test_warm_plans_fills_the_cache_the_pass_reads() -> None:
    s = model_job()
    assert warm_plans(s, OFFERS) is True
    assert warm_plans(s, OFFERS) is False  # cached already: nothing computed
    sched = schedule([QueuedJob("m", s, 0.0)], OFFERS, now_s=0.0, plan_inline=False)
    assert sched.planning == ()
    assert [j for j, _ in sched.start] == ["m"]
    declared = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                       torch_version="2.13.0", nproc=1, mem_per_rank=GIB)
    assert warm_plans(declared, OFFERS) is False  # nothing to plan


def test_a_job_whose_plans_are_not_ready_waits_and_is_placed_on_the_next_pass() -> None:
    s = model_job()
    q = QueuedJob("m", s, 0.0)
    first = schedule([q], OFFERS, now_s=0.0, plan_inline=False)
    assert first.planning == ("m",)
    assert first.start == ()
    assert first.infeasible == ()
    warm_plans(s, OFFERS)  # what the coordinator runs off the pass
    second = schedule([q], OFFERS, now_s=1.0, plan_inline=False)
    assert second.planning == ()
    assert [j for j, _ in second.start] == ["m"]
    # The same placement as a pass that plans inline decides.
    assert second.start == schedule([q], OFFERS, now_s=1.0).start


def test_a_new_gpu_type_makes_a_warmed_job_wait_again() -> None:
    s = model_job()
    warm_plans(s, OFFERS)
    more = [*OFFERS, peer("c", [("RTX-3090", 24)])]
    assert schedule([QueuedJob("m", s, 0.0)], more, now_s=0.0, plan_inline=False).planning == ("m",)
    warm_plans(s, more)
    assert schedule([QueuedJob("m", s, 0.0)], more, now_s=0.0, plan_inline=False).planning == ()


def test_an_unknown_model_is_infeasible_not_planning() -> None:
    bad = replace(model_job(), model="no-such-model")
    sched = schedule([QueuedJob("x", bad, 0.0)], OFFERS, now_s=0.0, plan_inline=False)
    assert sched.planning == ()
    assert "unknown model preset" in sched.infeasible[0][1]


def test_kept_candidates_follow_the_jobs_spec_and_the_pool() -> None:
    q = QueuedJob("m", model_job(), 0.0)
    schedule([q], OFFERS, now_s=0.0)
    kept = placement._KNOWN["m"]
    schedule([q], OFFERS, now_s=1.0)
    assert placement._KNOWN["m"] is kept  # unchanged inputs: reused
    # The same job id with another spec (a bigger batch): derived afresh.
    bigger = replace(q, spec=model_job(gb=8))
    schedule([bigger], OFFERS, now_s=2.0)
    assert placement._KNOWN["m"] is not kept
    assert placement._KNOWN["m"].cands == tuple(marp_plans(bigger.spec, OFFERS, headroom=0.1,
                                                           only_available=False))
    # A peer with a new GPU type joins: the candidates include it.
    again = placement._KNOWN["m"]
    more = [*OFFERS, peer("c", [("RTX-3090", 24)])]
    schedule([bigger], more, now_s=3.0)
    assert placement._KNOWN["m"] is not again
    assert "RTX-3090" in {c.gpu_type for c in placement._KNOWN["m"].cands}
    # Free memory moving, or a GPU leased, changes nothing the candidates depend on.
    kept = placement._KNOWN["m"]
    busy = [replace(p, gpus=tuple(replace(g, free_bytes=g.free_bytes - 5 * (1 << 20), available=False)
                                  for g in p.gpus)) for p in more]
    schedule([bigger], busy, now_s=4.0)
    assert placement._KNOWN["m"] is kept


def test_kept_views_follow_work_and_restart_costs() -> None:
    s = replace(model_job(), steps=100)
    queue = [QueuedJob("m", s, 0.0)]
    seen: list[object] = []

    class Spy:
        name = "spy"
        round_s = None

        def decide(self, snapshot: object, rng: object) -> object:
            from frenzyd.has.interface import Decision

            seen.append(snapshot.queued[0])  # type: ignore[attr-defined]
            return Decision()

    schedule(queue, OFFERS, now_s=0.0, policy=Spy())
    schedule(queue, OFFERS, now_s=1.0, policy=Spy())
    assert seen[1] is seen[0]
    schedule([replace(queue[0], done_steps=40)], OFFERS, now_s=2.0, policy=Spy())
    assert seen[2].remaining_steps == 60.0  # type: ignore[attr-defined]
    costs = RestartCosts()
    costs.observe_start(5.0)
    schedule([replace(queue[0], done_steps=40)], OFFERS, now_s=3.0, policy=Spy(), restart=costs)
    assert seen[3] is not seen[2]
    assert seen[3].speed.restart_cost_s == costs.start_s  # type: ignore[attr-defined]


def _report(free: int = 20 * GIB, leased: str | None = None, offered: bool = True) -> dict[str, object]:
    return {"python": "3.11.7", "torch": "2.13.0", "name": "ws", "address": "10.0.0.1:7470",
            "gpus": [{"uuid": "GPU-a", "index": 0, "type": "RTX-3090", "memory_bytes": 24 * GIB,
                      "free_bytes": free, "simulated": False, "offered": offered, "leased_to": leased},
                     {"uuid": "GPU-b", "index": 1, "type": "RTX-3090", "memory_bytes": 24 * GIB,
                      "free_bytes": 0, "simulated": False, "offered": True, "leased_to": "j"}]}


def test_an_unchanged_report_gives_the_same_offer_and_a_changed_one_a_new_one() -> None:
    from frenzyd.jobs.placement import offers_from_reports

    (first,) = offers_from_reports({"n1": _report()})
    (again,) = offers_from_reports({"n1": _report()})  # a new dict with the same figures
    assert again is first
    # Free memory moves on one GPU: that GPU is new, the other is the same object.
    (moved,) = offers_from_reports({"n1": _report(free=20 * GIB - (3 << 20))})
    assert moved is not first
    assert moved.gpus[0].free_bytes == 20 * GIB - (3 << 20)
    assert moved.gpus[1] is first.gpus[1]
    # Leased, withdrawn by the owner, or reserved by a placement in flight: no longer available.
    assert not offers_from_reports({"n1": _report(leased="k")})[0].gpus[0].available
    assert not offers_from_reports({"n1": _report(offered=False)})[0].gpus[0].available
    assert not offers_from_reports({"n1": _report()}, {"GPU-a"})[0].gpus[0].available
    assert offers_from_reports({"n1": _report()})[0].gpus[0].available
    # A figure of another type converts as before (an int-valued float is not kept as the int).
    odd = _report()
    odd["gpus"][0]["index"] = 0.0  # type: ignore[index]
    assert offers_from_reports({"n1": odd})[0].gpus[0].index == 0
    renamed = {**_report(), "name": "ws-2"}
    assert offers_from_reports({"n1": renamed})[0].name == "ws-2"


def test_a_warmed_job_needs_no_new_plans_when_a_few_workstations_join() -> None:
    s = model_job()
    warm_plans(s, OFFERS)
    grown = [*OFFERS, peer("c", [("T4", 16)] * 2), peer("d", [("A100-80GB", 80)])]  # same types, more GPUs
    sched = schedule([QueuedJob("m", s, 0.0)], grown, now_s=0.0, plan_inline=False)
    assert sched.planning == ()
    assert [j for j, _ in sched.start] == ["m"]
    # The answer over the grown pool is what a fresh enumeration gives.
    assert placement._KNOWN["m"].cands == tuple(marp_plans(s, grown, headroom=0.1, only_available=False))
    set_default_cache(PlanCache())
    placement._KNOWN.clear()
    assert placement._KNOWN == {}
    fresh = schedule([QueuedJob("m", s, 0.0)], grown, now_s=0.0)
    assert fresh.start == sched.start
