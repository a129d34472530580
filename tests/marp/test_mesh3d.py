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
    assert ranks[:4] == (ranks[0],) * 4  # stage 0: its 2 dp x 2 tp ranks are symmetric
    assert ranks[4:] == (ranks[4],) * 4  # stage 1
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
    fixed = 4 * tensors + 2 * 16 * 4  # fused AdamW step scalars; rotary inv_freq (2 copies of head_dim/2)
    expected = {
        0: 4 * n + 4 * n + 8 * n,  # DDP: parameters, bucketed gradients, moments
        1: 4 * n + 4 * n + 8 * shard,  # ZeRO-1: moments of this rank's partition
        2: 4 * shard + 4 * shard + 8 * shard,  # FSDP2: parameters, gradients, moments all sharded
        3: 4 * shard + 4 * shard + 8 * shard,
    }[zero]
    pred = predict(TINY, _setup(zero), device="cpu")
    assert pred.phases["optimizer"] == expected + fixed


def test_zero3_3d_shards_the_2d_stage_over_dp() -> None:
    """ZeRO-3 on dp2 x tp2 x pp2 holds half of what tp2 x pp2 holds per rank after the step
    (up to the per-tensor scalars and replicated buffers, the same on both)."""
    two_d = predict(TINY, _setup(0, dp=1, global_batch=4)).phases["optimizer"]
    three_d = predict(TINY, _setup(3)).phases["optimizer"]
    fixed = 4 * 20 + 128
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
    # DDP: parameters, bucketed (full) gradients and moments of the stage; ZeRO-2 shards all three.
    # The first stage is the worst (wte + wpe outweigh ln_f + the last stage's copy of the tied head).
    expected = 16 * shard + idx + 4 * tensors
    assert predict(GPT2_SMALL, setup, device="cpu").phases["optimizer"] == expected
