"""How a measured step corrects MARP's predicted ones (``frenzyd.jobs.step_fit``)."""

from __future__ import annotations

import math

import pytest

from frenzyd.jobs.step_fit import MAX_FIT_JOBS, MAX_FIT_MODELS, StepFit, StepFits, measured_step_s
from frenzyd.marp.spec import Plan


def plan(step_s: float) -> Plan:
    return Plan(gpu_type="T4", gpus=1, dp=1, tp=1, pp=1, zero=0, micro_batch=1, grad_accum=1,
                bytes_per_gpu=1, gpu_memory_bytes=16 << 30, step_time_s=step_s)


def test_a_step_slower_than_predicted_adds_the_excess_and_a_faster_one_scales() -> None:
    slow = StepFit.of(0.3, 0.1)
    assert slow == StepFit(1.0, 0.2)
    assert slow.step_s(0.05) == pytest.approx(0.25)  # a GPU twice as fast saves MARP's part only
    fast = StepFit.of(0.05, 0.1)
    assert fast == StepFit(0.5, 0.0)
    assert fast.step_s(0.04) == pytest.approx(0.02)
    for fit, step in ((slow, 0.05), (fast, 0.04)):
        assert fit.predicted_s(fit.step_s(step)) == pytest.approx(step, rel=1e-12)
    assert StepFit.of(0.1, 0.1) == StepFit()  # measured as predicted: no correction
    assert StepFit().identity
    assert not slow.identity


def test_fits_are_rounded_so_noise_keeps_the_same_view() -> None:
    assert StepFit.of(0.123456, 0.01) == StepFit.of(0.123457, 0.01) == StepFit(1.0, 0.113)


@pytest.mark.parametrize(("measured", "predicted"), [(None, 0.1), (0.0, 0.1), (-1.0, 0.1), (0.1, 0.0),
                                                 (math.nan, 0.1), (math.inf, 0.1), (0.1, math.inf)])
def test_no_fit_from_a_time_that_is_not_one(measured: float | None, predicted: float) -> None:
    assert StepFit.of(measured, predicted) is None


def test_a_plan_without_a_step_figure_is_left_as_it_is() -> None:
    fit = StepFit(1.0, 0.2)
    assert fit.plan(plan(0.0)).step_time_s == 0.0
    assert fit.plan(plan(0.1)).step_time_s == pytest.approx(0.3)
    assert fit.plans([plan(0.1), plan(0.0)])[1].step_time_s == 0.0
    same = plan(0.1)
    assert StepFit().plan(same) is same


def test_the_measured_step_is_the_eta_over_the_steps_left_else_the_last_step() -> None:
    assert measured_step_s({"step": 10, "steps": 20, "eta_s": 5.0, "step_s": 9.0}) == 0.5
    assert measured_step_s({"step": 20, "steps": 20, "eta_s": 0.0, "step_s": 9.0}) == 9.0
    assert measured_step_s({"step_s": 2}) == 2.0
    for bad in ({}, {"step_s": True}, {"step_s": "1"}, {"step_s": -1.0}, {"step_s": math.nan},
                {"step": 10, "steps": 20, "eta_s": math.inf}):
        assert measured_step_s(bad) is None, bad


def test_a_job_keeps_its_own_fit_its_model_the_latest_and_both_are_bounded() -> None:
    fits = StepFits()
    a, b = StepFit(1.0, 0.1), StepFit(0.5, 0.0)
    fits.observe("j1", "gpt2", a)
    fits.observe("j2", "gpt2", b)
    fits.observe("j3", None, b)  # no model: the job's own only
    assert fits.jobs == {"j1": a, "j2": b, "j3": b}
    assert fits.models == {"gpt2": b}  # the model's latest
    fits.forget(lambda j: j in ("j1", "j3"))
    assert set(fits.jobs) == {"j2"}
    for i in range(MAX_FIT_JOBS + 3):
        fits.observe(f"x{i}", f"m{i % (MAX_FIT_MODELS + 2)}", a)
    assert len(fits.jobs) == MAX_FIT_JOBS
    assert "j2" not in fits.jobs
    assert len(fits.models) == MAX_FIT_MODELS
    assert fits.to_dict()["jobs_measured"] == MAX_FIT_JOBS
