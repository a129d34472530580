"""MARP's torch boundary: the reference training step run for real (ground truth) or under fake tensors.

``step`` runs it in one process, ``dist`` as data-parallel / ZeRO ranks (built
on ``step``), ``api`` sends each setup to one of them.  torch and transformers
are imported lazily inside functions: importing this package imports neither.
"""

from frenzyd.marp.trace.api import measure_real, predict_trace, trace_measurement
from frenzyd.marp.trace.step import Measurement, build_hf_config, run_reference_step

__all__ = [
    "Measurement",
    "build_hf_config",
    "measure_real",
    "predict_trace",
    "run_reference_step",
    "trace_measurement",
]
