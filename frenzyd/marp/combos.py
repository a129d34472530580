"""The parallel forms the built-in trainer runs: one table, and the rule saying whether a plan is in it.

Each combination names which mesh axes may be wider than one rank (``dp``,
``tp``, ``pp``) and the ZeRO stage, in torch's own terms (DESIGN.md §3):

* ``dp``    - ``DistributedDataParallel(gradient_as_bucket_view=True)``
* ``zero1`` - DDP + ``ZeroRedundancyOptimizer``
* ``zero2`` / ``zero3`` - FSDP2 ``fully_shard`` per decoder layer (``reshard_after_forward``
  False / True) and at the root (FSDP2's own choice: kept gathered after forward)
* ``tp``    - Megatron-style tensor parallel on DTensors (column-wise q/k/v and gate/up,
  row-wise o and down; ``parallelize_module`` for LLaMA, ``trainer.tp_gpt2`` for GPT-2)
* ``pp``    - ``torch.distributed.pipelining`` ``Schedule1F1B``, layers split evenly
* and their compositions on one ``(pp, dp, tp)`` DeviceMesh: every ZeRO stage with tp or with pp
  (``dp×tp``, ``zero1×tp`` ... ``zero3×pp``), ``tp×pp`` without data parallelism, and the 3-D
  meshes: every ZeRO stage with tp and pp (``dp×tp×pp`` ... ``zero3×tp×pp``; each 1F1B stage cut,
  tensor-parallelised, then wrapped over its dp group).  With these every degree pattern of
  dp, tp and pp at ZeRO 0-3 is in the table; what still refuses a plan is the model (tp must
  divide the heads, pp the layers) and the batch (1F1B's ``grad_accum >= pp``).

MARP proposes only plans for which :func:`runs` is true; the trainer refuses
any other with :func:`refusal`'s message.  Pure: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from frenzyd.marp.spec import ModelSpec, TrainingSetup

Width = Literal["one", "many", "any"]
"""An axis degree that must be 1, must be at least 2, or may be anything >= 1."""


@dataclass(frozen=True, slots=True)
class Combo:
    """One parallel form the trainer executes."""

    name: str
    zero: int
    dp: Width
    tp: Width
    pp: Width
    how: str
    """The torch building blocks, for the README and error messages."""


COMBOS: tuple[Combo, ...] = (
    Combo("single", 0, "one", "one", "one", "one process, the plain reference step"),
    Combo("dp", 0, "many", "one", "one", "DistributedDataParallel(gradient_as_bucket_view=True)"),
    Combo("zero1", 1, "any", "one", "one", "DDP + ZeroRedundancyOptimizer(AdamW)"),
    Combo("zero2", 2, "any", "one", "one", "FSDP2 fully_shard per layer + root; layers not resharded"),
    Combo("zero3", 3, "any", "one", "one", "FSDP2 fully_shard per layer + root; layers resharded"),
    Combo("tp", 0, "one", "many", "one", "Megatron-style DTensors: colwise q/k/v, gate/up; rowwise o, down"),
    Combo("pp", 0, "one", "one", "many", "torch.distributed.pipelining Schedule1F1B, layers split evenly"),
    Combo("dp×tp", 0, "many", "many", "one", "2-D mesh (dp, tp): tp as above, DDP over the dp axis"),
    Combo("zero2×tp", 2, "any", "many", "one", "2-D mesh (dp, tp): tp, then FSDP2 over dp (no reshard)"),
    Combo("zero3×tp", 3, "any", "many", "one", "2-D mesh (dp, tp): tp, then FSDP2 over dp (reshard)"),
    Combo("zero1×tp", 1, "any", "many", "one", "2-D mesh (dp, tp): tp, then DDP + ZeroRedundancyOptimizer"),
    Combo("zero1×pp", 1, "any", "one", "many", "2-D mesh (dp, pp): 1F1B stages, DDP + ZeRO-1 optimizer"),
    Combo("dp×pp", 0, "many", "one", "many", "2-D mesh (dp, pp): 1F1B stages, each stage in DDP over dp"),
    Combo("zero2×pp", 2, "any", "one", "many", "2-D mesh (dp, pp): 1F1B stages, each in FSDP2 (no reshard)"),
    Combo("zero3×pp", 3, "any", "one", "many", "2-D mesh (dp, pp): 1F1B stages, each in FSDP2 (reshard)"),
    Combo("tp×pp", 0, "one", "many", "many", "2-D mesh (pp, tp): 1F1B stages of tensor-parallel layers"),
    Combo("dp×tp×pp", 0, "many", "many", "many", "3-D mesh (pp, dp, tp): tp×pp stages, each in DDP over dp"),
    Combo("zero1×tp×pp", 1, "any", "many", "many", "3-D mesh: tp×pp stages in DDP, ZeRO-1 optimizer over dp"),
    Combo("zero2×tp×pp", 2, "any", "many", "many", "3-D mesh: tp×pp stages in FSDP2 over dp (no reshard)"),
    Combo("zero3×tp×pp", 3, "any", "many", "many", "3-D mesh: tp×pp stages in FSDP2 over dp (reshard)"),
)
"""Every combination the trainer runs, and nothing else (tests/trainer runs each one)."""


def _fits(width: Width, degree: int) -> bool:
    if width == "one":
        return degree == 1
    if width == "many":
        return degree >= 2
    return degree >= 1


def combo_of(setup: TrainingSetup) -> Combo | None:
    """The table entry whose degree pattern and ZeRO stage match ``setup``, or None."""
    for c in COMBOS:
        if c.zero == setup.zero and _fits(c.dp, setup.dp) and _fits(c.tp, setup.tp) and _fits(c.pp, setup.pp):
            return c
    return None


def refusal(setup: TrainingSetup, model: ModelSpec) -> str | None:
    """Why the trainer cannot run ``setup`` on ``model`` (a fix-it message), or None when it can."""
    if min(setup.dp, setup.tp, setup.pp) < 1 or setup.micro_batch < 1:
        return "dp, tp, pp and micro_batch must be positive integers"
    combo = combo_of(setup)
    if combo is None:
        names = ", ".join(c.name for c in COMBOS)
        return (
            f"the trainer does not run dp={setup.dp} tp={setup.tp} pp={setup.pp} zero={setup.zero}: "
            f"it runs {names} (ZeRO stages 0-3)"
        )
    g = setup.effective_global_batch
    if g % (setup.micro_batch * setup.dp) != 0:
        return (
            f"global batch {g} is not a multiple of micro_batch x dp = {setup.micro_batch * setup.dp}: "
            "choose a global batch that is"
        )
    if setup.tp > 1:
        for what, n in (("attention heads", model.heads), ("key/value heads", model.kv_heads),
                        ("MLP width", model.ffn)):
            if n % setup.tp:
                return f"tp={setup.tp} does not divide the {n} {what} of {model.name}: choose a tp that does"
    if setup.pp > 1:
        if model.sliding_window is not None and setup.seq_len > model.sliding_window:
            return (
                f"seq_len {setup.seq_len} exceeds the sliding window {model.sliding_window}: the pipeline's "
                "stages attend causally over the whole sequence; shorten seq_len or use dp/ZeRO"
            )
        if model.layers % setup.pp:
            return (
                f"pp={setup.pp} does not split the {model.layers} layers of {model.name} evenly: "
                "choose a pp that divides the layer count"
            )
        if setup.grad_accum < setup.pp:
            return (
                f"1F1B needs at least as many micro-batches as stages: grad_accum={setup.grad_accum} < "
                f"pp={setup.pp}; raise the global batch or lower the micro-batch"
            )
    return None


def runs(setup: TrainingSetup, model: ModelSpec) -> bool:
    """True when the trainer executes ``setup`` on ``model`` (MARP proposes only these plans)."""
    return refusal(setup, model) is None
