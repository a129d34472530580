"""The trace method (fake tensors) against real CPU runs of the reference step, and its error mapping."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from frenzyd.errors import ConfigError, FrenzyError, ModelConfigError, PlanError, TraceError
from frenzyd.marp.spec import PHASES, ModelSpec, TrainingSetup
from frenzyd.marp.trace import Measurement, measure_real, predict_trace, trace_measurement

TRACE_TARGET = 0.995

LLAMA_GQA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
LLAMA_MQA_TIED: dict[str, Any] = {**LLAMA_GQA, "num_key_value_heads": 1, "tie_word_embeddings": True}
QWEN2: dict[str, Any] = {**LLAMA_GQA, "model_type": "qwen2"}
GPT2: dict[str, Any] = {
    "model_type": "gpt2",
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "vocab_size": 512,
    "n_positions": 256,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
}
GPT2_DROPOUT: dict[str, Any] = {**GPT2, "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}

# The architecture of LLAMA_GQA as a ModelSpec; tests add hf_config where they need it.
TINY_LLAMA_SPEC = ModelSpec(
    name="x",
    family="llama",
    hidden=64,
    layers=2,
    heads=4,
    kv_heads=2,
    head_dim=16,
    ffn=176,
    vocab=512,
    max_positions=256,
    tied_embeddings=False,
    gated_mlp=True,
    qkv_bias=False,
    mlp_bias=False,
    o_bias=False,
    norm="rmsnorm",
    learned_positions=False,
)


def _accuracy(pred: int, real: int) -> float:
    return 1 - abs(pred - real) / real


CASES = [
    ("llama-gqa-fp32", LLAMA_GQA, TrainingSetup(seq_len=128, micro_batch=2, dtype="fp32")),
    (
        "llama-gqa-bf16-full",
        LLAMA_GQA,
        TrainingSetup(seq_len=96, micro_batch=2, dtype="bf16", recompute="full"),
    ),
    (
        "llama-mqa-tied-sgd",
        LLAMA_MQA_TIED,
        TrainingSetup(seq_len=64, micro_batch=2, dtype="bf16", optimizer="sgd"),
    ),
    (
        "qwen2-mixed-accum",
        QWEN2,
        TrainingSetup(seq_len=64, micro_batch=1, dtype="bf16-mixed", global_batch=3),
    ),
    ("gpt2-fp32-accum", GPT2, TrainingSetup(seq_len=128, micro_batch=2, dtype="fp32", global_batch=4)),
    (
        "gpt2-dropout-mixed-full",
        GPT2_DROPOUT,
        TrainingSetup(seq_len=64, micro_batch=2, dtype="bf16-mixed", recompute="full"),
    ),
]


@pytest.mark.parametrize(("name", "cfg", "setup"), CASES, ids=[c[0] for c in CASES])
def test_fake_trace_matches_real_run(name: str, cfg: dict[str, Any], setup: TrainingSetup) -> None:
    real = measure_real(cfg, setup)
    fake = trace_measurement(cfg, setup)
    assert real.method == "real"
    assert fake.method == "trace"
    assert _accuracy(fake.peak_bytes, real.peak_bytes) >= TRACE_TARGET, (
        name,
        fake.peak_bytes,
        real.peak_bytes,
    )
    for phase in PHASES:
        assert _accuracy(fake.phases[phase], real.phases[phase]) >= TRACE_TARGET, (name, phase)
    assert fake.params == real.params


def test_measurement_is_consistent() -> None:
    setup = TrainingSetup(seq_len=64, micro_batch=2, dtype="fp32", global_batch=4)
    m = measure_real(LLAMA_GQA, setup)
    assert m.breakdown.total == m.peak_bytes
    assert m.peak_bytes == max(m.phases.values())
    assert m.phases[m.peak_phase] == m.peak_bytes
    # fp32 AdamW: two fp32 moments per parameter plus a 4-byte step count per parameter tensor.
    assert 8 * m.params < m.breakdown.optimizer < 8 * m.params + 4 * 64
    assert m.breakdown.parameters >= 4 * m.params
    assert Measurement.from_json(m.to_json()) == m


def test_more_tokens_need_more_memory() -> None:
    small = trace_measurement(LLAMA_GQA, TrainingSetup(seq_len=64, micro_batch=1, dtype="fp32"))
    big = trace_measurement(LLAMA_GQA, TrainingSetup(seq_len=128, micro_batch=2, dtype="fp32"))
    assert big.peak_bytes > small.peak_bytes


def test_predict_trace_accepts_a_model_spec() -> None:
    spec = replace(TINY_LLAMA_SPEC, name="tiny-llama", hf_config=dict(LLAMA_GQA))
    p = predict_trace(spec, TrainingSetup(seq_len=64, micro_batch=1, dtype="bf16"))
    assert p.method == "trace"
    assert p.model == "tiny-llama"
    assert p.breakdown.total == p.peak_bytes
    assert set(p.phases) == set(PHASES)


@pytest.mark.slow
def test_zero1_on_two_real_gloo_ranks_matches_fake_process_group() -> None:
    setup = TrainingSetup(seq_len=64, micro_batch=2, dtype="fp32", dp=2, zero=1)
    real = measure_real(LLAMA_GQA, setup)
    fake = trace_measurement(LLAMA_GQA, setup)
    assert real.world_size == 2
    assert len(real.rank_peaks) == 2
    assert real.peak_bytes == max(real.rank_peaks)
    assert _accuracy(fake.peak_bytes, real.peak_bytes) >= TRACE_TARGET
    # ZeRO-1 shards the optimizer state: less than the single-rank step.
    single = trace_measurement(LLAMA_GQA, TrainingSetup(seq_len=64, micro_batch=2, dtype="fp32"))
    assert real.peak_bytes < single.peak_bytes + 4 * single.params  # DDP buckets are alive all step


def test_fake_fsdp_shards_states() -> None:
    one = trace_measurement(LLAMA_GQA, TrainingSetup(seq_len=64, micro_batch=1, dtype="fp32"))
    z3 = trace_measurement(LLAMA_GQA, TrainingSetup(seq_len=64, micro_batch=1, dtype="fp32", dp=4, zero=3))
    assert z3.breakdown.optimizer < one.breakdown.optimizer
    assert z3.peak_bytes < one.peak_bytes


@pytest.mark.parametrize(
    "module",
    ["frenzyd.marp.trace", "frenzyd.marp.trace.step", "frenzyd.marp.trace.dist", "frenzyd.marp.trace.api"],
)
def test_importing_trace_imports_no_torch(module: str) -> None:
    code = f"import sys, {module}; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_trace_modules_import_one_way() -> None:
    """step imports no sibling, dist only step, api step and dist; imports inside functions count too."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("frenzyd.marp.trace")
    assert spec is not None
    assert spec.submodule_search_locations is not None
    pkg = Path(next(iter(spec.submodule_search_locations)))
    edges = {}
    for name in ("step", "dist", "api"):
        tree = ast.parse((pkg / f"{name}.py").read_text())
        edges[name] = {
            n.module.rsplit(".", 1)[-1]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("frenzyd.marp.trace")
        }
    assert edges == {"step": set(), "dist": {"step"}, "api": {"step", "dist"}}


@pytest.mark.parametrize(
    ("cfg", "setup", "exc", "words"),
    [
        (
            {**LLAMA_GQA, "model_type": "no-such-family"},
            TrainingSetup(seq_len=8, micro_batch=1),
            ModelConfigError,
            "no-such-family",
        ),
        (
            {k: v for k, v in LLAMA_GQA.items() if k != "model_type"},
            TrainingSetup(seq_len=8, micro_batch=1),
            ModelConfigError,
            "model_type",
        ),
        (LLAMA_GQA, TrainingSetup(seq_len=8, micro_batch=1, tp=2), PlanError, "tp=1"),
        (LLAMA_GQA, TrainingSetup(seq_len=8, micro_batch=2, global_batch=3), ConfigError, "multiple"),
        (LLAMA_GQA, TrainingSetup(seq_len=8, micro_batch=1, zero=2), ConfigError, "dp >= 2"),
        (
            {**LLAMA_GQA, "hidden_size": 66},
            TrainingSetup(seq_len=8, micro_batch=1),
            ModelConfigError,
            "not a multiple of the number of attention heads",
        ),
    ],
    ids=["unknown-family", "no-model-type", "tp", "global-batch", "zero-without-dp", "heads-not-dividing"],
)
def test_errors_are_frenzy_errors(
    cfg: dict[str, Any], setup: TrainingSetup, exc: type[Exception], words: str
) -> None:
    with pytest.raises(exc, match=words):
        trace_measurement(cfg, setup)


def test_empty_model_spec_config_says_what_to_do() -> None:
    spec = TINY_LLAMA_SPEC  # no hf_config: built by hand, not by load_model
    with pytest.raises(ModelConfigError, match="load_model"):
        measure_real(spec, TrainingSetup(seq_len=8, micro_batch=1))


def test_trace_error_is_a_frenzy_error() -> None:
    assert issubclass(TraceError, FrenzyError)
