"""Closed-form peak tensor memory of the worst rank over a steady-state reference training step.

The step (DESIGN.md §3) is accounted phase by phase: ``forward`` (embedding
and decoder layers), ``loss`` (LM head, float32 logits, cross-entropy and the
start of backward through them), ``backward`` (decoder layers in reverse, the
gradients growing as the saved activations are freed) and ``optimizer``.  The
peak is the largest phase; the breakdown is taken at that moment and sums to
it.  Pure and cheap: a handful of arithmetic per call, no world building.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass, replace

from frenzyd.marp import model as M
from frenzyd.marp.activations import AttnKernel, Device, layer_bytes
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
    bwd_temp_h: float = 1.3
    """Backward: gradient tensors of width ``hidden`` alive at once inside a layer's backward
    (fitted: 1.29 on the fixed grid's fit split; the earlier 3.0 over-predicted small recomputed
    models by up to 12 % on the random held-out grid)."""
    bwd_temp_f: float = 0.07
    """Backward: gradient tensors of FFN width alive at once inside a layer's backward (fitted: 0.066)."""
    ckpt_fwd_temp_h: float = 2.0
    """Forward under full recompute: hidden-width tensors alive at once inside a checkpointed layer."""
    ckpt_fwd_temp_f: float = 3.0
    """Forward under full recompute: FFN-width tensors alive at once inside a checkpointed SwiGLU layer."""
    ckpt_fwd_temp_f_gelu: float = 7.5
    """The same for GPT-2's tanh-approximated GELU, which builds more intermediates of FFN width."""
    safety: float = 1.0
    """Multiplier on the final tensor peak (1.0 = none; raise to trade accuracy for OOM safety)."""


DEFAULT_CONSTANTS = AnalyticConstants()


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
    sdpa_backend: AttnKernel | None = None,
    per_rank: bool = False,
) -> Prediction:
    """Peak tensor bytes of the worst rank of ``setup``'s plan over a steady-state step.

    ``device`` picks whose kernels and autocast are modelled ("cuda" by
    default; "cpu" for scoring against CPU runs).  Raises ConfigError/PlanError
    (via :func:`frenzyd.marp.validate.validate`) when the setup is impossible.
    No runtime overhead is included (see ``overhead.py``).  ``sdpa_backend``
    forces the attention kernel (as ``torch.nn.attention.sdpa_kernel`` does);
    by default the one torch selects on ``device`` is modelled.  ``per_rank``
    evaluates every pipeline stage (not only the first and last, the extremes)
    and fills ``rank_peaks`` with one peak per rank of the plan, in the trainer's
    mesh order ``(pp, dp, tp)``: rank ``r`` is stage ``r // (dp * tp)``, data-
    parallel rank ``r // tp % dp``.  The ranks of a stage differ only under
    ZeRO-1, whose partition of the optimizer state is uneven (see
    :func:`_zero1_partition`); the worst one is the peak.
    """
    if check:
        validate(model, setup)
    best: tuple[int, Phase, Breakdown] | None = None
    phases: dict[str, int] = {}
    stage_peaks: list[int] = []  # per (stage, data-parallel rank) evaluated, in mesh order
    uneven = per_rank and setup.zero == 1 and setup.dp > 1
    for stage in range(setup.pp) if per_rank else _stages(setup.pp):
        for dp_rank in range(setup.dp) if uneven else (None,):
            stage_peak = 0
            for phase, bd in _stage_phases(model, setup, constants, device, stage, sdpa_backend=sdpa_backend,
                                           dp_rank=dp_rank):
                total = bd.total
                stage_peak = max(stage_peak, total)
                if total > phases.get(phase, -1):
                    phases[phase] = total
                if best is None or total > best[0]:
                    best = (total, phase, bd)
            stage_peaks.append(stage_peak)
    assert best is not None
    peak, phase, bd = best
    if constants.safety != 1.0:
        extra = int(peak * (constants.safety - 1.0))
        bd = Breakdown(bd.parameters, bd.gradients, bd.optimizer, bd.activations, bd.temporaries + extra)
        peak += extra
        phases = {k: int(v * constants.safety) for k, v in phases.items()}
        phases[phase] = peak
        stage_peaks = [int(v * constants.safety) for v in stage_peaks]
        stage_peaks[stage_peaks.index(max(stage_peaks))] = peak
    rank_peaks: tuple[int, ...] = ()
    if per_rank:  # tp shards are symmetric; dp ranks too, unless ZeRO-1 (evaluated one by one)
        rank_peaks = tuple(v for v in stage_peaks for _ in range(setup.tp * (1 if uneven else setup.dp)))
    return Prediction(
        model=model.name,
        params=M.param_count(model),
        peak_bytes=peak,
        peak_phase=phase,
        breakdown=bd,
        method="analytic",
        phases=phases,
        rank_peaks=rank_peaks,
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
    *,
    sdpa_backend: AttnKernel | None = None,
    dp_rank: int | None = None,
) -> list[tuple[Phase, Breakdown]]:
    """The candidate peak moments of one pipeline stage, each as a Breakdown, tagged with its phase.

    ``dp_rank``: whose ZeRO-1 partition of the optimizer state (None: the largest one's)."""
    pb, ab, lb = _dtype_bytes(setup.dtype)
    gb = pb  # gradients take the parameter dtype
    fb = 2 if setup.dtype == "bf16-mixed" else ab  # FFN-width tensors: the linear outputs' dtype
    s = setup.seq_len
    sb = setup.micro_batch * s
    tp, pp, dp, zero = setup.tp, setup.pp, setup.dp, setup.zero
    first, last = stage == 0, stage == pp - 1
    layers = spec.layers // pp
    micro = setup.grad_accum
    h, f = spec.hidden, spec.ffn // tp
    recompute = setup.recompute == "full"
    # FSDP2 on a one-rank mesh still all-gathers into separate unsharded buffers and copies the
    # gradients through its reduce-scatter buffers (foreach_all_gather / foreach_reduce, torch 2.13)
    fsdp = zero >= 2
    tied_here = spec.tied_embeddings and pp == 1  # pipeline stages hold their own copy of a tied table

    # --- static sizes on this rank -----------------------------------------------------------
    lp = _layer_params_tp(spec, tp)
    emb = M.embedding_params(spec) if first else 0
    final_norm = spec.hidden * (2 if spec.norm == "layernorm" else 1) if last else 0
    lm_head = spec.vocab * spec.hidden if last and not tied_here else 0
    n_params = emb + layers * lp + final_norm + lm_head
    state_params = _ceil_div(n_params, dp if zero >= 1 else 1)
    state_tensors = _param_tensors_stage(spec, layers, first, last, pp)
    if zero == 1 and dp > 1:  # ZeroRedundancyOptimizer's partition: whole tensors, unevenly
        parts = _zero1_partition(tuple(_layer_tensor_sizes(spec, tp)), layers,
                                 tuple(_outer_tensor_sizes(spec, first, last, pp)), dp)
        state_params, state_tensors = parts[dp_rank] if dp_rank is not None else max(parts)
    opt_bytes = state_params * pb * (2 if setup.optimizer == "adamw" else 1)
    if setup.optimizer == "adamw":
        opt_bytes += state_tensors * 4  # fused AdamW step scalars
    params = _ceil_div(n_params, dp if fsdp else 1) * pb
    if spec.family == "llama":
        params += 2 * (spec.head_dim // 2) * 4  # rotary inv_freq buffers (float32, two copies)
    params += layers * _layer_buffers_tp(spec, tp)
    grads_full = n_params * gb
    grads_kept = _ceil_div(n_params, dp if fsdp else 1) * gb  # reduce-scattered shards under ZeRO-2/3
    # gradient_as_bucket_view: the buckets persist and hold the grads.  A pipeline stage is not wrapped in
    # DDP (the trainer averages its accumulated gradients after the schedule, in place)
    ddp_buckets = dp > 1 and zero <= 1 and pp == 1

    # --- activations ----------------------------------------------------------------------------
    lbytes = layer_bytes(spec, setup.dtype, device, s, tp, kernel=sdpa_backend)
    layer_act = int(sb * (lbytes.per_token + s * lbytes.per_token_s)) + lbytes.weight_copies
    kept_layer = sb * lbytes.residual if recompute else layer_act  # checkpointing keeps the layer input
    pre = _pre_bytes(spec, setup, device, first)
    # 1F1B (torch's Schedule1F1B): stage k runs w = min(pp - k, m) warm-up forwards, then alternates one
    # backward and one forward; every micro-batch forwarded and not yet backwarded keeps its activations
    warmup = min(pp - stage, micro) if pp > 1 else 1
    one_micro = pre + layers * kept_layer
    # PipelineStage's receive buffers, one per micro-batch, made in the first step and kept: a non-first
    # stage's input activations (the buffer is the input itself) and a non-last stage's output gradients
    p2p = micro * sb * h * ab * ((not first) + (not last)) if pp > 1 else 0
    # autocast's bf16 weight copies saved for backward (no recompute) are copies of weights, not of the
    # batch: the breakdown files them under parameters, as torch's MemTracker does (sums are unchanged)
    wc = lbytes.weight_copies if not recompute else 0

    fwd_temp = int(sb * (ab * c.fwd_temp_h * h + fb * c.fwd_temp_f * f))
    if recompute:
        ffn_temp = c.ckpt_fwd_temp_f if spec.gated_mlp else c.ckpt_fwd_temp_f_gelu
        # the math kernel's score matrices are counted on top of the MLP's intermediates (an
        # over-estimate of this non-peak moment; under-counting it would risk a pipeline stage's peak)
        fwd_temp = int(sb * (ab * c.ckpt_fwd_temp_h * h + fb * ffn_temp * f + s * lbytes.per_token_s))
    bwd_temp = int(sb * (ab * c.bwd_temp_h * h + fb * c.bwd_temp_f * f))
    if lbytes.score_per_token_s:
        # math kernel: by the attention's backward the MLP's activations are freed, and one gradient
        # of a b·a·s² probability matrix is alive at a time
        if lbytes.math_fwd_scores:
            # no dropout: the probabilities' and the scores' gradients at once, beside the output's and
            # V's gradients; everything saved after the attention (MLP, second norm) is freed by then
            attn_temp = sb * (
                s * lbytes.score_per_token_s * lbytes.math_bwd_scores
                - lbytes.after_attn_per_token
                + lbytes.math_bwd_per_token
            )
        else:
            attn_temp = sb * (s * lbytes.score_per_token_s - lbytes.mlp_per_token + ab * c.bwd_temp_h * h)
        bwd_temp = max(bwd_temp, int(attn_temp))
    # math kernel without dropout (CUDA fp32 with grouped K/V heads): inside the last layer's
    # attention its MLP has not run yet, and the kernel's score-sized intermediates are alive
    transient = attn_part = 0
    if lbytes.math_fwd_scores:
        transient = int(
            sb * (s * lbytes.score_per_token_s * lbytes.math_fwd_scores + lbytes.math_fwd_per_token)
            + lbytes.math_fwd_per_s2 * s * s
        )
        if recompute:  # the checkpointed layer's attention intermediates, probabilities included
            attn_part = int(sb * (lbytes.per_token - lbytes.after_attn_per_token + s * lbytes.per_token_s))
    if setup.dtype == "bf16-mixed":
        bwd_temp += 2 * _largest_linear(spec, tp)  # a bf16 weight gradient before its float32 cast
    if recompute:
        bwd_temp += layer_act  # the layer being re-run holds all its activations during its backward
    # autocast's weight cache (CUDA and, in torch 2.13, CPU too) keeps a bf16 copy of every linear
    # weight until the forward ends; without recompute those copies are saved for backward anyway.
    cache = layers * lbytes.weight_copies if setup.dtype == "bf16-mixed" and recompute else 0
    # 1F1B's last stage: the schedule keeps a micro-batch's output (its logits, in their dtype) from its
    # forward until its backward has run (PipelineStage's forward cache); the plain step drops them
    kept_out = lb * setup.micro_batch * s * spec.vocab if pp > 1 and last else 0

    # --- ZeRO-2/3 (FSDP2): unsharded parameters in flight ---------------------------------------
    # the root group is not resharded after forward (FSDP2's own choice for the root, which the
    # trainer leaves to it: backward would gather it again at once)
    root = (emb + final_norm + lm_head) * pb
    if fsdp:
        gathered_all = root + layers * lp * pb if zero == 2 else root + 2 * lp * pb  # ZeRO-3: 1 + prefetch
        gathered_last = root + lp * pb if zero == 2 else root + 2 * lp * pb
        if pp > 1 and micro > 1:  # not resharded after backward (above): all layers gathered by then
            gathered_last = root + layers * lp * pb
        # ZeRO-3 around the loss: the layers were resharded after forward; backward gathers the last one
        gathered_loss = gathered_all if zero == 2 else root + lp * pb
        # a pipeline stage's root module ends at the logits (the schedule computes the loss): its
        # pre-backward, which gathers the last layer, runs only once the loss's backward reaches them
        gathered_at_loss = gathered_loss if zero == 2 or pp == 1 else root
        # under a pipeline the layers stay gathered after their backward (above): all of them by the
        # embedding's backward
        gathered_emb = root + layers * lp * pb if pp > 1 else root
        rs_buffer = 2 * lp * gb  # a layer's unsharded gradients + the reduce-scatter input
        if _cpu_chunk_cat_pads(device, dp, _layer_rows(spec, tp)):
            rs_buffer += lp * gb
        # FSDPParamGroup keeps the last reduce-scatter input (reduce_scatter_states, one buffer by
        # default) until the next group's post-backward: alive through the next layer's backward
        held_rs = lp * gb if pp == 1 else 0  # a pipeline stage reduce-scatters after its last backward
        # the root group's gradients (head, final norm, embedding) stay unsharded until its
        # reduce-scatter at the very end of backward
        head_pending = (final_norm + lm_head + (spec.vocab * h if tied_here else 0)) * gb
        root_grads = (emb + final_norm + lm_head) * gb
        root_rs_temp = root_grads
        root_rows = [r for r, n in ((spec.vocab, emb + lm_head), (spec.hidden, final_norm),
                                    (spec.max_positions if spec.learned_positions else 0, emb)) if n and r]
        if _cpu_chunk_cat_pads(device, dp, root_rows):
            root_rs_temp += root_grads
        head_g = 0
        layer_g = _ceil_div(lp * gb, dp)
    else:
        gathered_all = gathered_last = gathered_loss = gathered_at_loss = gathered_emb = 0
        rs_buffer = held_rs = 0
        head_pending = root_grads = root_rs_temp = 0
        head_g = (final_norm + lm_head + (spec.vocab * h if tied_here and last else 0)) * gb
        layer_g = lp * gb

    # gradients present once the step's first backward has run: DDP's buckets always, else those of
    # earlier micro-steps
    if ddp_buckets:
        grads_early = grads_full
    elif micro > 1 or (pp > 1 and micro > pp - stage):
        # under a pipeline, FSDP2 keeps the unsharded gradients: PipelineStage runs every micro-batch's
        # backward with set_requires_gradient_sync(False) and set_reshard_after_backward(False), and
        # reduce-scatters only after the last one (perform_reduce_grad; torch 2.13)
        grads_early = grads_full if fsdp and pp > 1 else grads_kept
    else:
        grads_early = 0
    grads_first = grads_full if ddp_buckets else 0  # present before the step's first backward

    def moments(inflight: int, grads_early: int, *, forward: bool) -> list[tuple[Phase, Breakdown]]:
        """The moments with ``inflight`` micro-batches' activations alive (the one in flight included) and
        ``grads_early`` bytes of gradients from before; ``forward``: with the forward phase's moments."""
        stage_act = inflight * one_micro
        others = (inflight - 1) * one_micro  # other in-flight micro-batches, untouched by this backward
        stage_wc = inflight * layers * wc
        others_wc = (inflight - 1) * layers * wc
        math_fwd: tuple[int, int] | None = None
        if lbytes.math_fwd_scores:
            math_fwd = ((stage_act, attn_part + transient) if recompute
                        else (stage_act - int(sb * lbytes.after_attn_per_token), transient))

        def grads_at(done: int) -> int:
            return grads_early if grads_early else done

        # the forward's moments: its end, and inside the last layer's attention on the math kernel
        ends = [(stage_act, fwd_temp)] + ([math_fwd] if math_fwd is not None else [])
        out: list[tuple[Phase, Breakdown]] = [
            ("forward", Breakdown(params + gathered_all + cache + stage_wc, grads_early, opt_bytes,
                                  act - stage_wc, temp))
            for act, temp in (ends if forward else [])
        ]
        # (a last stage holds one micro-batch at a time, m > w: its moments always come with the forward's)
        if last:
            # the final norm ends the forward phase
            norm_saved = _final_norm_bytes(spec, setup)
            norm_temp = sb * 4 * h if spec.norm == "rmsnorm" else 0
            out.append(
                (
                    "forward",
                    Breakdown(
                        params + gathered_all + cache + stage_wc,
                        grads_early,
                        opt_bytes,
                        stage_act + norm_saved - stage_wc,
                        norm_temp,
                    ),
                )
            )
            # loss: LM head, float32 logits, log-softmax (saved) and, at backward start, two logit gradients
            post = _post_bytes(spec, setup)
            logits = sb * spec.vocab
            loss_act = stage_act + post + 4 * logits
            fwd_side = lb * logits + (4 * logits if lb != 4 else 0)  # logits + their float32 copy
            if pp > 1 and lb == 4:
                # the pipeline's loss (trainer.parallel.causal_lm_loss) shifts the logits, not the labels:
                # float32 logits[:, :-1] are copied by the reshape (a float32 copy of bf16 ones is made
                # anyway)
                fwd_side += 4 * setup.micro_batch * (s - 1) * spec.vocab
            out.append(
                (
                    "loss",
                    Breakdown(
                        params + gathered_at_loss + cache + stage_wc,
                        grads_early,
                        opt_bytes,
                        loss_act - stage_wc,
                        fwd_side,
                    ),
                )
            )
            out.append(
                (
                    "loss",
                    Breakdown(
                        params + gathered_at_loss + stage_wc,
                        grads_early,
                        opt_bytes,
                        loss_act + kept_out - stage_wc,
                        8 * logits,
                    ),
                )
            )
            # LM head backward: the logits' gradient in their dtype (the float32 one was freed by the cast's
            # backward), the head's weight gradient and the hidden-state gradient
            head_w_grad = spec.vocab * h * gb if (lm_head or tied_here) else 0
            temp = lb * logits + sb * h * ab + (head_w_grad if grads_early and not fsdp else 0)
            out.append(
                (
                    "backward",
                    Breakdown(
                        params + gathered_loss + stage_wc,
                        grads_at(0) + head_w_grad if fsdp else grads_at(head_w_grad),
                        opt_bytes,
                        stage_act + post + kept_out - stage_wc,
                        temp,
                    ),
                )
            )

        # backward through the decoder layers: memory is linear between the two ends
        out.append(
            (
                "backward",
                Breakdown(
                    params + gathered_all + stage_wc,
                    grads_at(head_g + layer_g) + head_pending,
                    opt_bytes,
                    stage_act + kept_out - stage_wc,
                    bwd_temp + held_rs,
                ),
            )
        )
        out.append(
            (
                "backward",
                Breakdown(
                    params + gathered_last + others_wc + wc,
                    grads_at(head_g + layers * layer_g) + head_pending,
                    opt_bytes,
                    others + pre + kept_layer + kept_out - others_wc - wc,
                    bwd_temp + held_rs,
                ),
            )
        )
        if fsdp:
            # a layer's reduce-scatter (the last one's, the most activations still alive): after its
            # backward, so its activations and temporaries are freed and its parameters resharded
            # (FSDPParamGroup.post_backward reshards before foreach_reduce); its unsharded gradients and
            # the flat reduce-scatter input at once, the output shard after the former are freed
            done = kept_layer if recompute else layer_act
            out.append(
                (
                    "backward",
                    Breakdown(
                        params + gathered_all - lp * pb + stage_wc - wc,
                        grads_at(head_g + layer_g) + head_pending,
                        opt_bytes,
                        stage_act - done + kept_out - (stage_wc - wc),
                        rs_buffer,
                    ),
                )
            )
        if first:
            # embedding backward: a dense vocab x hidden gradient; when tied, the autograd engine sums it
            # with the head's pending gradient out of place (a third vocab x hidden tensor), except under
            # FSDP2 with bf16-mixed, where it is summed in place.  Measured both ways (the trainer's GPT-2
            # dp2 ZeRO-3 bf16-mixed; bench_marp's GPT-2 bf16-mixed rows without FSDP, DDP fp32); why the
            # engine differs is not established
            emb_temp = spec.vocab * h * (4 if setup.dtype == "bf16-mixed" else ab)
            if tied_here and not (fsdp and setup.dtype == "bf16-mixed"):
                emb_temp += spec.vocab * h * gb
            # that pending head gradient is counted in grads_at(head_g ...) only while no gradients exist
            # yet; with DDP's buckets or an earlier micro-step's gradients it is a tensor of its own beside
            # them (the tied weight's AccumulateGrad runs after the sum)
            pending_tied = spec.vocab * h * gb if tied_here and grads_early and not fsdp else 0
            out.append(
                (
                    "backward",
                    Breakdown(
                        params + gathered_emb + others_wc,
                        grads_at(head_g + layers * layer_g) + head_pending + pending_tied,
                        opt_bytes,
                        others + pre - others_wc,
                        emb_temp + sb * h * ab + held_rs,  # the first layer's reduce-scatter input (ZeRO-2/3)
                    ),
                )
            )
        if fsdp:
            # the root group's reduce-scatter: its unsharded gradients and the flat input copy (the
            # unsharded gradients are released before the output shard is allocated).  Its parameters
            # are sharded again by then: FSDPParamGroup.post_backward reshards (reshard_after_backward)
            # before foreach_reduce
            out.append(
                (
                    "backward",
                    Breakdown(
                        params + others_wc,
                        grads_at(layers * layer_g) + root_grads,
                        opt_bytes,
                        others - others_wc,
                        root_rs_temp,
                    ),
                )
            )
        return out

    if pp > 1 and micro == warmup:
        # every forward of the step runs before its first backward (m <= pp - k): the forwards and the
        # first backward hold all m micro-batches and only the gradients from before the step; the
        # second backward holds one micro-batch fewer, beside the first one's gradients
        out = moments(warmup, grads_first, forward=True)
        if micro > 1:
            out += moments(warmup - 1, grads_early, forward=False)
    else:
        out = moments(warmup, grads_early, forward=True)

    out = [(ph, replace(bd, activations=bd.activations + p2p)) for ph, bd in out]
    # optimizer: parameters, gradients, state (fused AdamW and SGD keep no further temporaries)
    out.append(("optimizer", Breakdown(params, grads_full if ddp_buckets else grads_kept, opt_bytes, p2p, 0)))
    return out


def _cpu_chunk_cat_pads(device: Device, dp: int, rows: list[int]) -> bool:
    """FSDP2's reduce-scatter copy-in (``torch._chunk_cat(grads, 0, dp, out=...)``) on the CPU: where a
    gradient's first dimension does not divide by ``dp``, the CPU implementation pads every tensor
    into a new one and concatenates those (a second copy of the group's gradients, measured on
    tiny-llama dp3); CUDA has a fused kernel that writes ``out`` directly."""
    return device == "cpu" and dp > 1 and any(r % dp for r in rows)


def _layer_rows(spec: ModelSpec, tp: int) -> list[int]:
    """First dimensions of a decoder layer's parameters on a tp rank (what FSDP2 shards)."""
    h = spec.hidden
    return [h, spec.heads * spec.head_dim // tp, spec.kv_heads * spec.head_dim // tp, spec.ffn // tp]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _layer_params_tp(spec: ModelSpec, tp: int) -> int:
    """One decoder layer's parameters on a tensor-parallel rank (Megatron column/row split, norms kept).

    A column-wise bias is split with its weight (``ColwiseParallel``), except GPT-2's: the trainer's
    ``TPConv1D`` keeps every bias full (``frenzyd/trainer/tp_gpt2.py``).
    """
    if tp == 1:
        return M.layer_params(spec)
    h, hd = spec.hidden, spec.head_dim
    col = 1 if spec.family == "gpt2" else tp
    n = M.layer_linear_params(spec) // tp
    if spec.qkv_bias:
        n += (spec.heads + 2 * spec.kv_heads) * hd // col
    if spec.o_bias:
        n += h
    if spec.mlp_bias:
        n += (2 if spec.gated_mlp else 1) * spec.ffn // col + h
    n += 2 * h * (2 if spec.norm == "layernorm" else 1)
    return n


def _layer_buffers_tp(spec: ModelSpec, tp: int) -> int:
    """Bytes of one decoder layer's buffers on a tensor-parallel rank: GPT-2's ``TPConv1D`` keeps the
    int64 indices of its own columns of ``c_attn`` and ``c_fc`` (to add its part of the full bias)."""
    if tp == 1 or spec.family != "gpt2":
        return 0
    return 8 * ((spec.heads + 2 * spec.kv_heads) * spec.head_dim + spec.ffn) // tp


def _layer_tensor_sizes(spec: ModelSpec, tp: int) -> list[int]:
    """The parameter tensors of one decoder layer on a tensor-parallel rank, as the trainer holds them
    (their sum is :func:`_layer_params_tp`)."""
    h, q, kv, f = spec.hidden, spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim, spec.ffn
    norms = [h] * (4 if spec.norm == "layernorm" else 2)
    if spec.family == "gpt2":  # Conv1D: fused c_attn; TPConv1D keeps the biases full
        return [h * 3 * q // tp, 3 * q, q * h // tp, h, h * f // tp, f, f * h // tp, h, *norms]
    out = [h * q // tp, h * kv // tp, h * kv // tp, q * h // tp]
    if spec.qkv_bias:
        out += [q // tp, kv // tp, kv // tp]
    if spec.o_bias:
        out.append(h)
    out += [h * f // tp] * (3 if spec.gated_mlp else 2)
    if spec.mlp_bias:
        out += [f // tp] * (2 if spec.gated_mlp else 1) + [h]
    return out + norms


def _outer_tensor_sizes(spec: ModelSpec, first: bool, last: bool, pp: int) -> list[int]:
    """A stage's parameter tensors outside its decoder layers: embeddings (first), final norm, head (last)."""
    out: list[int] = []
    if first:
        out.append(spec.vocab * spec.hidden)
        if spec.learned_positions:
            out.append(spec.max_positions * spec.hidden)
    if last:
        out += [spec.hidden] * (2 if spec.norm == "layernorm" else 1)
        if not (spec.tied_embeddings and pp == 1):
            out.append(spec.vocab * spec.hidden)
    return out


@functools.lru_cache(maxsize=4096)
def _zero1_partition(
    layer: tuple[int, ...], layers: int, outer: tuple[int, ...], dp: int
) -> tuple[tuple[int, int], ...]:
    """(parameters, tensors) of each data-parallel rank's ZeRO-1 partition of a stage whose tensors are
    ``layer`` x ``layers`` and ``outer``: torch's ``ZeroRedundancyOptimizer`` gives whole tensors, largest
    first, to the rank holding the fewest parameters so far (the lowest rank on a tie).  A stage with one
    large table (the first stage's embedding, the last's head) puts it on one rank.  Cached: the planner
    asks again for every micro-batch it tries."""
    heap = [(0, r) for r in range(dp)]
    counts = [0] * dp
    for n in sorted(list(layer) * layers + list(outer), reverse=True):
        total, r = heapq.heappop(heap)
        counts[r] += 1
        heapq.heappush(heap, (total + n, r))
    held = {r: total for total, r in heap}
    return tuple((held[r], counts[r]) for r in range(dp))


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


def _pre_bytes(spec: ModelSpec, setup: TrainingSetup, device: Device, first: bool) -> int:
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


def _final_norm_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Saved by the final norm, its output included (the LM head's input)."""
    sb = setup.micro_batch * setup.seq_len
    h = spec.hidden
    if spec.norm == "rmsnorm":
        per = {"fp32": 12 * h + 4, "bf16": 8 * h + 4}.get(setup.dtype, 10 * h + 4)
    elif setup.dtype == "bf16-mixed":
        per = 6 * h + 8
    else:
        d = 4 if setup.dtype == "fp32" else 2
        per = 2 * d * h + 2 * d
    return sb * per


def _post_bytes(spec: ModelSpec, setup: TrainingSetup) -> int:
    """Saved after the last layer: final norm, the LM head's bf16 weight copy (autocast), shifted labels."""
    n = _final_norm_bytes(spec, setup)
    if setup.dtype == "bf16-mixed":
        n += 2 * spec.vocab * spec.hidden
    return n + 8 * setup.micro_batch * setup.seq_len
