"""The trained model comes back: full weights gathered to rank 0 and written as a Hugging Face directory.

``config.json`` + ``model.safetensors`` via ``save_pretrained``, loadable by
``AutoModelForCausalLM.from_pretrained``.  DTensor shards (FSDP, TP) are
gathered with ``full_tensor``; pipeline stages send their subsets to rank 0.
Rank 0 holds the whole model in CPU memory once, at the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from frenzyd.marp.spec import ModelSpec
from frenzyd.trainer.model import param_dtype
from frenzyd.trainer.parallel import Parallel


def gather_full(par: Parallel) -> dict[str, Any] | None:
    """FQN -> full CPU tensor on rank 0 (None elsewhere).  Collective: every rank calls it."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    mine: dict[str, Any] = {}
    for name, p in par.params.items():
        t = par.checkpoint_view(p, name)
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if full.dim() == 3:  # GPT-2's c_attn weight as checkpoints see it: [E, 3, E] -> [E, 3E]
            full = full.reshape(full.shape[0], -1)
        mine[name] = full.detach().cpu()
    contributes = par.dp_rank == 0 and par.tp_rank == 0
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine if contributes else None, gathered, dst=0)
    if gathered is None:
        return None
    out: dict[str, Any] = {}
    for part in gathered:
        if part:
            out.update(part)
    return out


def write_hf_dir(spec: ModelSpec, full: dict[str, Any], out_dir: str | Path, *, dtype_mode: str,
                 stand_in: bool = False) -> Path:
    """Write ``full`` (every parameter by FQN) as ``out_dir/config.json`` + ``model.safetensors``.

    ``stand_in``: the model came from ``stand_in_model`` (LLaMA's names and shapes); its directory is
    written with ``safetensors`` alone, as ``save_pretrained`` would, without importing
    ``transformers`` on the way out."""
    import torch

    from frenzyd.trainer import stand_in_model

    if stand_in and stand_in_model.supports(spec):
        return stand_in_model.write_hf_dir(spec, full, Path(out_dir), dtype=param_dtype(dtype_mode))
    from transformers.utils import logging as hf_logging_module

    from frenzyd.trainer.model import build_model

    hf_logging: Any = hf_logging_module
    hf_logging.disable_progress_bar()

    model = build_model(spec, dtype_mode=dtype_mode, recompute="none", seed=0)
    names = {n for n, _ in model.named_parameters()}
    missing, extra = names - set(full), set(full) - names
    if missing or extra:
        raise RuntimeError(f"exported weights do not match the model: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(extra)[:5]}")
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(full[n])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    return out
