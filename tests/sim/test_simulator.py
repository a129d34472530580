"""Simulator conservation and accounting, on random workloads under every built-in policy."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simcase import make_cluster, make_jobs

from frenzyd.errors import SchedulerError
from frenzyd.has.interface import Decision, Placement, Snapshot
from frenzyd.has.registry import BUILTIN, load_policy
from frenzyd.has.speed import JobSpeed
from frenzyd.marp.spec import Plan
from frenzyd.sim.jobs import limit_jct_s, limit_p99_jct_s
from frenzyd.sim.model import SimJob
from frenzyd.sim.simulator import MAX_OOM_RESUBMITS, plan_fits, plan_key, simulate


@pytest.mark.parametrize("name", sorted(BUILTIN))
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n_jobs=st.integers(1, 20))
def test_every_job_ends_exactly_once(name: str, seed: int, n_jobs: int) -> None:
    rng = random.Random(seed)
    cluster = make_cluster(rng, peers=rng.randint(1, 5))
    jobs = make_jobs(rng, cluster, n_jobs)
    r = simulate(load_policy(name), jobs, cluster, seed=seed, clock=time.perf_counter)
    ids = [o.job_id for o in r.outcomes]
    assert sorted(ids) == sorted(j.job_id for j in jobs)
    assert all(o.state in ("completed", "failed", "unfinished") for o in r.outcomes)
    for o in r.outcomes:
        assert o.end_s >= o.arrival_s
        if o.state == "completed":
            assert o.first_start_s is not None
            assert o.first_start_s >= o.arrival_s
    s = r.summary()
    assert s["jobs_completed"] + s["failed"] == n_jobs  # type: ignore[operator]
    assert 0.0 <= s["utilization"] <= 1.0 + 1e-9  # type: ignore[operator]
    # No job finishes faster than alone on its fastest plan.
    by_id = {j.job_id: j for j in jobs}
    for o in r.outcomes:
        if o.state == "completed":
            assert o.end_s - o.arrival_s >= limit_jct_s([by_id[o.job_id]]) * (1 - 1e-9)
    # ... so when every job completes, the p99 is no lower than the limit's (the benchmark's p99 floor).
    if s["jobs_completed"] == n_jobs:
        assert s["p99_jct_s"] >= limit_p99_jct_s(jobs) * (1 - 1e-9)  # type: ignore[operator]


class _Greedy:
    """Places each queued job on its first plan, GPUs taken blindly (tests the simulator checks)."""

    name = "greedy"
    round_s = None

    def __init__(self, steal: bool = False) -> None:
        self.steal = steal

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        pool = list(snapshot.cluster.gpus if self.steal else snapshot.free)
        out = []
        for j in snapshot.queued:
            p = j.plans[0]
            gs = [g for g in pool if g.gpu_type == p.gpu_type][: p.gpus]
            if len(gs) == p.gpus:
                out.append(Placement(j.job_id, p, tuple(gs)))
                if not self.steal:
                    pool = [g for g in pool if g not in gs]
        return Decision(placements=tuple(out))


def test_simulator_rejects_a_gpu_given_twice() -> None:
    rng = random.Random(5)
    cluster = make_cluster(rng, peers=1, max_per_peer=1)
    jobs = make_jobs(rng, cluster, 3, span_s=0.0)
    with pytest.raises(SchedulerError, match="not free"):
        simulate(_Greedy(steal=True), jobs, cluster, seed=0, clock=time.perf_counter)


def test_a_job_alone_takes_restart_plus_steps_times_step_time() -> None:
    rng = random.Random(2)
    cluster = make_cluster(rng, peers=1, max_per_peer=1)
    (job,) = make_jobs(rng, cluster, 1)
    r = simulate(_Greedy(), [job], cluster, seed=0, clock=time.perf_counter)
    (o,) = r.outcomes
    expected = job.speed.restart_cost_s + job.total_steps * job.plans[0].step_time_s
    assert o.end_s - o.arrival_s == pytest.approx(expected)
    assert r.busy_gpu_s == pytest.approx(expected * job.plans[0].gpus)


def test_out_of_memory_user_plans_fail_and_are_resubmitted_with_twice_the_gpus() -> None:
    rng = random.Random(4)
    cluster = make_cluster(rng, peers=1, max_per_peer=4)
    t = cluster.gpus[0].gpu_type
    speed = JobSpeed(10**9, 1e15)
    fits = Plan(t, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1.0)
    never = SimJob("never", 0.0, 1, "m", 1024, 8, 10.0, speed, (fits,), user_fits=frozenset())
    r = simulate(load_policy("fifo"), [never], cluster, seed=0, clock=time.perf_counter)
    (o,) = r.outcomes
    assert o.state == "failed"
    assert o.oom_failures == MAX_OOM_RESUBMITS + 1
    later = SimJob("later", 0.0, 1, "m", 1024, 8, 10.0, speed, (fits,), user_fits=frozenset({(t, 2)}))
    r = simulate(load_policy("fifo"), [later], cluster, seed=0, clock=time.perf_counter)
    (o,) = r.outcomes
    assert (o.state, o.oom_failures) == ("completed", 1)
    assert o.end_s - o.arrival_s > 2 * speed.restart_cost_s  # one failed start, then a real one


def test_plan_key_tells_apart_plans_that_differ_only_in_gradient_accumulation() -> None:
    """grad_accum changes the step time (bubble, all-reduce overlap) and the activations in flight."""
    a = Plan("T4", 2, 2, 1, 1, 3, 1, 4, 1, 1, 1.0)
    b = replace(a, grad_accum=8)
    assert plan_key(a) != plan_key(b)
    assert plan_key(a) == plan_key(replace(a, bytes_per_gpu=7, step_time_s=3.0))  # derived fields only
    job = SimJob("j", 0.0, 2, "m", 1024, 8, 10.0, JobSpeed(10**9, 1e15), (a,))
    assert plan_fits(job, a)
    assert not plan_fits(job, b)  # not a MARP plan of the job, and no user plan of it fits
