"""Canonical GPU type names, their memory and relative training speed, and the NVML name map.

Figures: ``../shared/data/README.md`` (relative per-GPU throughput for
mixed-precision transformer training, V100 = 1.0; sources: Lambda Labs FP16
PyTorch benchmarks, Sia's BERT profiles, Gavel's throughput matrices, MLPerf
Training).  Rows marked ``assumed`` have no measured source.  One scalar speed
per type is a simplification: speed-ups are model dependent (Gavel measured a
V100 at 0.43x-1.8x a P100 across models).

Dense bf16/fp16 tensor-core peak TFLOPS (vendor datasheets, dense, no sparsity)
are kept beside the speed for MARP's step-time estimate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from frenzyd.errors import ConfigError

GIB = 1024**3

DEFAULT_UNKNOWN_SPEED = 1.0
"""Speed given to a GPU whose NVML name is not in the table (stated in the README)."""


@dataclass(frozen=True, slots=True)
class GpuTypeInfo:
    """One canonical GPU type."""

    name: str
    memory_bytes: int
    speed: float
    peak_tflops: float
    """Dense 16-bit tensor-core peak (fp32 on P100), for step-time estimates."""
    assumed: bool = False


def _t(name: str, gib: float, speed: float, tflops: float, assumed: bool = False) -> GpuTypeInfo:
    return GpuTypeInfo(name, int(gib * GIB), speed, tflops, assumed)


GPU_TYPES: dict[str, GpuTypeInfo] = {
    t.name: t
    for t in (
        _t("T4", 16, 0.35, 65.0),
        _t("P100", 16, 0.65, 18.7),
        _t("V100-16GB", 16, 1.0, 125.0),
        _t("V100-32GB", 32, 1.0, 125.0),
        _t("A10", 24, 0.8, 125.0),
        _t("L4", 24, 0.8, 121.0, assumed=True),
        _t("RTX-2080TI", 11, 0.7, 107.0),
        _t("RTX-3090", 24, 1.05, 142.0),
        _t("RTX-4090", 24, 1.9, 330.0),
        _t("RTX-A6000", 48, 1.3, 155.0),
        _t("L40S", 48, 2.0, 362.0, assumed=True),
        _t("A100-40GB", 40, 2.1, 312.0),
        _t("A100-80GB", 80, 2.55, 312.0),
        _t("H100-80GB", 80, 4.5, 989.0),
        _t("H200", 141, 5.0, 989.0, assumed=True),
    )
}

# NVML reports marketing names; the first pattern that matches wins.  Memory
# disambiguates the variants that share a name (V100 16/32 GB, A100 40/80 GB).
_NVML_PATTERNS: tuple[tuple[str, str | None, float | None], ...] = (
    # (regex on the upper-cased NVML name, canonical type, min GiB for a match)
    (r"\bH200\b", "H200", None),
    (r"\bH100\b", "H100-80GB", None),
    (r"\bA100\b", "A100-80GB", 60.0),
    (r"\bA100\b", "A100-40GB", None),
    (r"\bL40S\b", "L40S", None),
    (r"RTX A6000", "RTX-A6000", None),
    (r"RTX 4090", "RTX-4090", None),
    (r"RTX 3090", "RTX-3090", None),
    (r"RTX 2080 TI", "RTX-2080TI", None),
    (r"\bV100\b", "V100-32GB", 24.0),
    (r"\bV100\b", "V100-16GB", None),
    (r"\bP100\b", "P100", None),
    (r"\bT4\b", "T4", None),
    (r"\bA10\b(?!0)", "A10", None),
    (r"\bL4\b", "L4", None),
)


def canonical_type(nvml_name: str, memory_bytes: int) -> str:
    """Map an NVML device name onto a canonical type name.

    An unknown name becomes a type named after it (spaces replaced by ``-``),
    which :func:`type_info` then describes with its NVML memory and
    :data:`DEFAULT_UNKNOWN_SPEED`.
    """
    upper = nvml_name.upper()
    gib = memory_bytes / GIB
    for pattern, canonical, min_gib in _NVML_PATTERNS:
        if re.search(pattern, upper) and (min_gib is None or gib >= min_gib):
            return canonical  # type: ignore[return-value]
    cleaned = re.sub(r"^NVIDIA\s+", "", nvml_name.strip(), flags=re.IGNORECASE)
    return re.sub(r"\s+", "-", cleaned) or "unknown-gpu"


MIG_INDEX_BASE = 1000
"""MIG instances are numbered ``MIG_INDEX_BASE + 10 * parent index + slot`` in a node's report, so
they never collide with a whole GPU's CUDA index (a GPU has at most 7 instances)."""

_MIG_TYPE = re.compile(r"^(?P<parent>.+)-MIG-(?P<slices>[1-7])g\.(?P<gb>\d+)gb$")
MIG_COMPUTE_SLICES = 7
"""Compute slices of an A100/H100/H200 in MIG mode: a ``3g`` instance has 3/7 of its SMs."""


def mig_index(parent_index: int, slot: int) -> int:
    """The report index of MIG instance ``slot`` of the GPU at CUDA index ``parent_index``."""
    return MIG_INDEX_BASE + 10 * parent_index + slot


def cuda_device(index: int, uuid: str) -> str:
    """What ``CUDA_VISIBLE_DEVICES`` names the device by: its CUDA index, or a MIG instance's UUID
    (CUDA addresses MIG instances only by UUID, and one process sees at most one of them)."""
    return uuid if index >= MIG_INDEX_BASE else str(index)


def is_mig_type(name: str) -> bool:
    """``PARENT-MIG-<g>g.<gb>gb`` (the inventory's name for a MIG instance's type)."""
    return _MIG_TYPE.match(name) is not None


def known_type(name: str) -> GpuTypeInfo | None:
    """The table row for ``name``; for a MIG instance of a known GPU, its parent's speed and peak
    scaled by its share of the compute slices (``assumed``: not measured), with the profile's
    memory; None for a type neither the table nor a MIG profile describes."""
    info = GPU_TYPES.get(name)
    if info is not None:
        return info
    m = _MIG_TYPE.match(name)
    parent = GPU_TYPES.get(m.group("parent")) if m else None
    if m is None or parent is None:
        return None
    share = int(m.group("slices")) / MIG_COMPUTE_SLICES
    return GpuTypeInfo(name, int(m.group("gb")) * GIB, parent.speed * share, parent.peak_tflops * share,
                       assumed=True)


def type_info(name: str, memory_bytes: int | None = None) -> GpuTypeInfo:
    """The table row for ``name``; an unknown type needs its memory and gets the default speed."""
    info = known_type(name)
    if info is not None:
        return info
    if memory_bytes is None:
        known = ", ".join(GPU_TYPES)
        raise ConfigError(f"unknown GPU type {name!r}: give its memory, or use one of {known}")
    return GpuTypeInfo(name, memory_bytes, DEFAULT_UNKNOWN_SPEED, 100.0, assumed=True)
