"""Closed-form peak tensor memory of the worst rank over a steady-state reference training step.

The step (DESIGN.md §3) is accounted phase by phase: ``forward`` (embedding
and decoder layers), ``loss`` (LM head, float32 logits, cross-entropy and the
start of backward through them), ``backward`` (decoder layers in reverse, the
gradients growing as the saved activations are freed) and ``optimizer``.  The
peak is the largest phase; the breakdown is taken at that moment and sums to
it.  Pure and cheap: a handful of arithmetic per call, no world building.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frenzyd.marp import model as M
from frenzyd.marp.activations import Device, LayerBytes, layer_bytes
from frenzyd.marp.spec import Breakdown, ModelSpec, Phase, Prediction, TrainingSetup
from frenzyd.marp.validate import validate


@dataclass(frozen=True, slots=True)
class AnalyticConstants:
    """Tunable terms of the analytic method (fitted by ``scripts/bench_marp.py``; defaults documented).

    Transients are in bytes per token of the named width, at the step's
    activation dtype; the safety factor multiplies the whole tensor peak.
    """

    fwd_temp_h: float = 1.0
    """Forward: short-lived tensors inside a decoder layer, in units of ``hidden`` (RMSNorm's square,
    LayerNorm's output before the cast, rotary products)."""
    fwd_temp_f: float = 0.0
    """Forward: short-lived tensors of FFN width inside a layer."""
    bwd_temp_h: float = 3.0
    """Backward: gradient tensors of width ``hidden`` alive at once inside a layer's backward."""
    bwd_temp_f: float = 3.0
    """Backward: gradient tensors of FFN width alive at once inside a layer's backward (SwiGLU/GELU)."""
    ckpt_fwd_temp_h: float = 2.0
    """Forward under full recompute: hidden-width tensors alive at once inside a checkpointed layer."""
    ckpt_fwd_temp_f: float = 3.0
    """Forward under full recompute: FFN-width tensors alive at once inside a checkpointed SwiGLU layer."""
    ckpt_fwd_temp_f_gelu: float = 7.5
    """The same for GPT-2's tanh-approximated GELU, which builds more intermediates of FFN width."""
    safety: float = 1.0
    """Multiplier on the final tensor peak (1.0 = none; raise to trade accuracy for OOM safety)."""


DEFAULT_CONSTANTS = AnalyticConstants()


@dataclass(frozen=True, slots=True)
class _Sizes:
    """Per-rank static byte counts of one pipeline stage."""

    params: int
    grads: int
    opt: int
    layer_params: int
    head_grad: int
    emb_grad: int


def _dtype_bytes(dtype: str) -> tuple[int, int, int]:
    """(parameter, activation, logits) bytes for a dtype mode."""
    if dtype == "fp32":
        return 4, 4, 4
    if dtype == "bf16":
        return 2, 2, 2
    return 4, 4, 2


def predict(
    model: ModelSpec,
    setup: TrainingSetup,
    *,
    constants: AnalyticConstants = DEFAULT_CONSTANTS,
    device: Device = "cuda",
    check: bool = True,
) -> Prediction:
    """Peak tensor bytes of the worst rank of ``setup``'s plan over a steady-state step.

    ``device`` picks whose kernels and autocast are modelled ("cuda" by
    default; "cpu" for scoring against CPU runs).  Raises ConfigError/PlanError
    (via :func:`frenzyd.marp.validate.validate`) when the setup is impossible.
    No runtime overhead is included (see ``overhead.py``).
    """
    if check:
        validate(model, setup)
    best: tuple[int, Phase, Breakdown] | None = None
    phases: dict[str, int] = {}
    for stage in _stages(setup.pp):
        for phase, bd in _stage_phases(model, setup, constants, device, stage):
            total = bd.total
            if total > phases.get(phase, -1):
                phases[phase] = total
            if best is None or total > best[0]:
                best = (total, phase, bd)
    assert best is not None
    peak, phase, bd = best
    if constants.safety != 1.0:
        extra = int(peak * (constants.safety - 1.0))
        bd = Breakdown(bd.parameters, bd.gradients, bd.optimizer, bd.activations, bd.temporaries + extra)
        peak += extra
        phases = {k: int(v * constants.safety) for k, v in phases.items()}
        phases[phase] = peak
    return Prediction(
        model=model.name,
        params=M.param_count(model),
        peak_bytes=peak,
        peak_phase=phase,
        breakdown=bd,
        method="analytic",
        phases=phases,
    )


def _stages(pp: int) -> tuple[int, ...]:
    # The first and last stages are the extremes (embedding + most in-flight
    # microbatches vs head + logits); a middle stage is never worse than both.
    return (0,) if pp == 1 else (0, pp - 1)


def _stage_phases(
    spec: ModelSpec,
    setup: TrainingSetup,
    c: AnalyticConstants,
    device: Device,
    stage: int,
) -> list[tuple[Phase, Breakdown]]:
    pb, ab, lb = _dtype_bytes(setup.dtype)
    gb = pb  # gradients in the parameter dtype
    sb = setup.micro_batch * setup.seq_len
    s = setup.seq_len
    tp, pp, dp, zero = setup.tp, setup.pp, setup.dp, setup.zero
    first, last = stage == 0, stage == pp - 1
    layers = spec.layers // pp
    micro = setup.grad_accum
    h, f = spec.hidden, spec.ffn // tp
    recompute = setup.recompute == "full"

    # --- static sizes on this rank ---------------------------------------
    lp = _layer_params_tp(spec, tp)
    emb = M.embedding_params(spec) if first else 0
    head = (spec.hidden * (2 if spec.norm == "layernorm" else 1)) if last else 0
    lm_head = spec.vocab * spec.hidden if last and (not spec.tied_embeddings or pp > 1) else 0
    n_params = emb + layers * lp + head + lm_head
    n_tensors = _param_tensors_stage(spec, layers, first, last, pp)
    state_per_param = 2 if setup.optimizer == "adamw" else 1
    shard = dp if zero >= 1 else 1
    opt_bytes = _ceil_div(n_params, shard) * pb * state_per_param
    if setup.optimizer == "adamw":
        opt_bytes += n_tensors * 4  # fused AdamW: one float32 step scalar per parameter tensor
    param_shard = dp if zero >= 2 else 1
    params_sharded = _ceil_div(n_params, param_shard) * pb
    grads_full = n_params * gb
    grads_kept = _ceil_div(n_params, param_shard) * gb  # after reduce-scatter (ZeRO-2/3) or in full
    ddp_buckets = dp > 1 and zero <= 1  # gradient_as_bucket_view: buckets persist, grads live in them

    # --- activations --------------------------------------------------------
    lb_ = layer_bytes(spec, setup.dtype, device, s, tp)
    layer_act = int(sb * (lb_.per_token + s * lb_.per_token_s)) + lb_.weight_copies
    ckpt_layer = sb * lb_.residual if recompute else layer_act
    pre = _pre_bytes(spec, setup, device, first, ab)
    inflight = min(pp - stage, micro) if pp > 1 else 1
    stage_act = inflight * (pre + layers * ckpt_layer)
    if pp > 1 and not first:
        stage_act += inflight * sb * h * ab  # the received activation of each in-flight microbatch
    fb = 2 if setup.dtype == "bf16-mixed" else ab  # FFN-width tensors: the linear outputs' dtype
    fwd_temp = int(sb * (ab * c.fwd_temp_h * h + fb * c.fwd_temp_f * f))
    if recompute:
        # inside a checkpointed layer nothing is saved, but its FFN intermediates coexist briefly
        ffn_temp = c.ckpt_fwd_temp_f if spec.gated_mlp else c.ckpt_fwd_temp_f_gelu
        fwd_temp = int(sb * (ab * c.ckpt_fwd_temp_h * h + fb * ffn_temp * f + s * lb_.per_token_s))
    bwd_temp = int(sb * (ab * c.bwd_temp_h * h + fb * c.bwd_temp_f * f))
    if setup.dtype == "bf16-mixed":
        bwd_temp += 2 * _largest_linear(spec, tp)  # bf16 weight grad before its float32 cast
    recompute_extra = layer_act if recompute else 0  # one layer re-run during its backward

    # autocast's CUDA weight cache keeps bf16 copies of every linear weight until the forward
    # ends; without recompute they are saved for backward anyway (inside layer_act).
    cache = 0
    if device == "cuda" and setup.dtype == "bf16-mixed" and recompute:
        cache = layers * lb_.weight_copies

    # --- ZeRO-2/3: unsharded (all-gathered) parameters in flight ------------
    full_layer_bytes = lp * pb
    root_bytes = (emb + head + lm_head) * pb
    if zero >= 2 and dp > 1:
        gathered_fwd = (
            root_bytes + layers * full_layer_bytes if zero == 2 else root_bytes + 2 * full_layer_bytes
        )
        gathered_bwd_start = gathered_fwd if zero == 2 else root_bytes + 2 * full_layer_bytes
        rs_buffer = 2 * lp * gb  # unsharded grads of a layer + the reduce-scatter input copy
    else:
        gathered_fwd = gathered_bwd_start = 0
        rs_buffer = 0
    gathered_fwd = max(0, gathered_fwd - (params_sharded if gathered_fwd else 0)) if False else gathered_fwd

    # gradients present during forward: DDP buckets always; otherwise from earlier micro-steps
    grads_in_fwd = 0
    if ddp_buckets:
        grads_in_fwd = grads_full
    elif micro > 1 or (pp > 1 and micro > pp - stage):
        grads_in_fwd = grads_kept

    base_params = params_sharded
    out: list[tuple[Phase, Breakdown]] = []

    # forward: all layers' saved activations + one layer's transients
    out.append(
        (
            "forward",
            Breakdown(
                base_params + gathered_fwd + cache, grads_in_fwd, opt_bytes, stage_act,
                fwd_temp + (lb_.weight_copies if recompute and device == "cpu" else 0),
            ),
        )
    )

    if last:
        # the final norm runs at the end of the forward phase
        norm_saved = _post_bytes(spec, setup, ab) - (2 * spec.vocab * h if setup.dtype == "bf16-mixed" else 0)
        norm_temp = sb * 4 * h if spec.norm == "rmsnorm" else 0
        out.append(
            (
                "forward",
                Breakdown(base_params + gathered_fwd + cache, grads_in_fwd, opt_bytes, stage_act + norm_saved,
                          norm_temp),
            )
        )

    # loss: last stage only (LM head, float32 logits, log-softmax and their gradients)
    post = 0
    if last:
        post = _post_bytes(spec, setup, ab)
        logits = sb * spec.vocab
        saved_ls = 4 * logits
        fwd_side = lb * logits + (4 * logits if lb != 4 else 0)
        bwd_side = 8 * logits
        loss_act = stage_act + post + saved_ls
        out.append(
            (
                "loss",
                Breakdown(
                    base_params + gathered_fwd + cache, grads_in_fwd, opt_bytes, loss_act, fwd_side
                ),
            )
        )
        out.append(
            (
                "loss",
                Breakdown(base_params + gathered_bwd_start, grads_in_fwd, opt_bytes, loss_act, bwd_side),
            )
        )
        # LM head backward: bf16 logit gradient (and its float32 source), the head's weight gradient
        head_grad = lm_head * gb if not spec.tied_embeddings or pp > 1 else spec.vocab * spec.hidden * gb
        g_out = lb * logits  # the float32 gradient was freed by the cast's backward
        if grads_in_fwd:
            g_out += head_grad  # the new head gradient, before it is added into the existing one
        out.append(
            (
                "backward",
                Breakdown(
                    base_params + gathered_bwd_start,
                    max(grads_in_fwd, head_grad if not ddp_buckets else grads_full),
                    opt_bytes,
                    stage_act + post,
                    g_out + sb * h * ab,
                ),
            )
        )

    # backward through the decoder layers: linear between its two ends
    head_g = ((head + lm_head) * gb) if last else 0
    if spec.tied_embeddings and last and pp == 1:
        head_g += spec.vocab * spec.hidden * gb
    if zero >= 2 and dp > 1:
        head_g = _ceil_div(head_g, dp)
        layer_g = _ceil_div(lp * gb, dp)
    else:
        layer_g = lp * gb
    grads_at = (lambda done: grads_full) if ddp_buckets else (
        (lambda done: grads_kept) if grads_in_fwd else (lambda done: done)
    )
    act_rest = stage_act - (inflight - 1) * 0  # all in-flight microbatches stay saved on this stage
    top_layers = layers
    # start: first layer to go backward, all activations saved, head grads done
    g_start = grads_at(head_g + layer_g)
    gathered_layer = (
        (root_bytes + layers * full_layer_bytes) if zero == 2 and dp > 1
        else (root_bytes + 2 * full_layer_bytes) if zero == 3 and dp > 1 else 0
    )
    out.append(
        (
            "backward",
            Breakdown(base_params + gathered_layer, g_start, opt_bytes, act_rest,
                      bwd_temp + recompute_extra + rs_buffer),
        )
    )
    # end: last layer's backward, every other layer's gradient done
    one_layer_act = (pre + ckpt_layer) + (inflight - 1) * (pre + layers * ckpt_layer)
    emb_g = (emb * gb) if first else 0
    g_end = grads_at(head_g + top_layers * layer_g)
    gathered_end = (
        (root_bytes + full_layer_bytes) if zero == 2 and dp > 1
        else (root_bytes + 2 * full_layer_bytes) if zero == 3 and dp > 1 else 0
    )
    out.append(
        (
            "backward",
            Breakdown(base_params + gathered_end, g_end, opt_bytes, one_layer_act,
                      bwd_temp + recompute_extra + rs_buffer),
        )
    )
    if first:
        # embedding backward: its dense gradient (a temporary when tied: added into the head's)
        emb_temp = spec.vocab * spec.hidden * (4 if setup.dtype == "bf16-mixed" else ab)
        g_emb = grads_at(head_g + top_layers * layer_g + (0 if spec.tied_embeddings and pp == 1 else 0))
        out.append(
            (
                "backward",
                Breakdown(base_params + (root_bytes if zero >= 2 and dp > 1 else 0), g_emb, opt_bytes,
                          (inflight - 1) * (pre + layers * ckpt_layer) + pre,
                          emb_temp + sb * h * ab + (emb_g if spec.tied_embeddings and pp == 1 else 0) * 0),
            )
        )

    # optimizer: parameters, gradients, state (fused AdamW / SGD keep no further temporaries)
    out.append(("optimizer", Breakdown(base_params, grads_full if ddp_buckets else grads_kept,
                                       opt_bytes, 0, 0)))
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _layer_params_tp(spec: ModelSpec, tp: int) -> int:
    """One decoder layer's parameters on a tensor-parallel rank (Megatron column/row split, norms kept)."""
    if tp == 1:
        return M.layer_params(spec)
    h, hd = spec.hidden, spec.head_dim
    n = M.layer_linear_params(spec) // tp
    if spec.qkv_bias:
        n += (spec.heads + 2 * spec.kv_heads) * hd // tp
    if spec.o_bias:
        n += h
    if spec.mlp_bias:
        n += (2 if spec.gated_mlp else 1) * spec.ffn // tp + h
    n += 2 * h * (2 if spec.norm == "layernorm" else 1)
    return n


def _largest_linear(spec: ModelSpec, tp: int) -> int:
    h = spec.hidden
    return max(h * spec.ffn // tp, h * spec.heads * spec.head_dim // tp)


def _param_tensors_stage(spec: ModelSpec, layers: int, first: bool, last: bool, pp: int) -> int:
    n = layers * M.layer_param_tensors(spec)
    if first:
        n += 2 if spec.learned_positions else 1
    if last:
        n += (2 if spec.norm == "layernorm" else 1) + (0 if spec.tied_embeddings and pp == 1 else 1)
    return n


def _pre_bytes(spec: ModelSpec, setup: TrainingSetup, device: Device, first: bool, ab: int) -> int:
    """Saved before the first layer: ids, positions/rotary tables, embedding dropout mask."""
    sb = setup.micro_batch * setup.seq_len
    n = 8 * sb if first else 0  # int64 input ids (embedding backward)
    if spec.learned_positions:
        n += 8 * setup.seq_len if first else 0
        if spec.embd_dropout > 0 and first:
            n += sb * spec.hidden * ((4 if setup.dtype != "bf16" else 2) if device == "cpu" else 1)
    else:
        rot = 2 if setup.dtype == "bf16" else 4
        n += 2 * setup.seq_len * spec.head_dim * rot  # cos and sin
    if spec.sliding_window is not None and setup.seq_len > spec.sliding_window:
        n += setup.micro_batch * setup.seq_len * setup.seq_len  # the boolean sliding-window mask
    return n


def _post_bytes(spec: ModelSpec, setup: TrainingSetup, ab: int) -> int:
    """Saved by the final norm and the LM head's input (+ its bf16 weight copy under autocast), and labels."""
    sb = setup.micro_batch * setup.seq_len
    h = spec.hidden
    if spec.norm == "rmsnorm":
        if setup.dtype == "fp32":
            n = sb * (12 * h + 4)
        elif setup.dtype == "bf16":
            n = sb * (8 * h + 4)
        else:
            n = sb * (10 * h + 4)
    elif setup.dtype == "bf16-mixed":
        n = sb * (6 * h + 8)
    else:
        n = sb * (2 * ab * h + 2 * ab)
    if setup.dtype == "bf16-mixed":
        n += 2 * spec.vocab * h
    return n + 8 * sb  # shifted labels kept by nll_loss


_ = math
_unused: LayerBytes | None = None
