"""MARP's value types: a model, a training setup, a prediction and a plan.

These are the contracts between MARP (``analytic``, ``trace``, ``plans``), HAS,
the simulator and the CLI.  Plain frozen dataclasses: no I/O, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DtypeMode = Literal["fp32", "bf16", "bf16-mixed"]
Optimizer = Literal["adamw", "sgd"]
Recompute = Literal["none", "full"]
Phase = Literal["forward", "loss", "backward", "optimizer"]
Family = Literal["gpt2", "llama"]

DTYPE_MODES: tuple[DtypeMode, ...] = ("fp32", "bf16", "bf16-mixed")
OPTIMIZERS: tuple[Optimizer, ...] = ("adamw", "sgd")
RECOMPUTES: tuple[Recompute, ...] = ("none", "full")
PHASES: tuple[Phase, ...] = ("forward", "loss", "backward", "optimizer")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory accounting needs it.

    Built from a Hugging Face ``config.json`` by ``frenzyd.marp.model``;
    ``hf_config`` keeps the original dict so the trace method can build the
    very same HF model.
    """

    name: str
    family: Family
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_positions: int
    tied_embeddings: bool
    gated_mlp: bool
    """SwiGLU (gate, up, down) as in LLaMA; False for GPT-2's two-matrix MLP."""
    qkv_bias: bool
    mlp_bias: bool
    o_bias: bool
    norm: Literal["layernorm", "rmsnorm"]
    learned_positions: bool
    """GPT-2's wpe table; LLaMA uses rotary embeddings (no parameters)."""
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    embd_dropout: float = 0.0
    """GPT-2's embedding dropout (``embd_pdrop``); LLaMA has none."""
    sliding_window: int | None = None
    """Mistral/Qwen2 sliding-window attention span (a mask is built only past it)."""
    hf_config: dict[str, object] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True, slots=True)
class TrainingSetup:
    """How the reference training step runs (DESIGN.md §3), including the parallel plan.

    ``micro_batch`` is per rank and fixed; ``global_batch`` (default
    ``micro_batch * dp``) is reached by gradient accumulation.
    """

    seq_len: int
    micro_batch: int
    dtype: DtypeMode = "bf16-mixed"
    global_batch: int | None = None
    optimizer: Optimizer = "adamw"
    recompute: Recompute = "none"
    zero: int = 0
    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def effective_global_batch(self) -> int:
        return self.global_batch if self.global_batch is not None else self.micro_batch * self.dp

    @property
    def grad_accum(self) -> int:
        """Micro-steps per optimizer step (validated to divide exactly by ``marp.validate``)."""
        return max(1, self.effective_global_batch // (self.micro_batch * self.dp))


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Bytes by component at the peak moment; sums to the peak."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    temporaries: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.temporaries


@dataclass(frozen=True, slots=True)
class Prediction:
    """Peak tensor bytes of the worst rank over a steady-state step (no runtime overhead)."""

    model: str
    params: int
    peak_bytes: int
    peak_phase: Phase
    breakdown: Breakdown
    method: Literal["analytic", "trace"] = "analytic"
    phases: dict[str, int] = field(default_factory=dict, compare=False)
    """Peak bytes of each phase, where the method knows them."""
    rank_peaks: tuple[int, ...] = field(default=(), compare=False)
    """Peak bytes of every rank of the plan, where asked for: rank = (stage x dp + d) x tp + t
    (pipeline outermost, tensor parallelism innermost, as a DeviceMesh ``("pp", "dp", "tp")``)."""


@dataclass(frozen=True, slots=True)
class GpuPool:
    """One GPU type offered to plan enumeration: how many, how big, how fast."""

    gpu_type: str
    count: int
    memory_bytes: int
    speed: float
    gpus_per_node: int | None = None
    """Largest number of this type inside one peer (bounds tensor parallelism); None = count."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A feasible placement shape for a job on one GPU type (DESIGN.md §6 JSON keys)."""

    gpu_type: str
    gpus: int
    dp: int
    tp: int
    pp: int
    zero: int
    micro_batch: int
    grad_accum: int
    bytes_per_gpu: int
    """Worst rank, runtime overhead of the type included."""
    gpu_memory_bytes: int
    step_time_s: float
