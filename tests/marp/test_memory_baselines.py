"""Published memory estimators (baselines) against values computed by hand from their formulas."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from frenzyd.marp.baselines import (
    accelerate_estimate,
    deepspeed_zero2,
    deepspeed_zero3,
    largest_layer_params,
    megatron_param_count,
    megatron_theoretical,
)
from frenzyd.marp.model import load_model
from frenzyd.marp.spec import TrainingSetup

# The shipped presets are the published configs (their parameter counts are tested in test_model.py).
LLAMA2_7B = load_model("llama-2-7b")
GPT2 = load_model("gpt2")


def test_megatron_counts_llama2_7b_exactly() -> None:
    # attention 4h^2, MLP 2h(1.5F + 1 norm), 32 layers + final norm; vocab 32000 is a multiple of 128.
    block, embedding = megatron_param_count(LLAMA2_7B)
    assert block == 6_476_271_616
    assert embedding == 4096 * 32000
    assert block + 2 * embedding == 6_738_415_616  # the published llama-2-7b size


def test_megatron_pads_gpt2_vocab_and_ignores_biases() -> None:
    block, embedding = megatron_param_count(GPT2)
    assert block == 84_973_056  # 12 x (2*768*(3072+2) + 4*768^2) + 2*768
    assert embedding == 768 * 50304  # 50257 padded to a multiple of 128
    _, embedding_tp2 = megatron_param_count(GPT2, tp=2)
    assert embedding_tp2 == 768 * 50432  # a multiple of 256


def test_megatron_theoretical_llama2_7b_hand_computed() -> None:
    setup = TrainingSetup(seq_len=2048, micro_batch=1, dtype="bf16-mixed")
    # states: 6,738,415,616 params x 18 B; activations: 34 sbh x 32 layers + 8sb + sbh + 2(sbV + sbh), x 1.05
    states = 6_738_415_616 * 18
    sbh = 2048 * 4096
    act = (34 * sbh * 32 + 8 * 2048 + sbh + 2 * (2048 * 32000 + sbh)) * 1.05
    assert megatron_theoretical(LLAMA2_7B, setup) == int(states + act)


def test_megatron_distributed_optimizer_and_fp32() -> None:
    p = 6_738_415_616
    z1 = megatron_theoretical(LLAMA2_7B, TrainingSetup(seq_len=8, micro_batch=1, dtype="bf16", dp=8, zero=1))
    z0 = megatron_theoretical(LLAMA2_7B, TrainingSetup(seq_len=8, micro_batch=1, dtype="bf16", dp=8, zero=0))
    assert abs((z0 - z1) - p * (18 - (6 + 12 / 8))) < 2  # distributed optimizer: 6 + 12/d bytes
    f32 = megatron_theoretical(LLAMA2_7B, TrainingSetup(seq_len=8, micro_batch=1, dtype="fp32"))
    assert abs((z0 - f32) - p * 2) < 2


def test_deepspeed_estimators_hand_computed() -> None:
    assert deepspeed_zero2(1_000_000_000, 8) == 2_000_000_000 + 2_250_000_000
    assert deepspeed_zero2(1000, 1) == 20_000
    largest = largest_layer_params(LLAMA2_7B)
    assert largest == 4096 * 32000  # the embedding beats the 4096 x 11008 MLP matrices
    assert deepspeed_zero3(6_738_415_616, largest, 8) == 4 * 131_072_000 + 15_161_435_136


def test_accelerate_rule() -> None:
    assert accelerate_estimate(1000, "fp32") == 16_000
    assert accelerate_estimate(1000, "bf16") == 8_000
    assert accelerate_estimate(1000, "bf16-mixed") == 8_000


@given(p=st.integers(1, 10**11), n=st.integers(1, 1024))
def test_deepspeed_more_gpus_never_more_memory(p: int, n: int) -> None:
    assert deepspeed_zero2(p, n + 1) <= deepspeed_zero2(p, n)
    assert deepspeed_zero3(p, p // 10, n + 1) <= deepspeed_zero3(p, p // 10, n)


@given(s=st.integers(1, 8192), b=st.integers(1, 64))
def test_megatron_grows_with_tokens(s: int, b: int) -> None:
    small = megatron_theoretical(GPT2, TrainingSetup(seq_len=s, micro_batch=b, dtype="bf16"))
    big = megatron_theoretical(GPT2, TrainingSetup(seq_len=s + 1, micro_batch=b, dtype="bf16"))
    assert big > small
