"""The restart cost HAS is told is the job's model's own once the pool has measured it: a model
whose checkpoints are slow to write and load is moved less than one that restarts quickly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzyd.has.frenzy import FrenzyPolicy
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import (
    MAX_RESTART_MODELS,
    OfferedGpu,
    PeerOffer,
    RestartCosts,
    RunningInfo,
    marp_plans,
    restart_key,
    schedule,
)

GIB = 1 << 30


def stand_in(steps: int, model: str = "gpt2-medium") -> JobSpec:
    return JobSpec(argv=(), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                   torch_version="2.13.0", model=model, seq_len=1024, global_batch=16, steps=steps,
                   dtype="fp32", trainer=True, data_name="corpus.txt", stand_in=True)


def t4s(avail: list[bool]) -> PeerOffer:
    return PeerOffer("b", "B", "b:1", "3.11.9", "2.13.0",
                     tuple(OfferedGpu(f"b-{i}", i, "T4", 16 * GIB, 16 * GIB, True, a)
                           for i, a in enumerate(avail)))


def test_keys_name_the_model_and_keep_stand_ins_apart() -> None:
    s = stand_in(5)
    assert restart_key(s) == "gpt2-medium (stand-in)"
    assert restart_key(replace(s, stand_in=False)) == "gpt2-medium"
    cfg = replace(s, model=None, model_config={"model_type": "gpt2", "n_layer": 2}, stand_in=False)
    assert restart_key(cfg) == restart_key(replace(cfg, model_config={"n_layer": 2, "model_type": "gpt2"}))
    assert restart_key(cfg) != restart_key(replace(cfg, model_config={"model_type": "gpt2", "n_layer": 3}))
    assert str(restart_key(cfg)).startswith("config:")
    script = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                     torch_version="2.13.0", nproc=1, mem_per_rank=GIB)
    assert restart_key(script) is None


def test_a_models_own_measurements_replace_the_pools_part_by_part() -> None:
    costs = RestartCosts(start_s=10.0, stop_s=4.0, weight=0.5)
    assert costs.observe_start(100.0, "big")
    assert costs.start_s == pytest.approx(55.0)  # the pool's estimate moves too
    # seeded with 10, half-way to 100; its stop is the pool's (not measured for it)
    assert costs.for_model("big") == (pytest.approx(55.0), 4.0)
    assert costs.for_model("small") == (costs.start_s, costs.stop_s)
    assert costs.for_model(None) == (costs.start_s, costs.stop_s)
    costs.observe_stop(2.0, "small")
    assert costs.for_model("small") == (costs.start_s, pytest.approx(3.0))
    assert not costs.observe_start(float("inf"), "big")
    d = costs.to_dict()
    assert set(d["models"]) == {"big", "small"}
    assert d["models"]["big"]["starts_measured"] == 1
    assert d["models"]["big"]["stops_measured"] == 0
    for i in range(MAX_RESTART_MODELS + 5):
        costs.observe_start(1.0, f"m{i}")
    assert len(costs.models) == MAX_RESTART_MODELS
    assert "big" not in costs.models  # the oldest went first


def test_has_moves_a_job_whose_model_restarts_quickly_here_not_one_measured_slow() -> None:
    """The same grow (a gpt2-medium stand-in on one T4, an idle T4 beside it) with the same pool-wide
    cost of 2 s: it pays when this model's own restarts measured 1 s, not when they measured 200 s."""
    job = stand_in(20)
    offers = [t4s([False, True])]
    plan = next(p for p in marp_plans(job, offers, headroom=0.1, only_available=False)
                if (p.gpu_type, p.gpus) == ("T4", 1))
    running = [RunningInfo("long", job, replace(plan, backend="gloo"), (("b", 0),), started_s=0.0)]
    for measured, grows in ((1.0, True), (200.0, False)):
        pool = RestartCosts(start_s=1.0, stop_s=1.0, weight=1.0)
        pool.observe_start(measured, restart_key(job))
        pool.observe_start(1.0)  # the pool's figure back to 1 s: only the model's own differs
        assert pool.restart_s == 2.0
        sched = schedule([], offers, now_s=10.0, running=running, policy=FrenzyPolicy(min_run_s=2.0),
                         restart=pool)
        assert bool(sched.preempt) is grows, measured
