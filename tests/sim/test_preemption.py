"""The preemption cost model: what a stop costs, and that the simulator charges it to every policy."""

from __future__ import annotations

import random
import time

import pytest
from simcase import make_cluster, make_jobs

from frenzyd.has.interface import Decision, Placement, Snapshot
from frenzyd.sim.preemption import (
    CHECKFREQ_OVERHEAD,
    DEFAULT,
    FREE,
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    PreemptionModel,
)
from frenzyd.sim.simulator import simulate


def test_interval_follows_checkfreq_and_is_clamped() -> None:
    m = PreemptionModel()
    assert m.write_s(7 * 10**9) == pytest.approx(84.0)  # 12 bytes per parameter at 1 GB/s
    assert m.checkpoint_interval_s(7 * 10**9) == pytest.approx(84.0 / CHECKFREQ_OVERHEAD)
    assert m.checkpoint_interval_s(10**8) == MIN_INTERVAL_S
    assert m.checkpoint_interval_s(10**11) == MAX_INTERVAL_S
    assert PreemptionModel(interval_s=100.0).checkpoint_interval_s(10**11) == 100.0


def test_a_saved_stop_loses_the_step_in_flight_and_pays_the_write() -> None:
    lost, write = DEFAULT.stop_cost(10**9, 250.0, 7.0)
    assert lost == pytest.approx(250.0 % 7.0)
    assert write == pytest.approx(12.0)  # 12 bytes per parameter at 1 GB/s
    assert DEFAULT.stop_cost(10**9, -5.0, 7.0) == (0.0, pytest.approx(12.0))  # still restarting: no progress
    assert FREE.stop_cost(10**9, 250.0, 7.0) == (0.0, 0.0)


def test_an_unsaved_stop_loses_the_progress_since_the_last_periodic_checkpoint() -> None:
    m = PreemptionModel(save_on_stop=False, interval_s=100.0)
    assert m.stop_cost(10**9, 250.0, 7.0) == (pytest.approx(50.0), 0.0)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="write_bytes_s"):
        PreemptionModel(write_bytes_s=0)
    with pytest.raises(ValueError, match="interval_s"):
        PreemptionModel(interval_s=-1.0)


class _StopOnce:
    """Starts the job, stops it at the first round after ``stop_at_s``, starts it again at once."""

    name = "stop-once"
    round_s = 10.0
    time_driven = True

    def __init__(self, stop_at_s: float) -> None:
        self.stop_at_s = stop_at_s
        self.stopped = False

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        if snapshot.running and not self.stopped and snapshot.now_s >= self.stop_at_s:
            self.stopped = True
            run = snapshot.running[0]
            again = Placement(run.job.job_id, run.plan, run.gpus)
            return Decision(preemptions=(run.job.job_id,), placements=(again,))
        for j in snapshot.queued:
            p = j.plans[0]
            gs = [g for g in snapshot.free if g.gpu_type == p.gpu_type][: p.gpus]
            if len(gs) == p.gpus:
                return Decision(placements=(Placement(j.job_id, p, tuple(gs)),))
        return Decision()


@pytest.mark.parametrize("model", [FREE, DEFAULT, PreemptionModel(save_on_stop=False, interval_s=100.0)])
def test_the_simulator_charges_a_stop_its_write_and_lost_progress(model: PreemptionModel) -> None:
    rng = random.Random(3)
    cluster = make_cluster(rng, peers=1, max_per_peer=1)
    (job,) = make_jobs(rng, cluster, 1, span_s=0.0)
    step = job.plans[0].step_time_s
    restart = job.speed.restart_cost_s
    alone = restart + job.total_steps * step
    stop_at = restart + 250.0  # 250 s of progress, a round tick (every 10 s) falls on it
    assert alone > stop_at + 10, "the seeded job must outlast the stop, or the scenario tests nothing"
    r = simulate(_StopOnce(stop_at), [job], cluster, seed=0, clock=time.perf_counter, preemption=model)
    (o,) = r.outcomes
    stopped_after = 10.0 * -(-stop_at // 10.0)  # the first round tick (every 10 s from the arrival) past it
    lost, write = model.stop_cost(job.speed.params, stopped_after - restart, step)
    assert o.state == "completed"
    assert o.restarts == 1
    assert o.end_s - o.arrival_s == pytest.approx(alone + restart + write + lost)
