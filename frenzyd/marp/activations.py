"""Bytes the reference step saves for backward per token, layer by layer, as the HF model code really runs.

Every figure below was read off a real run (torch 2.13, transformers 5.23,
``attn_implementation="sdpa"``) by listing the storages autograd saved per
module; ``frenzyd/marp/README.md`` has the table.  All values are *per token*
(``micro_batch x seq_len`` tokens per micro-batch) on one tensor-parallel rank,
plus a ``per_token_s`` part that multiplies the sequence length once more (the
``b·a·s²`` score matrices of SDPA's math kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from frenzyd.marp.spec import DtypeMode, ModelSpec

Device = Literal["cuda", "cpu"]
AttnKernel = Literal["flash", "efficient", "math"]


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """Saved bytes of one decoder layer for one token (``+ s·per_token_s``)."""

    per_token: float
    per_token_s: float
    weight_copies: int
    """bf16 copies of the layer's linear weights that autocast saves (bytes, per layer, not per token)."""
    residual: int
    """Bytes per token of the residual stream (the layer input kept by activation checkpointing)."""
    kernel: AttnKernel


def attention_kernel(spec: ModelSpec, dtype: DtypeMode, device: Device, seq_len: int) -> AttnKernel:
    """The SDPA backend the reference step gets.

    CPU: the flash kernel (fp32 and bf16, GQA via ``enable_gqa``) unless
    dropout > 0 or a mask is passed, then the math kernel.  CUDA: flash for
    16-bit inputs; fp32 has no flash kernel and takes the memory-efficient one,
    which accepts neither ``enable_gqa`` nor (on torch 2.13) grouped heads, so
    fp32 GQA falls back to math.
    """
    masked = spec.sliding_window is not None and seq_len > spec.sliding_window
    sixteen_bit = dtype != "fp32"
    if device == "cpu":
        return "math" if (spec.attn_dropout > 0 or masked) else "flash"
    if masked:
        return "efficient"
    if sixteen_bit:
        return "flash"
    return "math" if spec.kv_heads != spec.heads else "efficient"


def layer_bytes(spec: ModelSpec, dtype: DtypeMode, device: Device, seq_len: int, tp: int = 1) -> LayerBytes:
    """Saved-for-backward bytes of one decoder layer on one tensor-parallel rank."""
    kernel = attention_kernel(spec, dtype, device, seq_len)
    if spec.family == "llama":
        return _llama(spec, dtype, device, kernel, tp)
    return _gpt2(spec, dtype, device, kernel, tp)


def _attention(  # noqa: PLR0917 - the shape of one SDPA call
    q: int, kv: int, heads: int, d_in: int, d_out: int, kernel: AttnKernel, device: Device, dropout: bool
) -> tuple[float, float, bool]:
    """(per_token, per_token_s, output_is_copied) for SDPA on q/k/v of widths q, kv, kv (elements).

    d_in is the dtype SDPA sees, d_out the dtype of its output.  Fused kernels
    save q, k, v, the output and a float32 logsumexp per head.  The math kernel
    saves scaled copies of q and k, v (GQA heads repeated), the softmax
    probabilities and, with dropout, the mask and the dropped probabilities;
    CPU upcasts 16-bit inputs to float32 first.
    """
    if kernel != "math":
        return d_in * (q + 2 * kv) + d_out * q + 4 * heads, 0.0, False
    m = 4 if device == "cpu" else d_in
    per_s = m * heads
    if dropout:
        per_s += (m if device == "cpu" else 1) * heads + m * heads
    return 3 * m * q, float(per_s), True


def _llama(spec: ModelSpec, dtype: DtypeMode, device: Device, kernel: AttnKernel, tp: int) -> LayerBytes:
    h, hd = spec.hidden, spec.head_dim
    heads, kvh, f = spec.heads // tp, spec.kv_heads // tp, spec.ffn // tp
    q, kv = heads * hd, kvh * hd
    dropout = spec.attn_dropout > 0
    copies = 0
    if dtype == "fp32":
        # norm: input x (the residual), rsqrt, normed, output (the projections' input); x2.
        norms = 2 * (12 * h + 4)
        attn, attn_s, copied = _attention(q, kv, heads, 4, 4, kernel, device, dropout)
        mlp = 16 * f
        residual = 4 * h
    elif dtype == "bf16":
        # RMSNorm upcasts: the float32 copy of x, rsqrt, normed and output in bf16.
        norms = 2 * (4 * h + 4 + 2 * h + 2 * h)
        attn, attn_s, copied = _attention(q, kv, heads, 2, 2, kernel, device, dropout)
        mlp = 8 * f
        residual = 2 * h
    else:  # bf16-mixed: float32 residual stream, bf16 linear outputs, one bf16 cast of the input per linear.
        norms = 2 * (8 * h + 4) + 3 * 2 * h + 2 * 2 * h
        attn, attn_s, copied = _attention(q, kv, heads, 2, 2, kernel, device, dropout)
        mlp = 8 * f
        residual = 4 * h
        copies = 2 * (h * (2 * q + 2 * kv) + 3 * h * f)
    if copied:
        attn += (4 if dtype == "fp32" else 2) * q
    per_token = norms + attn + mlp
    return LayerBytes(float(per_token), attn_s, copies, residual, kernel)


def _gpt2(spec: ModelSpec, dtype: DtypeMode, device: Device, kernel: AttnKernel, tp: int) -> LayerBytes:
    h, heads, f = spec.hidden, spec.heads // tp, spec.ffn // tp
    q = heads * spec.head_dim
    dropout = spec.attn_dropout > 0
    resid = spec.resid_dropout > 0
    copies = 0
    if dtype in ("fp32", "bf16"):
        d = 4 if dtype == "fp32" else 2
        # ln_1 input x, mean, rstd, output; ln_2 the same on h1.
        norms = 2 * (2 * d * h + 2 * d)
        attn, attn_s, copied = _attention(q, q, heads, d, d, kernel, device, dropout)
        if copied:
            attn += d * q
        mlp = 5 * d * f  # gelu_new keeps 4 tensors of width F; c_proj its input
        mask = (d if device == "cpu" else 1) * h
        residual = d * h
    else:
        # float32 residual stream and LayerNorm, bf16 casts of the c_attn/c_fc inputs.
        norms = 2 * (4 * h + 8 + 2 * h)
        attn, attn_s, copied = _attention(q, q, heads, 2, 2, kernel, device, dropout)
        if copied:
            attn += 2 * q
        # CUDA autocast runs pow in float32 (its fp32 op list); CPU keeps gelu_new in bf16.
        mlp = (16 if device == "cuda" else 10) * f
        mask = (2 if device == "cpu" else 1) * h
        residual = 4 * h
        copies = 2 * (h * 3 * q + q * h + 2 * h * f)
    per_token = norms + attn + mlp + (2 * mask if resid else 0)
    return LayerBytes(float(per_token), attn_s, copies, residual, kernel)
