#!/usr/bin/env python3
"""List the storages autograd saves for backward, per module, in one forward of the reference step.

The tool behind ``frenzyd/marp/activations.py``: after a torch or transformers
upgrade, rerun it and compare the per-layer bytes with the formulas there.

    python scripts/marp_saved_tensors.py --model tiny-llama --seq-len 256 --micro-batch 2 \
        --dtype bf16-mixed [--layer 1] [--recompute] [--sdpa-backend math]

Runs on the CPU with real tensors (keep the model small).  Each storage is
listed once, under the module that first saved it; parameters are skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="preset name or HF config.json")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--dtype", choices=("fp32", "bf16", "bf16-mixed"), default="fp32")
    ap.add_argument("--layer", type=int, default=1, help="decoder layer to list in detail")
    ap.add_argument("--recompute", action="store_true", help="HF gradient checkpointing per layer")
    ap.add_argument(
        "--sdpa-backend",
        choices=("flash", "efficient", "math"),
        default=None,
        help="force the attention kernel (math: what a CUDA fp32 run with grouped K/V heads takes)",
    )
    args = ap.parse_args()

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoConfig, AutoModelForCausalLM

    from frenzyd.marp.activations import layer_bytes
    from frenzyd.marp.model import load_model

    spec = load_model(args.model)
    config = AutoConfig.for_model(**spec.hf_config)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    model.config.use_cache = False
    if args.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()

    stack: list[str] = []

    def pre(name: str):  # type: ignore[no-untyped-def]
        def hook(mod, inp):  # type: ignore[no-untyped-def]
            stack.append(name)

        return hook

    def post(mod, inp, out):  # type: ignore[no-untyped-def]
        stack.pop()

    for name, mod in model.named_modules():
        mod.register_forward_pre_hook(pre(name or "<model>"))
        mod.register_forward_hook(post)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[str, tuple[int, ...], str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key not in params and key not in seen:
            seen[key] = (stack[-1] if stack else "<loss>", tuple(t.shape), str(t.dtype), st.nbytes())
        return t

    ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len))
    forced = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }.get(args.sdpa_backend)
    with (
        sdpa_kernel([forced]) if forced is not None else contextlib.nullcontext(),
        torch.autocast("cpu", torch.bfloat16, enabled=args.dtype == "bf16-mixed"),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        model(input_ids=ids, labels=ids)

    marker = f".{args.layer}."
    per_layer = 0
    total = 0
    for mod, shape, dt, nbytes in seen.values():
        total += nbytes
        if marker in mod:
            per_layer += nbytes
            print(f"{mod:48s} {shape!s:28s} {dt:16s} {nbytes:>12,}")
    tokens = args.micro_batch * args.seq_len
    lb = layer_bytes(spec, args.dtype, "cpu", args.seq_len, kernel=args.sdpa_backend)
    predicted = int(tokens * (lb.per_token + args.seq_len * lb.per_token_s)) + lb.weight_copies
    print(
        f"layer {args.layer}: {per_layer:,} bytes saved; activations.py predicts {predicted:,} "
        f"(cpu, {lb.kernel} attention; without recompute)"
    )
    print(f"all saved storages: {total:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
