"""What the coordinator tells HAS of a running attempt's progress: a trainer attempt is starting (not
to be stopped or moved) until its submitter reports its first step, and counts from that step."""

from __future__ import annotations

import math
from typing import Any

from frenzyd.jobs import coordinator as coordinator_mod
from frenzyd.jobs.context import ClusterView, RoleContext
from frenzyd.jobs.coordinator import CoordinatorRole
from frenzyd.jobs.lifecycle import BeginAttempt, Cancel, Placed, step
from frenzyd.jobs.model import JobPlan, JobRecord, JobSpec, RankAssignment, new_record
from frenzyd.jobs.placement import restart_key
from frenzyd.jobs.step_fit import STEP_WINDOW, StepFit

SPEC = JobSpec(argv=(), payload_sha256="ab" * 32, payload_size=10, python_version="3.11.7",
               torch_version="2.13.0", model="gpt2", seq_len=128, global_batch=8, steps=100, trainer=True,
               data_name="corpus.txt")
PLAN = JobPlan("A100-80GB", gpus=1, dp=1, tp=1, pp=1, zero=0, bytes_per_gpu=1, source="marp")


def running(c: CoordinatorRole) -> JobRecord:
    """Job ``j`` queued in ``c``'s table, then running its attempt 1 on one GPU."""
    queued = c.table.submit(new_record("j", SPEC, "sub", "sub", 0.0))
    rec = step(step(queued, BeginAttempt(), now=1.0),
               Placed(1, (RankAssignment(0, "p", "n", "G0", 0, 0),), term=1, plan=PLAN), now=2.0)
    c.table.update(rec)
    return rec


def view(progress: dict[str, Any] | None) -> ClusterView:
    jobs = [{"id": "j", "progress": progress}] if progress is not None else []
    return ClusterView(coordinator="me", term=1, peers={"sub": {"jobs": jobs}})


def role(clock: list[float]) -> CoordinatorRole:
    async def send(peer: str, msg: Any, timeout_s: float) -> dict[str, Any]:
        raise AssertionError("nothing is sent here")

    ctx = RoleContext("me", "me", send=send, send_order=send, view=lambda: view(None),
                      spawn=lambda coro, name: coro.close(), wake=lambda: None, clock=lambda: clock[0])
    return CoordinatorRole(ctx)


def test_a_trainer_attempt_is_starting_until_its_first_step_then_counts_from_it() -> None:
    clock = [10.0]
    c = role(clock)
    rec = running(c)
    c._start_began[(rec.id, rec.attempt)] = 5.0  # as _start records a trainer attempt's placement
    assert c._running_info(view(None), rec).ready_s == math.inf  # no step yet: leave it to start
    clock[0] = 30.0
    c._measure_starts(view({"attempt": 1, "step": 1}), clock[0])  # the submitter reports step 1
    clock[0] = 90.0
    info = c._running_info(view({"attempt": 1, "step": 40}), rec)
    assert info.ready_s == 30.0
    assert info.done_steps == 40
    assert c.restart.starts == 1  # the same report measured the start (25 s)


def test_a_start_that_hangs_counts_as_running_after_the_patience() -> None:
    clock = [10.0]
    c = role(clock)
    rec = running(c)
    c._start_began[(rec.id, rec.attempt)] = 10.0
    clock[0] = 10.0 + coordinator_mod.START_PATIENCE_S + 1.0
    assert c._running_info(view(None), rec).ready_s is None  # HAS counts from its start: may stop it


def test_an_attempt_started_before_this_term_counts_from_its_start() -> None:
    c = role([10.0])
    rec = running(c)
    assert c._running_info(view({"attempt": 1, "step": 3}), rec).ready_s is None


def test_a_start_ends_when_the_first_step_begins_not_when_its_report_comes() -> None:
    """The submitter reports step 1 once it has ended: a model with 15 s steps must not measure every
    start 15 s longer (HAS would be told moves cost that much more than they do)."""
    clock = [10.0]
    c = role(clock)
    c.restart.weight = 1.0  # the estimate is the last measurement
    rec = running(c)
    c._start_began[(rec.id, rec.attempt)] = 5.0
    clock[0] = 30.0
    c._measure_starts(view({"attempt": 1, "step": 1, "step_s": 15.0}), clock[0])
    assert c.restart.start_s == 10.0  # placed at 5, first step from 15 to 30
    assert c._running_info(view({"attempt": 1, "step": 1}), rec).ready_s == 15.0


def test_a_step_time_that_is_not_a_sane_number_is_ignored_or_bounded() -> None:
    for raw, start in (("15", 25.0), (float("nan"), 25.0), (True, 25.0), (-3.0, 25.0), (1e9, 0.0)):
        clock = [10.0]
        c = role(clock)
        c.restart.weight = 1.0
        rec = running(c)
        c._start_began[(rec.id, rec.attempt)] = 5.0
        clock[0] = 30.0
        c._measure_starts(view({"attempt": 1, "step": 1, "step_s": raw}), clock[0])
        assert c.restart.start_s == start, raw


def test_the_measured_step_is_the_trainers_mean_once_it_holds_only_this_attempts_steps() -> None:
    """HAS is told the attempt's measured step (the trainer's mean of its last ``STEP_WINDOW`` steps:
    its ETA over the steps left) only once that window holds no step before the first one seen here
    (a start-up step, a checkpoint load); a report of another attempt measures nothing."""
    c = role([10.0])
    rec = running(c)
    first = {"attempt": 1, "step": 40, "steps": 100, "eta_s": 600.0, "step_s": 9.0}
    assert c._running_info(view(first), rec).step_s is None  # first seen at step 40
    early = {**first, "step": 40 + STEP_WINDOW - 1}
    assert c._running_info(view(early), rec).step_s is None
    later = {**first, "step": 40 + STEP_WINDOW, "eta_s": 250.0}
    assert c._running_info(view(later), rec).step_s == 250.0 / (100 - 40 - STEP_WINDOW)
    done = {**later, "step": 100, "eta_s": 0.0}
    assert c._running_info(view(done), rec).step_s == 9.0  # nothing left: the last step's own time
    assert c._running_info(view({**later, "attempt": 2}), rec).step_s is None
    assert c._running_info(view({**later, "eta_s": float("nan"), "step_s": "9"}), rec).step_s is None


def test_a_fit_the_pass_measured_prices_the_job_and_new_jobs_of_its_model_and_ends_with_the_job() -> None:
    c = role([10.0])
    rec = running(c)
    fit = StepFit(1.0, 0.5)
    c.fits.observe(rec.id, restart_key(rec.spec), fit)
    assert c._running_info(view(None), rec).fit == fit  # its own, between attempts too
    assert c.fits.models == {restart_key(SPEC): fit}  # for new jobs of its model (placement.schedule)
    assert c.restart_costs()["step_fits"] == {"jobs_measured": 1, "models": {"gpt2": fit.to_dict()}}
    c.table.update(step(rec, Cancel(), now=20.0))
    c.fits.forget(c._gone)
    assert c.fits.jobs == {}
    assert c.fits.models == {"gpt2": fit}  # the model's figure outlives the job
