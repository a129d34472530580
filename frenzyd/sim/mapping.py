"""Seeded rules that turn trace jobs into LLM training jobs (model preset, sequence, global batch, steps).

Every rule keeps the trace job's submission time and GPU count (the user's
ask) and sets the work so that the LLM job would take the trace job's
duration on its trace GPU count of V100s at perfect scaling:
``steps = duration × gpus × F_V100 / flops_per_step`` (``has.speed``).  The
rules differ in how the model size is chosen:

* ``gpus`` — size follows the GPU count the user asked for (a user asks for
  more GPUs for a bigger model): 1 GPU → gpt2 / gpt2-medium / gpt2-large,
  2–4 → gpt2-xl / llama-2-7b, 5–15 → 7–8 B models, ≥ 16 → 7–13 B models.
* ``gputime`` — size follows the job's GPU-time quantile inside the window
  (long jobs train big models), whatever the GPU count: below the median
  gpt2 / gpt2-medium, to the 80th percentile gpt2-large / gpt2-xl, to the
  95th 7–8 B models, above 7–13 B models.

GPT-2 models train at sequence 1024 with global batch 16, 32 or 64; LLaMA
family models at sequence 2048 with global batch 32, 64 or 128 (seeded).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from frenzyd.errors import ConfigError
from frenzyd.sim.trace import TraceJob

SMALL = ("gpt2", "gpt2-medium", "gpt2-large")
MEDIUM = ("gpt2-large", "gpt2-xl")
MID_LARGE = ("gpt2-xl", "llama-2-7b")
LARGE = ("llama-2-7b", "mistral-7b", "llama-3-8b", "qwen2.5-7b")
XLARGE = ("llama-2-7b", "mistral-7b", "llama-3-8b", "qwen2.5-7b", "llama-2-13b")


@dataclass(frozen=True, slots=True)
class LlmJob:
    """A trace job turned into an LLM training job (steps are filled in by ``sim.jobs``)."""

    job_id: str
    arrival_s: float
    requested_gpus: int
    model: str
    seq_len: int
    global_batch: int
    trace_duration_s: float
    recompute: bool = False
    """Full activation recompute (LLaMA-family 7-13 B models: how they are trained on lab GPUs)."""


def _shape(model: str, rng: random.Random) -> tuple[int, int]:
    if model.startswith("gpt2"):
        return 1024, rng.choice((16, 32, 64))
    return 2048, rng.choice((32, 64, 128))


def _by_gpus(jobs: list[TraceJob], rng: random.Random) -> list[str]:
    out = []
    for j in jobs:
        if j.gpus <= 1:
            out.append(rng.choice(SMALL))
        elif j.gpus <= 4:
            out.append(rng.choice(MID_LARGE))
        elif j.gpus < 16:
            out.append(rng.choice(LARGE))
        else:
            out.append(rng.choice(XLARGE))
    return out


def _by_gputime(jobs: list[TraceJob], rng: random.Random) -> list[str]:
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].duration_s * jobs[i].gpus, i))
    rank = {i: r / max(1, len(jobs) - 1) for r, i in enumerate(order)}
    out = []
    for i in range(len(jobs)):
        q = rank[i]
        pool = SMALL[:2] if q < 0.5 else MEDIUM if q < 0.8 else LARGE if q < 0.95 else XLARGE
        out.append(rng.choice(pool))
    return out


MAPPINGS: dict[str, Callable[[list[TraceJob], random.Random], list[str]]] = {
    "gpus": _by_gpus,
    "gputime": _by_gputime,
}


def map_jobs(jobs: list[TraceJob], rule: str, seed: int) -> list[LlmJob]:
    """Apply mapping ``rule`` (one of :data:`MAPPINGS`) to a trace window, seeded."""
    fn = MAPPINGS.get(rule)
    if fn is None:
        raise ConfigError(f"unknown mapping rule {rule!r}: use one of {', '.join(MAPPINGS)}")
    rng = random.Random(f"{rule}:{seed}")
    models = fn(jobs, rng)
    out = []
    for i, (j, m) in enumerate(zip(jobs, models, strict=True)):
        seq, gb = _shape(m, rng)
        big = not m.startswith("gpt2")
        out.append(LlmJob(f"j{i:04d}", j.submit_s, j.gpus, m, seq, gb, j.duration_s, recompute=big))
    return out
