"""The trace and real-run entry points: send each setup to the one-process or the data-parallel run.

A setup with dp > 1 or a ZeRO stage runs as ``dp`` ranks
(``frenzyd.marp.trace.dist``), any other in this process
(``frenzyd.marp.trace.step``).  The distributed module is imported only when a
distributed setup is run: it brings sockets and subprocesses, which importing
``frenzyd.marp.trace`` must not (tests/test_core_purity.py), and its rank
subprocesses (``python -m frenzyd.marp.trace.dist``) must not find it imported
already.  Neither module imports this one.
"""

from __future__ import annotations

from frenzyd.errors import ConfigError
from frenzyd.marp.spec import Prediction, TrainingSetup
from frenzyd.marp.trace.step import (
    Measurement,
    ModelLike,
    measure_real_single,
    runs_distributed,
    trace_measurement_single,
    validate_setup,
)

__all__ = ["measure_real", "predict_trace", "trace_measurement"]


def measure_real(
    model: ModelLike,
    setup: TrainingSetup,
    *,
    threads: int = 1,
    seed: int = 0,
    sdpa_backend: str | None = None,
) -> Measurement:
    """Ground truth: run the reference step with real tensors on the CPU and measure its tensor peak.

    Runs ``STEPS`` optimizer steps and reports the last (steady state) under
    torch's ``MemTracker``.  ``setup.dp > 1`` runs ``dp`` real gloo ranks in
    subprocesses (DDP, ZeRO-1, FSDP2 for ZeRO-2/3) and reports the worst rank.
    ``sdpa_backend`` forces the attention kernel (one process only).
    Raises ``ConfigError``/``PlanError`` for setups it cannot run and
    ``TraceError`` when torch fails (e.g. out of host memory).
    """
    validate_setup(setup)
    if runs_distributed(setup):
        if sdpa_backend is not None:
            raise ConfigError("sdpa_backend can be forced only for one-process runs (dp = 1, ZeRO-0)")
        from frenzyd.marp.trace.dist import measure_distributed

        return measure_distributed(model, setup, mode="real", threads=threads, seed=seed)
    return measure_real_single(model, setup, threads=threads, seed=seed, sdpa_backend=sdpa_backend)


def trace_measurement(model: ModelLike, setup: TrainingSetup, *, seed: int = 0) -> Measurement:
    """The reference step under ``FakeTensorMode`` on the CPU device, as a ``Measurement``."""
    validate_setup(setup)
    if runs_distributed(setup):
        from frenzyd.marp.trace.dist import measure_distributed

        return measure_distributed(model, setup, mode="fake", threads=1, seed=seed)
    return trace_measurement_single(model, setup, seed=seed)


def predict_trace(model: ModelLike, setup: TrainingSetup) -> Prediction:
    """The trace method: peak tensor bytes of the worst rank from a fake-tensor run of the reference step.

    Exact tensor bytes of the CPU code path with no real memory used; CUDA-only
    terms (bf16-mixed weight cache, CUDA SDPA kernels' statistics, runtime
    overhead) are not included.
    """
    return trace_measurement(model, setup).to_prediction()
