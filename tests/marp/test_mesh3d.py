"""3-D meshes (dp x tp x pp, ZeRO 0-3): MARP's per-rank arithmetic and the plans it proposes for the trainer.

The trainer's mesh is ``(pp, dp, tp)``, tp innermost, so rank ``r`` runs pipeline stage
``r // (dp * tp)``; a stage's parameters are its layers' tensor-parallel shards (plus the
embedding on the first stage, the final norm and head on the last), then sharded over dp by
ZeRO as on one stage alone.  Pure arithmetic: no torch.
"""

from __future__ import annotations

import pytest

from frenzyd.marp.analytic import predict
from frenzyd.marp.combos import combo_of, runs
from frenzyd.marp.model import load_model, spec_from_config
from frenzyd.marp.plans import feasible_plans
from frenzyd.marp.spec import GpuPool, TrainingSetup

TINY = load_model("tiny-llama")  # h 256, 8 heads x 32, 2 kv heads, F 688, V 8000, 4 layers, untied


def _setup(zero: int, **kw: object) -> TrainingSetup:
    base: dict[str, object] = {"seq_len": 64, "micro_batch": 1, "dtype": "fp32", "global_batch": 8, "dp": 2,
                               "tp": 2, "pp": 2, "zero": zero}
    return TrainingSetup(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_every_zero_stage_with_tp_and_pp_is_in_the_table(zero: int) -> None:
    setup = _setup(zero)
    combo = combo_of(setup)
    assert combo is not None
    assert combo.name.endswith("×tp×pp")
    assert runs(setup, TINY)
    assert not runs(_setup(zero, global_batch=2), TINY)  # 1 micro-batch per dp rank < pp: 1F1B refuses


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_rank_peaks_follow_the_pp_dp_tp_mesh(zero: int) -> None:
    pred = predict(TINY, _setup(zero), device="cpu", per_rank=True)
    ranks = pred.rank_peaks
    assert len(ranks) == 8
    assert ranks[0::2] == ranks[1::2]  # the two tp shards of each (stage, dp rank) are symmetric
    if zero == 1:  # ZeRO-1's partition of the state differs between the dp ranks of a stage
        assert ranks[0] != ranks[2]
        assert ranks[4] != ranks[6]
    else:  # dp replicas or ZeRO-2/3's even shards
        assert ranks[0] == ranks[2]
        assert ranks[4] == ranks[6]
    assert ranks[0] != ranks[4]
    assert max(ranks) == pred.peak_bytes


def _layer_tp2() -> int:
    h, q, kv, f = 256, 8 * 32, 2 * 32, 688
    linear = h * (q + 2 * kv) + q * h + 3 * h * f  # q, k, v; o; gate, up, down
    return linear // 2 + 2 * h  # column/row shards of 2; both RMSNorms replicated


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_optimizer_phase_is_the_stage_times_tp_shard_times_zero_shard(zero: int) -> None:
    """fp32 AdamW after the step, worst stage (the last: 2 layers' tp shards + final norm + head)."""
    n = 2 * _layer_tp2() + 256 + 8000 * 256
    tensors = 2 * 9 + 2  # 7 linears + 2 norms per layer; final norm, head
    shard = -(-n // 2)  # over dp = 2
    rotary = 2 * 16 * 4  # inv_freq, 2 copies of head_dim / 2 floats
    expected = {  # 4 B per fused AdamW step scalar, one per tensor whose state the rank holds
        0: 4 * n + 4 * n + 8 * n + 4 * tensors,  # parameters, gradients, moments
        # ZeRO-1: the worst dp rank's partition is the head alone (the other gets 2 layers + the norm)
        1: 4 * n + 4 * n + 8 * 8000 * 256 + 4 * 1,
        2: 4 * shard + 4 * shard + 8 * shard + 4 * tensors,  # FSDP2: all three sharded
        3: 4 * shard + 4 * shard + 8 * shard + 4 * tensors,
    }[zero]
    # PipelineStage's receive buffers, kept between steps: the last stage's input activations, one
    # per micro-batch (8 sequences / dp 2 = 4 micro-batches of 1 x 64 tokens x 256 float32)
    recv = 4 * 64 * 256 * 4
    pred = predict(TINY, _setup(zero), device="cpu")
    assert pred.phases["optimizer"] == expected + rotary + recv


def test_zero3_3d_shards_the_2d_stage_over_dp() -> None:
    """ZeRO-3 on dp2 x tp2 x pp2 holds half of what tp2 x pp2 holds per rank after the step
    (up to the per-tensor scalars and replicated buffers, the same on both)."""
    two_d = predict(TINY, _setup(0, dp=1, global_batch=4)).phases["optimizer"]
    three_d = predict(TINY, _setup(3)).phases["optimizer"]
    recv = 4 * 64 * 256 * 4  # the last stage's receive buffers: 4 micro-batches on both
    fixed = 4 * 20 + 128 + recv
    assert three_d - fixed == (two_d - fixed) // 2


SMALL = spec_from_config({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                          "vocab_size": 256, "max_position_embeddings": 64}, name="small")


def test_marp_proposes_a_3d_plan_to_the_trainer_where_only_3d_fits_the_shape() -> None:
    """8 GPUs, 2 layers (pp <= 2), 2 key/value heads (tp <= 2), global batch 6 (dp in 1, 2, 3, 6):
    dp2 x tp2 x pp2 is the only shape of 8, and the trainer runs it (micro-batch 1, 3 micro-steps)."""
    setup = TrainingSetup(seq_len=16, micro_batch=1, dtype="fp32", global_batch=6)
    pool = [GpuPool(gpu_type="T4", count=8, memory_bytes=16 << 30, speed=1.0, gpus_per_node=8)]
    plans = {p.gpus: p for p in feasible_plans(SMALL, setup, pool, trainer_only=True)}
    p = plans[8]
    assert (p.dp, p.tp, p.pp, p.micro_batch, p.grad_accum) == (2, 2, 2, 1, 3)
    chosen = TrainingSetup(seq_len=16, micro_batch=1, dtype="fp32", global_batch=6, dp=2, tp=2, pp=2,
                           zero=p.zero)
    assert runs(chosen, SMALL)
    assert p.bytes_per_gpu >= predict(SMALL, chosen).peak_bytes


GPT2_SMALL = spec_from_config({"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4,
                               "vocab_size": 256, "n_positions": 64, "attn_pdrop": 0.0, "resid_pdrop": 0.0,
                               "embd_pdrop": 0.0}, name="gpt2-small")


@pytest.mark.parametrize(("zero", "measured"), [(0, 68_096), (2, 34_496)])
def test_gpt2_3d_keeps_full_biases_and_column_indices(zero: int, measured: int) -> None:
    """GPT-2 under tp (``trainer/tp_gpt2.TPConv1D``): column-wise biases stay full and each rank keeps
    the int64 indices of its columns.  First stage of dp2 x tp2 x pp2 (tests/trainer's tiny GPT-2): wte
    256 x 32 + wpe 64 x 32 + one layer = 16,800 parameters, 896 B of indices; the trainer measured
    ``measured`` bytes of parameters and buffers on those ranks (DDP; ZeRO-2 halves the parameters)."""
    e, f = 32, 128
    # weights / tp; full biases (c_attn, attention c_proj, c_fc, MLP c_proj); 2 LayerNorms
    layer = (3 * e * e + e * e + 2 * e * f) // 2 + 3 * e + e + f + e + 4 * e
    n = 256 * e + 64 * e + layer
    idx = 8 * (3 * e + f) // 2
    assert (n, idx) == (16_800, 896)
    shard = n if zero == 0 else -(-n // 2)
    assert 4 * shard + idx == measured
    setup = TrainingSetup(seq_len=16, micro_batch=3, dtype="fp32", global_batch=12, dp=2, tp=2, pp=2,
                          zero=zero)
    tensors = 12 + 2  # per layer: 4 weights, 4 biases, 2 x 2 LayerNorm; wte, wpe
    # parameters, (full) gradients and moments of the stage; ZeRO-2 shards all three.  The first stage is
    # the worst (wte + wpe outweigh ln_f + the last stage's copy of the tied head); it keeps a receive
    # buffer for its output's gradient per micro-batch (12 / (3 x dp 2) = 2 of 3 x 16 tokens x 32 float32)
    recv = 2 * 3 * 16 * 32 * 4
    expected = 16 * shard + idx + 4 * tensors + recv
    assert predict(GPT2_SMALL, setup, device="cpu").phases["optimizer"] == expected


def test_zero1_partitions_whole_tensors_largest_first_per_dp_rank() -> None:
    """ZeroRedundancyOptimizer's greedy partition: tiny-llama's first stage under tp2 holds the 8000 x 256
    embedding and two layers' shards (693,248 parameters): the embedding alone goes to dp rank 0, the
    layers to rank 1.  The trainer measured the two dp ranks 10.3 MiB apart (bf16-mixed: fp32 AdamW
    moments, 8 B per parameter; 3-D ZeRO-1 row of bench_marp's trainer table)."""
    setup = TrainingSetup(seq_len=64, micro_batch=2, dtype="bf16-mixed", global_batch=8, dp=2, tp=2, pp=2,
                          zero=1)
    pred = predict(TINY, setup, device="cpu", per_rank=True)
    r = pred.rank_peaks
    emb, layers = 8000 * 256, 2 * _layer_tp2()
    # mesh (pp, dp, tp): ranks 0-1 are stage 0 / dp 0, ranks 2-3 stage 0 / dp 1, then stage 1
    assert r[0] == r[1]
    assert r[2] == r[3]
    assert r[0] - r[2] == 8 * (emb - layers) + 4 * (1 - 18)  # moments; one step scalar per tensor held
    assert r[4] - r[6] == 8 * (emb - layers - 256) + 4 * (1 - 19)  # the head vs the layers + final norm
    assert pred.peak_bytes == max(r) == predict(TINY, setup, device="cpu").peak_bytes  # the planner's: worst


# bench_marp's trainer table (tiny-llama, seq 64, micro-batch 2): the trainer's measured peak per rank in
# bytes (its PeakMemory record, gloo ranks), 2026-12-02.  3-D rows on 8 ranks, 2 micro-steps each
MEASURED_3D = {
    (0, "fp32"): (52_707_536, 52_576_464, 52_576_464, 52_576_464,
                  64_367_328, 64_367_328, 64_367_328, 64_367_328),
    (1, "bf16-mixed"): (47_161_480, 47_030_408, 36_192_460, 36_192_460,
                        61_125_780, 61_125_780, 50_289_884, 50_289_884),
}


@pytest.mark.parametrize(("zero", "dtype"), list(MEASURED_3D))
def test_3d_dp_and_zero1_ranks_match_the_trainers_measurement(zero: int, dtype: str) -> None:
    """Within 3 % on every rank, none under by more than 1 %.  Terms that make the difference: the last
    stage keeps a micro-batch's logits from its forward to its backward (PipelineStage's forward cache;
    the plain step drops them: 3.9 MiB in fp32), ZeRO-1's uneven partition (10.3 MiB between the dp
    ranks of a stage), and 1F1B's first stage, whose second backward holds no other micro-batch."""
    setup = TrainingSetup(seq_len=64, micro_batch=2, dtype=dtype, global_batch=8, dp=2, tp=2, pp=2, zero=zero)
    pred = predict(TINY, setup, device="cpu", per_rank=True)
    for p, m in zip(pred.rank_peaks, MEASURED_3D[zero, dtype], strict=True):
        assert -0.01 <= (p - m) / m <= 0.03, (pred.rank_peaks, MEASURED_3D[zero, dtype])


# 2-D pipelines (world size 2-4; pp micro-steps per step): (dp, pp, zero, dtype) -> measured per rank
MEASURED_PP = {
    (1, 2, 0, "bf16-mixed"): (63_652_048, 80_006_368),
    (2, 2, 0, "fp32"): (63_652_048, 63_652_048, 77_183_712, 77_183_712),
    (2, 2, 3, "bf16-mixed"): (56_785_104, 56_785_104, 67_597_024, 67_597_024),
    (1, 4, 0, "bf16-mixed"): (59_345_068, 22_346_920, 19_351_720, 66_074_820),
}


@pytest.mark.parametrize(("dp", "pp", "zero", "dtype"), list(MEASURED_PP))
def test_pipeline_ranks_match_the_trainers_measurement(dp: int, pp: int, zero: int, dtype: str) -> None:
    """bench_marp's targets on every rank: within 3 % either way.  With as many micro-batches as stages,
    1F1B's first stage runs every forward before its first backward: that backward holds the other
    micro-batches' activations but no gradients yet, the second holds one micro-batch fewer beside the
    first's gradients (counting both at once over-predicted the first stage by 9-15 %).  A non-first
    stage keeps a receive buffer for its input per micro-batch, a non-last one for its output's
    gradient (the middle stages of pp4 were under by 4-6 % with one per micro-batch in flight)."""
    setup = TrainingSetup(seq_len=64, micro_batch=2, dtype=dtype, global_batch=2 * dp * pp, dp=dp, pp=pp,
                          zero=zero)
    pred = predict(TINY, setup, device="cpu", per_rank=True)
    for p, m in zip(pred.rank_peaks, MEASURED_PP[dp, pp, zero, dtype], strict=True):
        assert -0.03 <= (p - m) / m <= 0.03, (pred.rank_peaks, MEASURED_PP[dp, pp, zero, dtype])
