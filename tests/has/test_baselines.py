"""Sia's ILP and Gavel's LP on small hand-solved cases; Sia's configuration set; the policy registry."""

from __future__ import annotations

import random
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from simcase import make_cluster, make_jobs

from frenzyd.errors import SchedulerError
from frenzyd.has.gavel import max_min_allocation
from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, JobView, Snapshot
from frenzyd.has.registry import load_policy
from frenzyd.has.sia import Config, SiaPolicy, configurations
from frenzyd.has.speed import JobSpeed
from frenzyd.marp.spec import Plan
from frenzyd.sim.run import run_policies

GIB = 1 << 30


def _cluster(a100: int) -> Cluster:
    gpus = [Gpu("a", i, "A100-80GB") for i in range(a100)] + [Gpu("b", i, "T4") for i in range(2)]
    return Cluster(
        types=(GpuTypeSpec("A100-80GB", 80 * GIB, 2.55), GpuTypeSpec("T4", 16 * GIB, 0.35)),
        gpus=tuple(sorted(gpus)),
    )


def _job(jid: str, types: tuple[str, ...]) -> JobView:
    plans = tuple(Plan(t, 1, 1, 1, 1, 0, 1, 1, 10 * GIB, 16 * GIB, 1.0) for t in types)
    return JobView(jid, 0.0, 1, plans, JobSpeed(10**9, 1e15), 100.0, 100.0)


@pytest.mark.parametrize(
    ("a100", "expected"),
    [
        # G rows normalised: job1 A100 = 2.55/0.35 = 7.29 -> 7.29^-0.5 = 0.37, T4 = 1; job2 A100 = 1.
        # Minimise sum(A - 1.1): two A100s -> both on A100 (-0.73 - 0.1 = -0.83, best).
        (2, {"j1": "A100-80GB", "j2": "A100-80GB"}),
        # One A100: j1 A100 + j2 unallocated = -0.73 beats j1 T4 + j2 A100 = -0.1 - 0.1 = -0.2.
        (1, {"j1": "A100-80GB"}),
    ],
)
def test_sia_ilp_returns_the_hand_solved_optimum(a100: int, expected: dict[str, str]) -> None:
    cluster = _cluster(a100)
    snap = Snapshot(
        10.0,
        "round",
        cluster,
        cluster.gpus,
        (_job("j1", ("A100-80GB", "T4")), _job("j2", ("A100-80GB",))),
        (),
    )
    d = SiaPolicy().decide(snap, random.Random(0))
    assert {p.job_id: p.plan.gpu_type for p in d.placements} == expected
    assert d.solver_timeouts == 0


def test_sia_configurations_are_powers_of_two_in_a_node_plus_whole_nodes() -> None:
    gpus = [Gpu(f"n{k}", i, "V100-32GB") for k in range(3) for i in range(8)]
    gpus += [Gpu("t", i, "T4") for i in range(2)]
    cluster = Cluster(
        types=(GpuTypeSpec("T4", 16 * GIB, 0.35), GpuTypeSpec("V100-32GB", 32 * GIB, 1.0)),
        gpus=tuple(sorted(gpus)),
    )
    assert configurations(cluster) == [
        Config("T4", 1, 1),
        Config("T4", 1, 2),
        Config("V100-32GB", 1, 1),
        Config("V100-32GB", 1, 2),
        Config("V100-32GB", 1, 4),
        Config("V100-32GB", 1, 8),
        Config("V100-32GB", 2, 16),
        Config("V100-32GB", 3, 24),
    ]


def test_sia_counts_solver_time_limit_hits() -> None:
    rng = random.Random(3)
    cluster = make_cluster(rng, peers=6)
    jobs = make_jobs(rng, cluster, 40)
    from simcase import random_snapshot

    snap = random_snapshot(rng, cluster, jobs)
    d = SiaPolicy(time_limit_s=1e-6).decide(snap, random.Random(0))
    assert d.solver_timeouts == 1


def test_gavel_max_min_shares_one_gpu_equally() -> None:
    x = max_min_allocation(np.array([[1.0], [1.0]]), np.array([[1.0], [1.0]]), np.array([1.0]))
    assert x[:, 0] == pytest.approx([0.5, 0.5], abs=1e-6)


def test_gavel_max_min_level_matches_the_hand_solution() -> None:
    # Equal-share throughputs: job 0 (1 + 4)/2 = 2.5, job 1 (1 + 1.2)/2 = 1.1.  Giving job 0 a
    # fraction b of type 1 and 1 - b of type 0 (job 1 the rest) equalises 0.4 + 1.2b = 1.0909 - 0.1818b
    # at b = 0.5: both reach normalised throughput 1.0 (all on one type each would leave job 1 at 0.91).
    thr = np.array([[1.0, 4.0], [1.0, 1.2]])
    x = max_min_allocation(thr, np.ones((2, 2)), np.array([1.0, 1.0]))
    levels = (thr * x).sum(axis=1) / np.array([2.5, 1.1])
    assert levels == pytest.approx([1.0, 1.0], abs=1e-4)
    assert (x.sum(axis=1) <= 1 + 1e-6).all()
    assert (x.sum(axis=0) <= 1 + 1e-6).all()


def test_outside_policy_loads_by_module_attr_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_policy.py").write_text(
        textwrap.dedent(
            """
            from frenzyd.has.fifo import FifoPolicy

            class Mine(FifoPolicy):
                name = "mine"

            class Anonymous:
                def __init__(self):
                    self.inner = FifoPolicy()
                def decide(self, snapshot, rng):
                    return self.inner.decide(snapshot, rng)

            instance = Mine()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = random.Random(1)
    cluster = make_cluster(rng, peers=3)
    jobs = make_jobs(rng, cluster, 8)
    policies = [load_policy("my_policy:Mine"), load_policy("my_policy:Anonymous")]
    assert [p.name for p in policies] == ["mine", "my_policy:Anonymous"]
    body, results = run_policies(policies, jobs, cluster, seed=0, clock=time.perf_counter)
    assert set(body["policies"]) == {"mine", "my_policy:Anonymous"}  # type: ignore[arg-type]
    assert all(len(r.outcomes) == 8 for r in results)


@pytest.mark.parametrize("spec", ["nope", "no_such_module_xyz:P", "random:no_such_attr", "random:Random"])
def test_bad_policy_names_raise_scheduler_error(spec: str) -> None:
    with pytest.raises(SchedulerError):
        load_policy(spec)
