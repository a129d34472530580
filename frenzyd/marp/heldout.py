"""Seeded random held-out configurations for scoring MARP on shapes, setups and plans it was not built on.

Pure: a seed in, a list of (HF config, training setup) values out; no torch, no
I/O.  ``scripts/bench_marp.py --heldout-seed S`` runs each draw for real on the
CPU and scores the analytic method on it.  The ranges are documented in
``RANGES`` (and in ``frenzyd/marp/README.md``); every draw runs for real on a
small CPU (at most ``MAX_PARAMS`` parameters and a bounded predicted peak), and
at least ``QUOTA_SHARE`` of the draws are LLaMA-family fp32 with grouped K/V
heads at sequence >= 1024 (issue 19's family).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from frenzyd.marp.analytic import predict
from frenzyd.marp.model import param_count, spec_from_config
from frenzyd.marp.spec import DtypeMode, ModelSpec, Optimizer, Recompute, TrainingSetup

MAX_PARAMS = 150_000_000
"""No draw has more parameters (it must run for real on a CPU)."""
MAX_PEAK_BYTES = 4 * 2**30
"""Predicted (CPU) peak bytes of all ranks of a draw together: what the host must hold."""
QUOTA_SHARE = 0.25
"""Share of draws (every fourth, rounded up) that are LLaMA fp32 with grouped K/V heads at seq >= 1024."""

RANGES: dict[str, Any] = {
    "family": {"llama": 0.6, "gpt2": 0.4},
    "llama_model_type": ("llama", "qwen2"),
    "head_dim": (32, 64, 128),
    "heads": (2, 4, 6, 8, 12, 16),
    "hidden": (128, 1024),
    "llama_gqa_share": 0.5,
    "llama_ffn_factor": (8 / 3 * 0.8, 8 / 3 * 1.25),
    "gpt2_head_dim": (32, 64),
    "gpt2_heads": (2, 4, 8, 12),
    "gpt2_dropout": (0.0, 0.1),
    "layers": (1, 8),
    "vocab": (2_000, 32_000),
    "tied_share": 0.3,
    "seq": (128, 256, 512, 1024, 2048),
    "quota_seq": (1024, 2048),
    "micro_batch": (1, 2, 4),
    "max_tokens": 4096,
    "dtype": ("fp32", "bf16", "bf16-mixed"),
    "recompute_full_share": 0.3,
    "sgd_share": 0.1,
    "grad_accum": {1: 0.75, 2: 0.25},
    "dp_share": 0.3,
    "dp": (2, 4),
    "zero": (0, 1, 2, 3),
    "dp_max_params": 30_000_000,
    "dp_max_tokens": 1024,
}
"""The documented ranges the draws come from (tp = pp = 1: only plans measured for real are drawn)."""

TINY_RANGES: dict[str, Any] = {
    **RANGES,
    "hidden": (64, 128),
    "head_dim": (16, 32),
    "gpt2_head_dim": (16, 32),
    "heads": (2, 4),
    "gpt2_heads": (2, 4),
    "layers": (1, 2),
    "vocab": (512, 2_048),
    "seq": (64, 128, 256),
    "quota_seq": (1024,),
    "micro_batch": (1, 2),
    "max_tokens": 1024,
    "dp": (2,),
    "dp_max_tokens": 256,
}
"""CI's tiny draws: the same shapes of distribution, each a few seconds of real running."""


@dataclass(frozen=True, slots=True)
class HeldOutConfig:
    """One draw: a model (an HF config dict) and its training setup with a parallel plan."""

    name: str
    hf_config: dict[str, Any]
    setup: TrainingSetup
    quota: bool
    """Drawn for the LLaMA fp32 grouped-K/V quota."""

    @property
    def spec(self) -> ModelSpec:
        return spec_from_config(dict(self.hf_config), name=self.name)

    @property
    def params(self) -> int:
        return param_count(self.spec)


def draw_grid(seed: int, n: int = 40, *, tiny: bool = False) -> list[HeldOutConfig]:
    """``n`` seeded draws; every fourth (the first included) is a LLaMA fp32 GQA draw at seq >= 1024.

    The same seed gives the same list.  Raises ValueError for ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n = {n}: draw at least one configuration")
    rng = random.Random(seed)
    ranges = TINY_RANGES if tiny else RANGES
    out: list[HeldOutConfig] = []
    quota = math.ceil(n * QUOTA_SHARE)
    for i in range(n):
        forced = i % 4 == 0 and i // 4 < quota
        name = f"h{seed}-{i:02d}"
        out.append(_draw_one(rng, ranges, name, forced))
    return out


def _draw_one(rng: random.Random, r: dict[str, Any], name: str, forced: bool) -> HeldOutConfig:
    for _ in range(1000):
        family = "llama" if forced else _weighted(rng, r["family"])
        hf = (
            _llama_config(rng, r, gqa=True if forced else None) if family == "llama" else _gpt2_config(rng, r)
        )
        setup = _setup(rng, r, forced)
        spec = spec_from_config(dict(hf), name=name)
        params = param_count(spec)
        if params > MAX_PARAMS:
            continue
        if setup.dp > 1 and (
            params > r["dp_max_params"] or setup.micro_batch * setup.seq_len > r["dp_max_tokens"]
        ):
            continue
        if setup.seq_len > spec.max_positions:
            continue
        peak = predict(spec, setup, device="cpu").peak_bytes
        if peak * setup.dp > MAX_PEAK_BYTES:
            continue
        return HeldOutConfig(f"{name}-{family}", hf, setup, forced)
    raise AssertionError("no draw within the limits after 1000 tries: the ranges are inconsistent")


def _weighted(rng: random.Random, table: dict[Any, float]) -> Any:
    x = rng.random() * sum(table.values())
    for key, w in table.items():
        x -= w
        if x < 0:
            return key
    return key


def _hidden_heads(
    rng: random.Random, r: dict[str, Any], head_dims: tuple[int, ...], heads: tuple[int, ...]
) -> tuple[int, int]:
    lo, hi = r["hidden"]
    options = [(h * d, h) for d in head_dims for h in heads if lo <= h * d <= hi]
    hidden, n_heads = rng.choice(options)
    return hidden, n_heads


def _vocab(rng: random.Random, r: dict[str, Any]) -> int:
    lo, hi = r["vocab"]
    return 64 * rng.randint(-(-lo // 64), hi // 64)


def _llama_config(rng: random.Random, r: dict[str, Any], gqa: bool | None) -> dict[str, Any]:
    if gqa is None:
        gqa = rng.random() < r["llama_gqa_share"]
    heads_pool = tuple(h for h in r["heads"] if h > 1) if gqa else r["heads"]
    hidden, heads = _hidden_heads(rng, r, r["head_dim"], heads_pool)
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    kv = rng.choice([d for d in divisors if d < heads]) if gqa else heads
    lo, hi = r["llama_ffn_factor"]
    ffn = max(64, 64 * round(hidden * rng.uniform(lo, hi) / 64))
    return {
        "model_type": rng.choice(r["llama_model_type"]),
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": rng.randint(*r["layers"]),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": _vocab(rng, r),
        "max_position_embeddings": 4096,
        "tie_word_embeddings": rng.random() < r["tied_share"],
    }


def _gpt2_config(rng: random.Random, r: dict[str, Any]) -> dict[str, Any]:
    hidden, heads = _hidden_heads(rng, r, r["gpt2_head_dim"], r["gpt2_heads"])
    p = rng.choice(r["gpt2_dropout"])
    return {
        "model_type": "gpt2",
        "n_embd": hidden,
        "n_layer": rng.randint(*r["layers"]),
        "n_head": heads,
        "vocab_size": _vocab(rng, r),
        "n_positions": 2048,
        "resid_pdrop": p,
        "embd_pdrop": p,
        "attn_pdrop": p,
        "tie_word_embeddings": rng.random() >= r["tied_share"] / 3,  # GPT-2 is tied by default
    }


def _setup(rng: random.Random, r: dict[str, Any], forced: bool) -> TrainingSetup:
    seq = rng.choice(r["quota_seq"] if forced else r["seq"])
    batches = [b for b in r["micro_batch"] if b * seq <= max(r["max_tokens"], seq)]
    mb = rng.choice(batches)
    dtype: DtypeMode = "fp32" if forced else rng.choice(r["dtype"])
    full = rng.random() < (r["recompute_full_share"] * (0.75 if forced else 1.0))
    recompute: Recompute = "full" if full else "none"
    optimizer: Optimizer = "sgd" if rng.random() < r["sgd_share"] else "adamw"
    accum = _weighted(rng, r["grad_accum"])
    dp, zero = 1, 0
    if rng.random() < r["dp_share"]:
        dp = rng.choice(r["dp"])
        zero = rng.choice(r["zero"])
    if optimizer == "sgd" and zero >= 2:
        # torch 2.13: fused SGD has no DTensor sharding strategy (aten._fused_sgd_), so FSDP2 cannot
        # run the reference step with it; such a draw takes AdamW (no extra randomness consumed)
        optimizer = "adamw"
    return TrainingSetup(
        seq_len=seq,
        micro_batch=mb,
        dtype=dtype,
        global_batch=mb * dp * accum,
        optimizer=optimizer,
        recompute=recompute,
        zero=zero,
        dp=dp,
    )
