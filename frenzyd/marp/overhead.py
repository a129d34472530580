"""Per-GPU-type runtime memory beyond tensors (CUDA context, workspaces, NCCL buffers, allocator slack).

Tensor-level accounting (``analytic``/``trace``) cannot see these; they are
added only when a plan is fitted onto a GPU.  Default figures and sources:

* CUDA context and kernel images: 0.3-2 GB depending on GPU and CUDA version;
  Hugging Face's "Model memory anatomy" guide measures about 1.3 GB on a V100
  (torch loading every kernel).  With CUDA >= 11.7 lazy module loading
  (default since torch 2.0) Ampere and newer land near 0.5-0.8 GB; we take
  1.3 GiB for Pascal/Volta/Turing and 0.9 GiB for Ampere/Ada/Hopper (kept on
  the high side: under-prediction means OOM).
* cuBLAS workspace: cuBLAS's default workspace is 4 MiB x 8 per handle
  (``CUBLAS_WORKSPACE_CONFIG=:4096:8``), 32 MiB on Hopper; we reserve 64 MiB.
* NCCL: ``NCCL_BUFFSIZE`` defaults to 4 MiB per channel and peer, outside the
  caching allocator; with multiple GPUs we reserve 256 MiB (NVLink/PCIe ring
  and tree channels), 0 for a single GPU.
* Allocator rounding (512 B blocks, 2 MiB segments) and fragmentation:
  reserved - allocated reaches 10-20 % (PyTorch CUDA caching allocator notes);
  default 10 % of the tensor peak.

Measured peaks refine the figures online through :class:`Correction`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class OverheadProfile:
    """Runtime overhead of one GPU type."""

    context_bytes: int
    workspace_bytes: int = 64 * MIB
    nccl_bytes: int = 256 * MIB
    slack_fraction: float = 0.10


_OLD = OverheadProfile(context_bytes=int(1.3 * GIB))
_NEW = OverheadProfile(context_bytes=int(0.9 * GIB))

OVERHEAD_TABLE: dict[str, OverheadProfile] = {
    **dict.fromkeys(("T4", "P100", "V100-16GB", "V100-32GB", "RTX-2080TI"), _OLD),
    **dict.fromkeys(
        (
            "A10",
            "L4",
            "RTX-3090",
            "RTX-4090",
            "RTX-A6000",
            "L40S",
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H200",
        ),
        _NEW,
    ),
}
DEFAULT_PROFILE = _OLD
"""Used for a GPU type not in the table (the larger, safer context figure)."""


@dataclass(frozen=True, slots=True)
class Correction:
    """Online correction: EWMA of measured/predicted peak ratio per GPU type (a pure value).

    ``update`` returns a new Correction; ``factor`` is 1.0 for a type never measured.
    """

    alpha: float = 0.2
    ratios: tuple[tuple[str, float], ...] = field(default=())

    def factor(self, gpu_type: str) -> float:
        """The multiplier to apply to predicted tensor peaks on ``gpu_type``."""
        for name, ratio in self.ratios:
            if name == gpu_type:
                return ratio
        return 1.0

    def update(self, gpu_type: str, measured_bytes: int, predicted_bytes: int) -> Correction:
        """Fold one finished job's measured peak into the EWMA; ignores non-positive inputs."""
        if measured_bytes <= 0 or predicted_bytes <= 0:
            return self
        sample = measured_bytes / predicted_bytes
        old = dict(self.ratios)
        prev = old.get(gpu_type)
        old[gpu_type] = sample if prev is None else (1 - self.alpha) * prev + self.alpha * sample
        return replace(self, ratios=tuple(sorted(old.items())))


def profile_for(gpu_type: str, table: dict[str, OverheadProfile] | None = None) -> OverheadProfile:
    """The overhead profile of a type (``table`` overrides the defaults)."""
    t = OVERHEAD_TABLE if table is None else table
    return t.get(gpu_type, DEFAULT_PROFILE)


def overhead_bytes(
    gpu_type: str,
    tensor_peak: int,
    world_size: int,
    *,
    table: dict[str, OverheadProfile] | None = None,
    correction: Correction | None = None,
) -> int:
    """Runtime bytes on one GPU beyond the tensor peak: context + workspace + NCCL (world > 1) + slack.

    With a ``correction``, the tensor peak is first scaled by the measured
    ratio of the type (never below the prediction).
    """
    p = profile_for(gpu_type, table)
    peak = tensor_peak
    if correction is not None:
        peak = int(tensor_peak * max(1.0, correction.factor(gpu_type)))
    nccl = p.nccl_bytes if world_size > 1 else 0
    return (peak - tensor_peak) + p.context_bytes + p.workspace_bytes + nccl + int(p.slack_fraction * peak)
