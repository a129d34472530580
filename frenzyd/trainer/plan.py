"""The trainer's job description: a frozen TrainerPlan read once from FRENZY_PLAN JSON and command-line flags.

``FRENZY_PLAN`` carries DESIGN.md §6's plan keys (``dp``, ``tp``, ``pp``, ``zero``,
``micro_batch``, ``grad_accum``, ...) plus ``model``, ``seq_len`` and
``global_batch``; it may also carry any trainer option below under its
field name.  Flags override the JSON.  Validation gives fix-it messages
(``ConfigError``/``PlanError``); the combination itself is checked against
``frenzyd.marp.combos``.  Pure: no torch.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from frenzyd.errors import ConfigError, PlanError
from frenzyd.marp.combos import refusal
from frenzyd.marp.model import load_model
from frenzyd.marp.spec import DTYPE_MODES, OPTIMIZERS, RECOMPUTES, ModelSpec, TrainingSetup

DEFAULTS: dict[str, Any] = {
    "dtype": "bf16-mixed",
    "recompute": "none",
    "optimizer": "adamw",
    "lr": 3e-4,
    "warmup": 0,
    "seed": 0,
    "checkpoint_every": 50,
    "dp": 1,
    "tp": 1,
    "pp": 1,
    "zero": 0,
}
"""The one place the trainer's defaults are written (``--help`` prints them from here)."""


@dataclass(frozen=True, slots=True)
class StandIn:
    """On a simulated GPU the trainer may run a small stand-in for the job's model (DESIGN.md §8 and
    issue 14): the same steps, data, checkpoints and rendezvous, with each step paced to MARP's step
    time of the declared model on the placed GPU type, and MARP's memory for the plan checked
    against the device's (a simulated out-of-memory error when it does not fit)."""

    stands_for: str
    """The declared model (preset name or config name)."""
    pace_s: float
    """Every step takes at least this long (seconds)."""
    bytes_per_gpu: int = 0
    """MARP's prediction for the declared model on the plan (0: not checked)."""
    gpu_memory_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"stands_for": self.stands_for, "pace_s": self.pace_s, "bytes_per_gpu": self.bytes_per_gpu,
                "gpu_memory_bytes": self.gpu_memory_bytes}

    @classmethod
    def parse(cls, raw: object) -> StandIn | None:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ConfigError("stand_in must be a JSON object")
        try:
            out = cls(str(raw["stands_for"]), float(raw["pace_s"]), int(raw.get("bytes_per_gpu") or 0),
                      int(raw.get("gpu_memory_bytes") or 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"stand_in: {exc!r}") from None
        if not 0 <= out.pace_s < 86400 or out.bytes_per_gpu < 0 or out.gpu_memory_bytes < 0:
            raise ConfigError("stand_in: pace_s in [0, 86400) and non-negative byte counts")
        return out

    def out_of_memory(self) -> str | None:
        """The simulated device's out-of-memory message when the plan does not fit it (None: fits)."""
        if self.bytes_per_gpu and self.gpu_memory_bytes and self.bytes_per_gpu > self.gpu_memory_bytes:
            return (f"CUDA out of memory (simulated device): {self.stands_for} on this plan needs "
                    f"{self.bytes_per_gpu / 2**30:.2f} GiB per GPU (MARP), the device has "
                    f"{self.gpu_memory_bytes / 2**30:.2f} GiB")
        return None


@dataclass(frozen=True, slots=True)
class TrainerPlan:
    """Everything one run of the built-in trainer needs; every field validated by :func:`resolve`."""

    model: str
    data: str
    seq_len: int
    global_batch: int
    steps: int
    dp: int
    tp: int
    pp: int
    zero: int
    micro_batch: int
    grad_accum: int
    dtype: str
    recompute: str
    optimizer: str
    lr: float
    warmup: int
    seed: int
    checkpoint_every: int
    """Save a checkpoint every this many steps (0: only on SIGTERM)."""
    stand_in: StandIn | None = None
    """Set on simulated GPUs for a job that asked for a paced stand-in (``StandIn``)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def setup(self) -> TrainingSetup:
        """MARP's view of this plan (what ``frenzyd.marp`` predicts for it)."""
        return TrainingSetup(
            seq_len=self.seq_len, micro_batch=self.micro_batch, dtype=self.dtype,  # type: ignore[arg-type]
            global_batch=self.global_batch, optimizer=self.optimizer,  # type: ignore[arg-type]
            recompute=self.recompute, zero=self.zero, dp=self.dp, tp=self.tp, pp=self.pp,  # type: ignore[arg-type]
        )

    def spec(self) -> ModelSpec:
        return load_model(self.model)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stand_in"] = None if self.stand_in is None else self.stand_in.to_json()
        return out

    def with_parallel(self, *, dp: int, tp: int = 1, pp: int = 1, zero: int = 0,
                      micro_batch: int | None = None) -> TrainerPlan:
        """The same job on another parallel plan (micro-batch re-derived unless given)."""
        raw = self.to_json() | {"dp": dp, "tp": tp, "pp": pp, "zero": zero,
                                "micro_batch": micro_batch, "grad_accum": None}
        return resolve(raw)


_INT_KEYS = ("seq_len", "global_batch", "steps", "dp", "tp", "pp", "zero", "micro_batch", "grad_accum",
             "warmup", "seed", "checkpoint_every")


def _int(raw: Mapping[str, Any], key: str, minimum: int) -> int:
    value = raw.get(key)
    if value is None:
        flag = key.replace("_", "-")
        raise ConfigError(f"the trainer needs {key!r}: give --{flag} or put it in FRENZY_PLAN")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} = {value!r} must be an integer >= {minimum}")
    return value


def _choice(raw: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str:
    value = raw.get(key, DEFAULTS[key])
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r} is not one of {', '.join(allowed)}")
    return str(value)


def _micro(raw: Mapping[str, Any], g: int, dp: int, pp: int) -> tuple[int, int]:
    """(micro_batch, grad_accum) with micro_batch x dp x grad_accum = global batch, or PlanError."""
    if g % dp:
        raise PlanError(
            f"global batch {g} is not divisible by dp={dp}: no plan with this data-parallel degree divides "
            f"it; choose a global batch that is a multiple of {dp}"
        )
    mb, ga = raw.get("micro_batch"), raw.get("grad_accum")
    per_rank = g // dp
    if mb is None and ga is None:
        ga = pp if pp > 1 and per_rank % pp == 0 else 1  # 1F1B needs >= pp micro-batches
        mb = per_rank // ga
    elif mb is None:
        ga = _int(raw, "grad_accum", 1)
        if per_rank % ga:
            raise PlanError(f"global batch {g} / dp={dp} = {per_rank} sequences do not split into "
                            f"grad_accum={ga} equal micro-batches")
        mb = per_rank // ga
    else:
        mb = _int(raw, "micro_batch", 1)
        if per_rank % mb:
            raise PlanError(
                f"global batch {g} is not micro_batch x dp x grad_accum for micro_batch={mb}, dp={dp}: "
                f"{per_rank} sequences per data-parallel rank are not a multiple of {mb}"
            )
        want = per_rank // mb
        if ga is not None and _int(raw, "grad_accum", 1) != want:
            raise PlanError(f"global batch {g} != micro_batch {mb} x dp {dp} x grad_accum {ga}: "
                            f"use grad_accum={want}")
        ga = want
    return int(mb), int(ga)


def resolve(raw: Mapping[str, Any], *, need_data: bool = True) -> TrainerPlan:
    """Validate a merged dict of plan keys and options into a TrainerPlan (ConfigError/PlanError).

    ``need_data=False`` (``apply_plan`` in a user's own loop) accepts a plan without ``data``/``steps``.
    """
    unknown_model = raw.get("model")
    if not isinstance(unknown_model, str) or not unknown_model:
        raise ConfigError("the trainer needs a model: a preset name or a config.json path (--model)")
    data = raw.get("data", "" if not need_data else None)
    if not need_data:
        raw = {"steps": 1, **raw}
    if not isinstance(data, str) or (need_data and not data):
        raise ConfigError("the trainer needs training data: --data PATH (UTF-8 text or a nanoGPT .bin)")
    merged = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    dp, tp, pp = (_int(merged, k, 1) for k in ("dp", "tp", "pp"))
    g = _int(merged, "global_batch", 1)
    mb, ga = _micro(merged, g, dp, pp)
    lr = merged.get("lr")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < float(lr) < 1:
        raise ConfigError(f"lr = {lr!r} must be a number in (0, 1)")
    plan = TrainerPlan(
        model=unknown_model, data=data, seq_len=_int(merged, "seq_len", 2), global_batch=g,
        steps=_int(merged, "steps", 1), dp=dp, tp=tp, pp=pp, zero=_int(merged, "zero", 0),
        micro_batch=mb, grad_accum=ga, dtype=_choice(merged, "dtype", DTYPE_MODES),
        recompute=_choice(merged, "recompute", RECOMPUTES),
        optimizer=_choice(merged, "optimizer", OPTIMIZERS),
        lr=float(lr), warmup=_int(merged, "warmup", 0), seed=_int(merged, "seed", 0),
        checkpoint_every=_int(merged, "checkpoint_every", 0),
        stand_in=StandIn.parse(merged.get("stand_in")),
    )
    if plan.zero > 3:
        raise ConfigError(f"zero = {plan.zero} must be 0, 1, 2 or 3")
    spec = plan.spec()
    if plan.seq_len > spec.max_positions:
        raise ConfigError(f"seq_len {plan.seq_len} exceeds the model's {spec.max_positions} positions")
    why = refusal(plan.setup(), spec)
    if why is not None:
        raise PlanError(why)
    return plan


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m frenzyd.trainer",
        description="Frenzy's built-in trainer: the reference step of DESIGN.md §3 on any plan of "
        "frenzyd.marp.combos. Run it under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). "
        "FRENZY_PLAN (JSON) gives the plan; flags override it.",
    )
    p.add_argument("--model", help="preset name or path of a Hugging Face config.json")
    p.add_argument("--data", help="UTF-8 text file (byte tokens) or nanoGPT flat .bin token file")
    for key, help_ in (("seq-len", "tokens per sequence"), ("global-batch", "sequences per optimizer step"),
                       ("steps", "optimizer steps"), ("micro-batch", "sequences per rank per micro-step "
                       "(default: derived)"), ("grad-accum", "micro-steps per step (default: derived)")):
        p.add_argument(f"--{key}", type=int, help=help_)
    for key in ("dp", "tp", "pp", "zero", "warmup", "seed", "checkpoint-every"):
        p.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key.replace('-', '_')]}")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {DEFAULTS['lr']}); linear warmup, "
                   "then cosine decay to 10%% at the last step")
    p.add_argument("--dtype", choices=DTYPE_MODES, help=f"default {DEFAULTS['dtype']}")
    p.add_argument("--recompute", choices=RECOMPUTES, help=f"default {DEFAULTS['recompute']}")
    p.add_argument("--optimizer", choices=OPTIMIZERS, help=f"default {DEFAULTS['optimizer']}")
    p.add_argument("--output-dir", help="default $FRENZY_OUTPUT_DIR, else ./frenzy-output")
    p.add_argument("--checkpoint-dir", help="default $FRENZY_CHECKPOINT_DIR (no checkpoints when neither)")
    return p


def plan_from(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[TrainerPlan, argparse.Namespace]:
    """The plan from ``FRENZY_PLAN`` (if set) overridden by ``argv`` flags; also the parsed flags."""
    args = parser().parse_args(list(argv))
    raw: dict[str, Any] = {}
    text = environ.get("FRENZY_PLAN")
    if text:
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"FRENZY_PLAN is not valid JSON: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError("FRENZY_PLAN must be a JSON object of plan keys")
        raw.update(loaded)
    for name in ("model", "data", "dtype", "recompute", "optimizer", "lr", *_INT_KEYS):
        value = getattr(args, name, None)
        if value is not None:
            raw[name] = value
    return resolve(raw), args
