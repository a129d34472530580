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
    mlp_per_token: float = 0.0
    """The MLP's share of ``per_token`` (freed before the attention's backward runs)."""
    score_per_token_s: float = 0.0
    """Bytes per token per key of one ``b·a·s²`` probability matrix of the math kernel (0 if fused)."""
    math_fwd_scores: float = 0.0
    """Math kernel without dropout: score-sized tensors alive at its forward peak beyond the saved
    probabilities (0 = not modelled this way: fused kernels, or the fitted dropout path)."""
    math_fwd_per_token: float = 0.0
    """Math kernel: bytes per token alive at that moment beyond the saved ones (the repeated keys)."""
    math_fwd_per_s2: float = 0.0
    """Math kernel: bytes per ``s²`` of the causal mask it builds (not per batch or head)."""
    math_bwd_scores: float = 1.0
    """Math kernel: score-sized gradients alive at once in its backward, beyond the saved probabilities."""
    after_attn_per_token: float = 0.0
    """Bytes per token saved after SDPA returns (its output copy, the second norm, the MLP): not yet
    saved inside the last layer's attention in forward, already freed in its backward."""
    math_bwd_per_token: float = 0.0
    """Math kernel: bytes per token of the gradients alive beside the score gradients (output, V)."""


def kv_repeated(spec: ModelSpec, seq_len: int) -> bool:
    """Whether transformers copies grouped K/V heads up to the query heads (``repeat_kv``) before SDPA.

    transformers 5.23 ``integrations/sdpa_attention.py``: ``sdpa_attention_forward`` passes
    ``enable_gqa=True`` when ``use_gqa_in_sdpa`` holds (no attention mask and
    ``head_dim <= 256`` on CUDA/CPU), else it calls ``repeat_kv`` (an expand + reshape copy).
    The reference step passes no mask; a mask exists only past a sliding window.  With a
    single K/V head (per tensor-parallel rank) the repeat is a view, not a copy.
    """
    if spec.kv_heads == spec.heads:
        return False
    masked = spec.sliding_window is not None and seq_len > spec.sliding_window
    return masked or spec.head_dim > 256


def attention_kernel(spec: ModelSpec, dtype: DtypeMode, device: Device, seq_len: int) -> AttnKernel:
    """The SDPA backend the reference step gets (torch 2.13, transformers 5.23).

    CPU (``sdp_utils_cpp.cpp`` ``use_flash_attention_cpp``; measured): the flash
    kernel for fp32 and bf16, grouped K/V heads included (``enable_gqa``), unless
    dropout > 0 or a mask is passed, then the math kernel.  CUDA
    (``cuda/sdp_utils.cpp`` ``select_sdp_backend``): flash (or cuDNN) for 16-bit
    inputs with ``head_dim <= 256``; fp32 has no flash/cuDNN kernel and takes
    the memory-efficient one, whose dense constraints instantiate
    ``check_batch_size_and_num_heads_dense<false>`` in 2.13 (grouped K/V heads
    rejected), so fp32 with ``enable_gqa=True`` ends in the math kernel.
    ``head_dim > 256`` or a mask makes transformers repeat K/V first
    (:func:`kv_repeated`): equal head counts, the memory-efficient kernel.
    """
    masked = spec.sliding_window is not None and seq_len > spec.sliding_window
    if device == "cpu":
        return "math" if (spec.attn_dropout > 0 or masked) else "flash"
    if masked:
        return "efficient"
    if dtype != "fp32" and spec.head_dim <= 256:
        return "flash"
    native_gqa = spec.kv_heads != spec.heads and not kv_repeated(spec, seq_len)
    return "math" if native_gqa else "efficient"


def layer_bytes(
    spec: ModelSpec,
    dtype: DtypeMode,
    device: Device,
    seq_len: int,
    tp: int = 1,
    *,
    kernel: AttnKernel | None = None,
) -> LayerBytes:
    """Saved-for-backward bytes of one decoder layer on one tensor-parallel rank.

    ``kernel`` forces an SDPA backend (as ``torch.nn.attention.sdpa_kernel`` does); by
    default :func:`attention_kernel` chooses it.
    """
    kernel = kernel or attention_kernel(spec, dtype, device, seq_len)
    if spec.family == "llama":
        return _llama(spec, dtype, device, kernel, tp, kv_repeated(spec, seq_len))
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


def _math_transients(device: Device, d_in: int, q: int) -> tuple[float, float, float, float]:
    """(fwd_scores, fwd_per_token, fwd_per_s2, bwd_scores) of the math kernel without dropout.

    ``_scaled_dot_product_attention_math`` (aten/src/ATen/native/transformers/attention.cpp):
    a causal mask built as a bool ``s x s`` then converted to the query dtype, K/V repeated by
    ``repeat_interleave`` (the repeated keys live until the call ends; their scaled copy is
    saved), ``scores = q @ k^T``, the mask added, then ``_safe_softmax``.  CUDA's caching
    allocator sees the mask added in place and ``_safe_softmax``'s internal ``softmax`` output,
    ``eq(-inf)`` bool mask and ``where`` result: 2.25 score-sized tensors beyond the saved
    probabilities.  Torch's MemTracker (the CPU truth) is a TorchDispatchMode, under which
    ``areAnyTensorSubclassLike`` is true, so the mask is added out of place, while the composite's
    internals are invisible to it: one score-sized tensor beyond the saved ones.  Backward
    (``_softmax_backward_data``): the probabilities' gradient and the scores' gradient at once.
    """
    fwd = 2.25 if device == "cuda" else 1.0
    return fwd, float(d_in * q), float(d_in + 1), 2.0


def _llama(  # noqa: PLR0917 - one layer's shape
    spec: ModelSpec, dtype: DtypeMode, device: Device, kernel: AttnKernel, tp: int, kv_rep: bool = False
) -> LayerBytes:
    h, hd = spec.hidden, spec.head_dim
    heads, kvh, f = spec.heads // tp, spec.kv_heads // tp, spec.ffn // tp
    q, kv = heads * hd, kvh * hd
    # transformers' repeat_kv copies K/V up to the query heads (SDPA then holds only the copies);
    # with one K/V head per rank its expand + reshape is a view, and nothing is copied
    kv_sdpa = q if kv_rep and kvh > 1 else kv
    dropout = spec.attn_dropout > 0
    copies = 0
    d = 4 if dtype == "fp32" else 2
    if dtype == "fp32":
        # norm: input x (the residual), rsqrt, normed, output (the projections' input); x2.
        norms = 2 * (12 * h + 4)
        norm2 = 12 * h + 4
        mlp = 16 * f
        residual = 4 * h
    elif dtype == "bf16":
        # RMSNorm upcasts: the float32 copy of x, rsqrt, normed and output in bf16.
        norms = 2 * (4 * h + 4 + 2 * h + 2 * h)
        norm2 = 8 * h + 4
        mlp = 8 * f
        residual = 2 * h
    else:  # bf16-mixed: float32 residual stream, bf16 linear outputs, one bf16 cast of the input per linear.
        norms = 2 * (8 * h + 4) + 3 * 2 * h + 2 * 2 * h
        norm2 = 8 * h + 4 + 2 * 2 * h
        mlp = 8 * f
        residual = 4 * h
        copies = 2 * (h * (2 * q + 2 * kv) + 3 * h * f)
    attn, attn_s, copied = _attention(q, kv_sdpa, heads, d, d, kernel, device, dropout)
    if copied:
        attn += d * q
    per_token = norms + attn + mlp
    m = 4 if kernel == "math" and device == "cpu" else d  # the dtype the math kernel computes in
    score = float(m * heads)
    fwd_s = fwd_tok = fwd_s2 = 0.0
    bwd_s = 1.0
    if kernel == "math" and not dropout:
        fwd_s, fwd_tok, fwd_s2, bwd_s = _math_transients(device, m, q)
        if kv_sdpa == q:
            fwd_tok = 0.0  # equal head counts: the math kernel repeats nothing
    after = mlp + norm2 + (d * q if copied else 0)
    return LayerBytes(
        float(per_token), attn_s, copies, residual, kernel, float(mlp), score if attn_s else 0.0,
        fwd_s, fwd_tok, fwd_s2, bwd_s, float(after), float(2 * m * q),
    )


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
    score = 4.0 * heads if device == "cpu" else (4.0 if dtype == "fp32" else 2.0) * heads
    return LayerBytes(
        float(per_token), attn_s, copies, residual, kernel, float(mlp), score if attn_s else 0.0
    )
