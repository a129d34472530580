"""Invariants every built-in policy keeps on random clusters and queues (hypothesis)."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simcase import make_cluster, make_jobs, random_snapshot

from frenzyd.has import frenzy, frenzy_rules
from frenzyd.has.frenzy import FrenzyPolicy
from frenzyd.has.interface import Decision, RunningJob, Snapshot, peers_of, tp_inside_peers
from frenzyd.has.registry import BUILTIN, load_policy
from frenzyd.sim.simulator import simulate

POLICIES = sorted(BUILTIN)
MEMORY_AWARE = ["frenzy", "sia", "gavel", "tiresias", "srtf"]


def check_valid(snap: Snapshot, d: Decision) -> None:
    running = {r.job.job_id: r for r in snap.running}
    queued = {j.job_id: j for j in snap.queued}
    available = set(snap.free)
    for jid in d.preemptions:
        assert jid in running, f"preempted {jid} is not running"
        available.update(running[jid].gpus)
    seen = set()
    for p in d.placements:
        assert p.job_id in queued or p.job_id in running
        if p.job_id in running and p.job_id not in d.preemptions:
            available.update(running[p.job_id].gpus)  # an implicit move frees its own GPUs
        assert len(p.gpus) == p.plan.gpus
        assert all(g.gpu_type == p.plan.gpu_type for g in p.gpus)
        assert tp_inside_peers(p.plan, p.gpus)
        for g in p.gpus:
            assert g not in seen, f"GPU {g} given twice"
            assert g in available, f"GPU {g} is not free"
            seen.add(g)


seeds = st.integers(min_value=0, max_value=2**31 - 1)


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=seeds, n_jobs=st.integers(1, 25), peers=st.integers(1, 6))
def test_decisions_are_valid_and_deterministic(name: str, seed: int, n_jobs: int, peers: int) -> None:
    rng = random.Random(seed)
    cluster = make_cluster(rng, peers=peers)
    jobs = make_jobs(rng, cluster, n_jobs)
    snap = random_snapshot(rng, cluster, jobs)
    for reason in ("arrival", "round"):
        s = Snapshot(snap.now_s, reason, snap.cluster, snap.free, snap.queued, snap.running)  # type: ignore[arg-type]
        d1 = load_policy(name).decide(s, random.Random(7))
        d2 = load_policy(name).decide(s, random.Random(7))
        assert d1 == d2, "same input must give the same decision"
        check_valid(s, d1)


@pytest.mark.parametrize("name", MEMORY_AWARE)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=seeds, n_jobs=st.integers(1, 25), peers=st.integers(1, 6))
def test_memory_aware_policies_only_place_fitting_plans(
    name: str, seed: int, n_jobs: int, peers: int
) -> None:
    rng = random.Random(seed)
    cluster = make_cluster(rng, peers=peers)
    jobs = make_jobs(rng, cluster, n_jobs)
    snap = random_snapshot(rng, cluster, jobs)
    by_id = {j.job_id: j for j in snap.queued} | {r.job.job_id: r.job for r in snap.running}
    memory = {t.name: t.memory_bytes for t in cluster.types}
    d = load_policy(name).decide(snap, random.Random(0))
    for p in d.placements:
        assert p.plan in by_id[p.job_id].plans, "a memory-aware policy placed a plan MARP did not offer"
        assert p.plan.bytes_per_gpu <= memory[p.gpus[0].gpu_type]


@pytest.mark.parametrize("name", MEMORY_AWARE)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=seeds, n_jobs=st.integers(1, 15), peers=st.integers(1, 4))
def test_every_job_that_fits_is_eventually_placed(name: str, seed: int, n_jobs: int, peers: int) -> None:
    rng = random.Random(seed)
    cluster = make_cluster(rng, peers=peers)
    jobs = make_jobs(rng, cluster, n_jobs)
    result = simulate(load_policy(name), jobs, cluster, seed=seed, clock=time.perf_counter)
    states = {o.job_id: o.state for o in result.outcomes}
    assert set(states.values()) == {"completed"}, states


def test_frenzy_keeps_big_memory_gpus_for_jobs_that_need_them() -> None:
    """A small job that fits a T4 almost as well is not put on the 80 GB GPU the big job needs."""
    from simcase import view

    from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec
    from frenzyd.has.speed import JobSpeed
    from frenzyd.marp.spec import Plan
    from frenzyd.sim.model import SimJob

    cluster = Cluster(
        types=(GpuTypeSpec("A100-80GB", 80 << 30, 2.55), GpuTypeSpec("RTX-A6000", 48 << 30, 2.4)),
        gpus=(Gpu("a", 0, "A100-80GB"), Gpu("b", 0, "RTX-A6000")),
    )
    speed = JobSpeed(1_000_000_000, 1e15)
    small_plans = (
        Plan("A100-80GB", 1, 1, 1, 1, 0, 1, 1, 20 << 30, 80 << 30, 10.0),
        Plan("RTX-A6000", 1, 1, 1, 1, 0, 1, 1, 20 << 30, 48 << 30, 10.6),
    )
    big_plans = (Plan("A100-80GB", 1, 1, 1, 1, 0, 1, 1, 70 << 30, 80 << 30, 10.0),)
    small = SimJob("small", 0.0, 1, "m", 1024, 1, 10.0, speed, small_plans)
    big = SimJob("big", 1.0, 1, "m", 1024, 1, 1000.0, speed, big_plans)
    snap = Snapshot(2.0, "arrival", cluster, cluster.gpus, (view(small), view(big)), ())
    d = load_policy("frenzy").decide(snap, random.Random(0))
    where = {p.job_id: p.plan.gpu_type for p in d.placements}
    assert where == {"small": "RTX-A6000", "big": "A100-80GB"}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=seeds, n_jobs=st.integers(1, 25), peers=st.integers(1, 6))
def test_frenzy_uses_the_reported_step_time_of_running_jobs(seed: int, n_jobs: int, peers: int) -> None:
    """A running job's reported step time replaces the speed model's: equal figures, equal decisions."""
    rng = random.Random(seed)
    cluster = make_cluster(rng, peers=peers)
    jobs = make_jobs(rng, cluster, n_jobs)
    snap = random_snapshot(rng, cluster, jobs)
    speed = {t.name: t.speed for t in cluster.types}

    def modelled(r: RunningJob) -> float:
        return r.job.speed.step_time_s(r.plan, speed[r.plan.gpu_type], len({g.peer for g in r.gpus}))

    reported = tuple(dataclasses.replace(r, step_time_s=modelled(r)) for r in snap.running)
    with_steps = dataclasses.replace(snap, running=reported)
    assert load_policy("frenzy").decide(snap, random.Random(0)) == load_policy("frenzy").decide(
        with_steps, random.Random(0)
    )
    policy = FrenzyPolicy()
    for r in snap.running:  # the reported figure, not the model, when the pool has one
        assert policy._placed_step_s(dataclasses.replace(r, step_time_s=7.5), speed) == 7.5
        assert policy._placed_step_s(r, speed) == modelled(r)


def d_type(d: Decision, job_id: str) -> str:
    """The GPU type ``d`` places ``job_id`` on."""
    return next(p.plan.gpu_type for p in d.placements if p.job_id == job_id)


def test_frenzy_decisions_stay_valid_when_the_queue_starves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three hours later every queued job is past STARVATION_S: reservations and starvation moves run.

    Seeded sweep rather than hypothesis: the move needs a holder that fits idle GPUs of another type,
    which few random snapshots have; the sweep is checked to contain such moves.  The upgrade onto
    faster free GPUs is off here, so the moves counted are starvation moves.
    """
    monkeypatch.setattr(frenzy_rules, "UPGRADE_TRIES", 0)
    moves = 0
    for seed in range(300):
        rng = random.Random(seed)
        cluster = make_cluster(rng, peers=rng.randint(1, 6))
        snap = random_snapshot(rng, cluster, make_jobs(rng, cluster, rng.randint(1, 25)))
        late = dataclasses.replace(snap, now_s=snap.now_s + 3 * 3600.0)
        d = FrenzyPolicy().decide(late, random.Random(7))
        check_valid(late, d)
        assert d == FrenzyPolicy().decide(late, random.Random(7))
        # A starvation move: a running job goes to another type and a queued job gets its old GPUs.
        running = {r.job.job_id: r for r in late.running}
        queued = {j.job_id for j in late.queued}
        moved = [p.job_id for p in d.placements if p.job_id in running]
        given_up = {g for jid in moved for g in running[jid].gpus if g.gpu_type != d_type(d, jid)}
        moves += any(p.job_id in queued and set(p.gpus) & given_up for p in d.placements)
    assert moves > 0, "the sweep no longer exercises a starvation move"


def test_frenzy_moves_a_running_job_to_a_faster_type_only_when_the_sum_of_completions_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every running job the upgrade moves goes to a faster type and passes ``2·(m' + restart) < m``.

    Each snapshot is the moment the jobs on the fastest type complete (their GPUs come free).
    Growth and the starvation move are off, so a running job placed on another type is an upgrade.
    Seeded sweep: such moves need a job on slow GPUs that is shorter than every waiting job that can
    use the freed type, which few random snapshots have; the sweep is checked to contain some.
    """
    monkeypatch.setattr(frenzy_rules, "GROW_TRIES", 0)
    monkeypatch.setattr(frenzy_rules, "STARVATION_S", float("inf"))
    upgrades = 0
    for seed in range(2000):
        rng = random.Random(seed)
        cluster = make_cluster(rng, peers=rng.randint(1, 6))
        snap = random_snapshot(rng, cluster, make_jobs(rng, cluster, rng.randint(1, 25)))
        speeds = {t.name: t.speed for t in cluster.types}
        done = [r for r in snap.running if speeds[r.plan.gpu_type] == max(speeds.values())]
        snap = dataclasses.replace(
            snap,
            now_s=snap.now_s + 600.0,
            reason="completion",
            free=tuple(sorted({*snap.free, *(g for r in done for g in r.gpus)})),
            running=tuple(r for r in snap.running if r not in done),
        )
        d = FrenzyPolicy().decide(snap, random.Random(7))
        check_valid(snap, d)
        running = {r.job.job_id: r for r in snap.running}
        for p in d.placements:
            r = running.get(p.job_id)
            if r is None or p.plan.gpu_type == r.plan.gpu_type:
                continue
            new, old = p.plan.gpu_type, r.plan.gpu_type
            assert speeds[new] > speeds[old]
            step = r.step_time_s or r.job.speed.step_time_s(r.plan, speeds[old], peers_of(r.gpus))
            m = r.job.remaining_steps * step
            m_new = r.job.remaining_steps * r.job.speed.step_time_s(p.plan, speeds[new], peers_of(p.gpus))
            assert 2 * (m_new + r.job.restart_cost_s) < m
            assert snap.now_s - r.started_s >= frenzy.SHRINK_MIN_RUN_S
            upgrades += 1
    assert upgrades > 0, "the sweep no longer exercises an upgrade"
