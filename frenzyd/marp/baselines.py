"""Published memory estimators re-implemented from their formulas, as baselines for MARP's benchmark.

Pure functions over ``ModelSpec``/``TrainingSetup`` values, no torch.  Each
implements its source faithfully (sources in ``/work/shared/ANCHORS.md`` and
``frenzyd/marp/README.md``) and states what it claims to model, so the
benchmark scores it only on that:

* ``megatron_theoretical`` — NVIDIA Megatron-LM
  ``megatron/training/theoretical_memory_usage.py``: weights + optimizer
  (``compute_weight_and_optimizer_memory``) plus activations (the non-sequence-
  parallel path ``compute_activation_memory_without_sp``, which is what
  ``report_theoretical_memory`` uses unless SP + selective recompute): the whole peak.
* ``deepspeed_zero2`` / ``deepspeed_zero3`` — DeepSpeed
  ``estimate_zero2_model_states_mem_needs`` (``runtime/zero/stage_1_and_2.py``)
  and ``estimate_zero3_model_states_mem_needs`` (``runtime/zero/stage3.py``),
  no offload: model states only (parameters, gradients, optimizer).
* ``accelerate_estimate`` — Hugging Face accelerate ``accelerate estimate-memory``
  (``src/accelerate/commands/estimate.py``, ``estimate_training_usage``):
  the maximum of its model / gradients / optimizer / step figures for Adam at
  batch size 1, no activations: model states only.
"""

from __future__ import annotations

import math

from frenzyd.marp.spec import ModelSpec, TrainingSetup

__all__ = [
    "accelerate_estimate",
    "deepspeed_zero2",
    "deepspeed_zero3",
    "largest_layer_params",
    "megatron_param_count",
    "megatron_theoretical",
]


def megatron_param_count(model: ModelSpec, tp: int = 1) -> tuple[float, float]:
    """Megatron's parameter count: ``(transformer block, embedding_size)`` with the vocabulary padded.

    Dense-model branch of ``compute_weight_and_optimizer_memory``: attention
    ``2·h·h·(1 + groups/heads)·(heads·head_dim/h)``, MLP ``2·h·F·(3/2 if SwiGLU)``,
    ``norm_size`` 1 for RMSNorm and 2 for LayerNorm (two norms per layer, one
    final), vocabulary padded to a multiple of ``128·tp``.  Biases other than the
    norms' are not counted (Megatron's formula has none).
    """
    h = model.hidden
    q_ratio = model.heads * model.head_dim / h
    gated = 1.5 if model.gated_mlp else 1.0
    norm_size = 1 if model.norm == "rmsnorm" else 2
    self_attn = 2 * h * h * ((1 + model.kv_heads / model.heads) * q_ratio)
    per_layer = 2 * h * (model.ffn * gated + norm_size) + self_attn
    block = per_layer * model.layers + norm_size * h
    multiple = 128 * tp
    padded_vocab = math.ceil(model.vocab / multiple) * multiple
    return block, float(h * padded_vocab)


def megatron_theoretical(model: ModelSpec, setup: TrainingSetup) -> int:
    """Megatron-LM's theoretical peak bytes of the most loaded rank (whole peak: states + activations).

    Bytes per parameter: 18 (bf16 parameters, fp32 gradients, fp32 master and
    Adam moments) or ``6 + 12/d`` with the distributed optimizer, which we take
    for ZeRO ≥ 1; for ``fp32`` training ANCHORS.md gives 16 and ``8 + 8/d``.
    Megatron has no other dtype modes, no SGD, no full recompute and no ZeRO-3:
    they get the nearest published case (bf16 figures for ``bf16``; Adam;
    activations as without recompute; ZeRO-3 as the distributed optimizer).
    Activations: ``s·b·h·(10 + 24/t)`` per layer over all layers, ``8·s·b·p``
    for the input, ``s·b·h·p`` embedding dropout, with ``p = 1`` the output layer
    ``2·(s·b·V/t + s·b·h)``, all times 1.05.
    """
    block, embedding = megatron_param_count(model, setup.tp)
    t, p, d = setup.tp, setup.pp, setup.dp
    most_loaded = (block / p + embedding) / t
    if not model.tied_embeddings and p == 1:
        most_loaded += embedding / t
    if setup.dtype == "fp32":
        bpp = 16.0 if setup.zero == 0 else 8 + 8 / d
    else:
        bpp = 18.0 if setup.zero == 0 else 6 + 12 / d
    states = most_loaded * bpp

    s, b, h = setup.seq_len, setup.micro_batch, model.hidden
    act = s * b * h * (10 + 24 / t) * model.layers
    act += 8 * s * b * p
    act += s * b * h * p
    if p > 1:
        act *= min(1.0, setup.grad_accum / p)
    else:
        padded_vocab = embedding / h
        act += (s * b * padded_vocab / t + s * b * h) * 2
    act *= 1.05
    return int(states + act)


def deepspeed_zero2(params: int, num_gpus: int) -> int:
    """DeepSpeed ``estimate_zero2_model_states_mem_needs`` (no offload): ``2P + 18P/N`` bytes per GPU."""
    return int(2 * params + int(18 * params / num_gpus))


def deepspeed_zero3(params: int, largest_layer: int, num_gpus: int) -> int:
    """DeepSpeed ``estimate_zero3_model_states_mem_needs`` (no offload): ``4·P_largest + 18P/N`` bytes."""
    return int(4 * largest_layer + int(18 * params / num_gpus))


def largest_layer_params(model: ModelSpec) -> int:
    """The largest single module's own parameters, as DeepSpeed's live estimator counts them.

    ``estimate_zero3_model_states_mem_needs_all_live`` takes, over all modules,
    the parameters a module holds directly (``recurse=False``): for these
    decoder models that is the larger of the (input or output) embedding
    ``V·h`` and the widest linear layer.
    """
    h = model.hidden
    mlp = model.ffn * h + (model.ffn if model.mlp_bias else 0)
    q_width = model.heads * model.head_dim
    if model.family == "gpt2":
        qkv = h * 3 * h + (3 * h if model.qkv_bias else 0)  # GPT-2's fused c_attn
    else:
        qkv = h * q_width + (q_width if model.qkv_bias else 0)  # q_proj, the widest of q/k/v/o
    return int(max(model.vocab * h, mlp, qkv))


def accelerate_estimate(params: int, dtype: str) -> int:
    """accelerate ``estimate-memory``'s training figure: max of model, gradients, optimizer, step.

    ``estimate_training_usage`` is given the fp32 model size ``4P``: for
    ``float32`` it returns model ``4P``, gradients ``4P``, optimizer ``8P``,
    step ``16P``; for ``float16``/``bfloat16`` model ``4P``, gradients
    ``6P``, optimizer ``8P``, step ``8P``.  The maximum is printed: ``16P``
    and ``8P`` bytes.  Our ``bf16`` and ``bf16-mixed`` modes map to its
    ``bfloat16`` row.
    """
    fp32_size = 4 * params
    fp16_size = fp32_size // 2
    if dtype == "fp32":
        sizes = [fp32_size, fp32_size, 2 * fp32_size, 4 * fp32_size]
    else:
        sizes = [fp32_size, fp32_size + fp16_size, 2 * fp32_size, 2 * fp32_size]
    return int(max(sizes))
