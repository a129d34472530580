"""Runs several policies over one workload side by side and assembles the ``simulate --json`` object."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from frenzyd.errors import SchedulerError
from frenzyd.has.interface import Cluster, Policy
from frenzyd.sim.jobs import limit_jct_s, limit_p99_jct_s
from frenzyd.sim.model import PolicyResult, SimJob
from frenzyd.sim.simulator import simulate


def run_policies(
    policies: Sequence[Policy],
    jobs: Sequence[SimJob],
    cluster: Cluster,
    *,
    seed: int,
    clock: Callable[[], float],
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, object], list[PolicyResult]]:
    """Simulate every policy on the same jobs and cluster; returns (JSON ``limit``+``policies``, results)."""
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise SchedulerError(f"two policies share a name ({', '.join(names)}): give each its own")
    results = []
    for p in policies:
        if progress is not None:
            progress(f"simulating {p.name} over {len(jobs)} jobs on {len(cluster.gpus)} GPUs")
        results.append(simulate(p, jobs, cluster, seed=seed, clock=clock, progress=progress))
    out: dict[str, object] = {
        "limit": {"avg_jct_s": limit_jct_s(jobs), "p99_jct_s": limit_p99_jct_s(jobs)},
        "policies": {r.name: r.summary() for r in results},
    }
    return out, results
