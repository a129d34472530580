"""What the pool measures of its jobs' step times, as a correction of MARP's predictions.

HAS prices every decision in time left: a running job's remaining steps times its step time here,
a queued job's or a move's remaining steps times the step time there.  The pool measures the first
(the trainer reports the mean of its last 10 steps); MARP predicts the others.  Telling HAS the
measured time here and the predicted time there would compare a measurement with a prediction: a
job whose prediction is far too fast (the tests' tiny model: ~1 µs predicted, ~0.1 s measured on
CPU gloo ranks) would look as much faster anywhere else and be moved every pass, and a queued job of
the same model would look nearly free next to it.  So a measurement corrects the job's every plan, the
same way (``StepFit``):

* measured above the prediction (the common case: launch, data loading, Python and communication
  overheads MARP's roofline does not see): the excess is an overhead of the job that a faster GPU
  type does not shrink.  Every plan's step gains the same seconds, so a move pays only for the part
  of the step MARP's model explains: the pool moves jobs less, never more, for what it cannot
  explain;
* measured below it: MARP was pessimistic by a factor; every plan's step shrinks by it.

A job's own fit is kept across its attempts (a preempted job waits with it); a job that has not run
yet gets its model's latest fit (a stand-in apart from its real model, as for restart costs), and a
job of a model the pool never measured keeps MARP's figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from frenzyd.marp.spec import Plan

STEP_WINDOW = 10
"""Steps the trainer's reported mean covers (``frenzyd.trainer.loop``): an attempt's measurement is
taken once it has done this many steps past the first one the coordinator saw, so the mean holds
no start-up step (CUDA initialisation, the first allocations, a checkpoint load)."""

MAX_FIT_JOBS = 4096
"""Jobs whose own fit a coordinator keeps (the oldest go first; a job that loses its own falls back
to its model's)."""

MAX_FIT_MODELS = 64
"""Models whose latest fit a coordinator keeps."""


def _rounded(x: float) -> float:
    """``x`` to 3 significant digits: a fit that moves by noise from pass to pass keeps HAS's view of
    the job (and the policy's caches keyed by it) the same object."""
    return float(f"{x:.3g}")


@dataclass(frozen=True, slots=True)
class StepFit:
    """A correction of a job's predicted step times: ``step * scale + extra_s``.  Exactly one of the
    two moves away from the identity (``scale`` < 1 with no extra, or ``scale`` = 1 with an extra)."""

    scale: float = 1.0
    extra_s: float = 0.0

    @classmethod
    def of(cls, measured_s: float | None, predicted_s: float) -> StepFit | None:
        """The fit that turns ``predicted_s`` into ``measured_s``; None when either is not a usable
        time (no measurement, no prediction, not finite, not positive)."""
        if measured_s is None or not (math.isfinite(measured_s) and math.isfinite(predicted_s)):
            return None
        if measured_s <= 0 or predicted_s <= 0:
            return None
        if measured_s >= predicted_s:
            return cls(1.0, _rounded(measured_s - predicted_s))
        return cls(_rounded(measured_s / predicted_s), 0.0)

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.extra_s == 0.0

    def step_s(self, predicted_s: float) -> float:
        """The corrected step of a plan predicted at ``predicted_s`` (0, a plan with no figure, stays 0)."""
        return predicted_s * self.scale + self.extra_s if predicted_s > 0 else predicted_s

    def predicted_s(self, step_s: float) -> float:
        """The prediction a corrected step came from (``step_s``'s inverse)."""
        return (step_s - self.extra_s) / self.scale if step_s > 0 else step_s

    def plan(self, p: Plan) -> Plan:
        if self.identity or p.step_time_s <= 0:
            return p
        return replace(p, step_time_s=self.step_s(p.step_time_s))

    def plans(self, ps: Iterable[Plan]) -> tuple[Plan, ...]:
        return tuple(self.plan(p) for p in ps)

    def to_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "extra_s": self.extra_s}


def measured_step_s(progress: dict[str, Any]) -> float | None:
    """The mean step time a trainer's progress report carries: its ETA over the steps it has left
    (the mean of its last ``STEP_WINDOW`` steps), or the last step's own seconds when none is left;
    None when the report has neither as a finite, positive number."""
    def number(key: str) -> float | None:
        raw = progress.get(key)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
            return None
        return float(raw)

    step, steps, eta = number("step"), number("steps"), number("eta_s")
    if step is not None and steps is not None and eta is not None and steps > step and eta > 0:
        return eta / (steps - step)
    last = number("step_s")
    return last if last is not None and last > 0 else None


@dataclass
class StepFits:
    """The coordinator's fits: each job's own (its latest measured attempt) and each model's latest
    (``restart_key``), which ``placement.schedule`` uses for a job without its own."""

    jobs: dict[str, StepFit] = field(default_factory=dict)
    models: dict[str, StepFit] = field(default_factory=dict)

    def observe(self, job_id: str, model: str | None, fit: StepFit) -> None:
        self.jobs.pop(job_id, None)  # re-inserted last: the dicts are kept oldest first
        self.jobs[job_id] = fit
        while len(self.jobs) > MAX_FIT_JOBS:
            del self.jobs[next(iter(self.jobs))]
        if model is not None:
            self.models.pop(model, None)
            self.models[model] = fit
            while len(self.models) > MAX_FIT_MODELS:
                del self.models[next(iter(self.models))]

    def forget(self, gone: Callable[[str], bool]) -> None:
        """Drop the fits of the jobs ``gone`` says ended (finished, cancelled, forgotten)."""
        for job_id in [j for j in self.jobs if gone(j)]:
            del self.jobs[job_id]

    def to_dict(self) -> dict[str, Any]:
        """The status view: how many jobs have their own fit, and each model's latest."""
        return {"jobs_measured": len(self.jobs),
                "models": {m: fit.to_dict() for m, fit in sorted(self.models.items())}}
