"""The simulator's input values: a simulated job and the outcome of one policy's run."""

from __future__ import annotations

from dataclasses import dataclass, field

from frenzyd.has.speed import JobSpeed
from frenzyd.marp.spec import Plan


@dataclass(frozen=True, slots=True)
class SimJob:
    """One LLM training job of a simulated workload.

    ``plans``: MARP's feasible plans reduced to the fastest per (type, GPU
    count), ``step_time_s`` set by the speed model for a packed placement.
    ``user_fits``: the (type, GPU count) pairs on which a plain ZeRO-3
    data-parallel plan with micro-batch 1 fits (what decides whether a
    predictor-less FIFO user runs out of memory).  ``total_steps`` optimizer
    steps of ``global_batch`` sequences of ``seq_len`` tokens.
    """

    job_id: str
    arrival_s: float
    requested_gpus: int
    model: str
    seq_len: int
    global_batch: int
    total_steps: float
    speed: JobSpeed
    plans: tuple[Plan, ...]
    user_fits: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    trace_duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one job ended under one policy: exactly one of completed / failed / unfinished."""

    job_id: str
    state: str
    """``completed``, ``failed`` (out of memory after its last resubmission) or ``unfinished``."""
    arrival_s: float
    end_s: float
    first_start_s: float | None
    restarts: int
    oom_failures: int
    gpu_types: tuple[str, ...] = ()
    """The GPU type of every placement, in order (a start, a restart after a stop, a move)."""
    lost_s: float = 0.0
    """Progress seconds lost to stops (``sim.preemption``), in all."""

    def as_json(self) -> dict[str, object]:
        """One entry of ``simulate --per-job`` / the JSON ``jobs`` list."""
        done = self.state == "completed"
        return {
            "id": self.job_id,
            "state": self.state,
            "arrival_s": self.arrival_s,
            "start_s": self.first_start_s,
            "finish_s": self.end_s if done else None,
            "jct_s": self.end_s - self.arrival_s if done else None,
            "restarts": self.restarts,
            "oom_failures": self.oom_failures,
            "gpu_types": list(dict.fromkeys(self.gpu_types)),
            "lost_s": self.lost_s,
        }


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """One policy's run over a workload: per-job outcomes plus the aggregate figures of DESIGN.md §6."""

    name: str
    outcomes: tuple[JobOutcome, ...]
    busy_gpu_s: float
    total_gpus: int
    decision_s: tuple[float, ...]
    solver_timeouts: int

    def summary(self) -> dict[str, object]:
        """The ``policies[NAME]`` object of ``frenzy-client simulate --json``."""
        done = [o for o in self.outcomes if o.state == "completed"]
        jcts = sorted(o.end_s - o.arrival_s for o in done)
        queues = [o.first_start_s - o.arrival_s for o in done if o.first_start_s is not None]
        first = min((o.arrival_s for o in self.outcomes), default=0.0)
        last = max((o.end_s for o in self.outcomes if o.state != "unfinished"), default=first)
        makespan = max(0.0, last - first)
        ms = sorted(d * 1e3 for d in self.decision_s)
        return {
            "avg_jct_s": _mean(jcts),
            "p50_jct_s": percentile(jcts, 50),
            "p99_jct_s": percentile(jcts, 99),
            "avg_queue_s": _mean(queues),
            "makespan_s": makespan,
            "utilization": self.busy_gpu_s / (self.total_gpus * makespan) if makespan > 0 else 0.0,
            "jobs_completed": len(done),
            "failed": sum(1 for o in self.outcomes if o.state != "completed"),
            "oom_failures": sum(o.oom_failures for o in self.outcomes),
            "restarts": sum(o.restarts for o in self.outcomes),
            "solver_timeouts": self.solver_timeouts,
            "decision_ms": {
                "median": percentile(ms, 50),
                "p95": percentile(ms, 95),
                "max": ms[-1] if ms else 0.0,
            },
        }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def percentile(sorted_xs: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an ascending list; 0.0 when empty."""
    if not sorted_xs:
        return 0.0
    pos = (len(sorted_xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)
