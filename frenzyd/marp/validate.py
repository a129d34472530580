"""Checks that a training setup and parallel plan can run the model at all, with fix-it messages."""

from __future__ import annotations

from frenzyd.errors import ConfigError, PlanError
from frenzyd.marp.spec import DTYPE_MODES, OPTIMIZERS, RECOMPUTES, ModelSpec, TrainingSetup


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def validate(model: ModelSpec, setup: TrainingSetup) -> None:
    """Raise ConfigError (bad setup) or PlanError (plan does not fit the model's shape); else return.

    ZeRO > 0 with dp = 1 is allowed (it shards nothing).
    """
    for name in ("seq_len", "micro_batch", "dp", "tp", "pp"):
        value = getattr(setup, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if setup.dtype not in DTYPE_MODES:
        raise ConfigError(f"dtype {setup.dtype!r} is unknown: use one of {', '.join(DTYPE_MODES)}")
    if setup.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer {setup.optimizer!r} is unknown: use one of {', '.join(OPTIMIZERS)}")
    if setup.recompute not in RECOMPUTES:
        raise ConfigError(f"recompute {setup.recompute!r} is unknown: use one of {', '.join(RECOMPUTES)}")
    if isinstance(setup.zero, bool) or setup.zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero stage {setup.zero!r} is not one of 0, 1, 2, 3")
    if setup.seq_len > model.max_positions:
        raise ConfigError(
            f"sequence length {setup.seq_len} exceeds {model.name}'s {model.max_positions} positions: "
            f"use --seq-len <= {model.max_positions}"
        )
    per_step = setup.micro_batch * setup.dp
    gb: object = setup.effective_global_batch
    if not isinstance(gb, int) or isinstance(gb, bool) or gb < 1:
        raise ConfigError(f"global batch must be a positive integer, got {gb!r}")
    if gb % per_step != 0:
        raise ConfigError(
            f"global batch {gb} is not a multiple of micro-batch {setup.micro_batch} x dp {setup.dp} = "
            f"{per_step}: use a global batch of {max(per_step, gb - gb % per_step)} or "
            f"{gb - gb % per_step + per_step}"
        )
    t = setup.tp
    if model.heads % t or model.kv_heads % t:
        ok = [d for d in _divisors(model.kv_heads) if model.heads % d == 0]
        raise PlanError(
            f"tensor parallel degree {t} must divide the {model.heads} attention heads and the "
            f"{model.kv_heads} key/value heads of {model.name}: use tp in {ok}"
        )
    if model.ffn % t:
        raise PlanError(
            f"tensor parallel degree {t} must divide the FFN width {model.ffn}: choose another tp"
        )
    if model.layers % setup.pp:
        raise PlanError(
            f"pipeline degree {setup.pp} must divide the {model.layers} layers of {model.name}: "
            f"use pp in {_divisors(model.layers)}"
        )
