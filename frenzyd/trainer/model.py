"""Builds the job's Hugging Face causal LM as DESIGN.md §3's reference step does, identically on every rank.

The config comes from MARP's loader (a preset or a ``config.json``), so the
trainer runs the very model MARP predicts.  Weights are drawn by
``from_config`` under ``torch.manual_seed(seed)`` on the CPU *before* any
sharding: every plan starts from the same parameters as the single-process run.
"""

from __future__ import annotations

from typing import Any

from frenzyd.marp.spec import ModelSpec


def param_dtype(dtype_mode: str) -> Any:
    import torch

    return torch.bfloat16 if dtype_mode == "bf16" else torch.float32


def hf_config(spec: ModelSpec) -> Any:
    """The ``transformers`` config object of ``spec`` (MARP's builder, so trace and trainer agree)."""
    from frenzyd.marp.trace.step import build_hf_config

    cfg = build_hf_config(spec)
    cfg.use_cache = False
    return cfg


def build_model(spec: ModelSpec, *, dtype_mode: str, recompute: str, seed: int,
                stand_in: bool = False) -> Any:
    """``AutoModelForCausalLM.from_config`` under ``torch.manual_seed(seed)``, sdpa attention, train mode.

    ``stand_in``: the job runs a paced stand-in (``StandIn``); a LLaMA-shaped one is built in plain
    torch (``stand_in_model``), without importing ``transformers``."""
    import torch

    if stand_in:
        from frenzyd.trainer import stand_in_model

        if stand_in_model.supports(spec):
            torch.manual_seed(seed)
            return stand_in_model.build(spec, dtype=param_dtype(dtype_mode), recompute=recompute)
    import transformers

    auto: Any = transformers.AutoModelForCausalLM
    cfg = hf_config(spec)
    torch.manual_seed(seed)
    model = auto.from_config(cfg, attn_implementation="sdpa", dtype=param_dtype(dtype_mode))
    model.config.use_cache = False
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model
