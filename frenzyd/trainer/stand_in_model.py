"""The stand-in's model in plain torch: the small LLaMA a job runs on simulated GPUs (``StandIn``).

A stand-in's steps are paced to MARP's step time of the declared model, so its
model only has to be a real decoder that trains, checkpoints and resumes; what
it costs is its process start.  Built through ``transformers`` that start is
about 4 CPU-seconds a rank, half of it importing ``transformers`` (which pulls
in ``torch._dynamo``, ``scipy`` and the tensor-parallel machinery); on a
loopback pool of four daemons sharing two cores those seconds are most of what
a placement costs (``results/live.md``).  This module builds the same
architecture (``LlamaForCausalLM``'s parameter names and shapes, RMSNorm,
rotary positions, grouped-query attention, SwiGLU, untied head) from torch
alone, so the exported ``model/`` directory still loads with
``LlamaForCausalLM.from_pretrained`` and computes the same logits
(``tests/trainer/test_stand_in.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from frenzyd.marp.spec import ModelSpec
from frenzyd.trainer.parallel import causal_lm_loss

ROPE_THETA_DEFAULT = 10000.0
RMS_EPS_DEFAULT = 1e-6


def _rope(cfg: dict[str, object]) -> dict[str, Any]:
    """The config's rotary settings (``rope_parameters`` in transformers 5, flat keys before)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    out = dict(rope) if isinstance(rope, dict) else {}
    if "rope_theta" in cfg:
        out.setdefault("rope_theta", cfg["rope_theta"])
    return out


def supports(spec: ModelSpec) -> bool:
    """Whether ``spec`` is the bias-free, untied LLaMA shape with plain rotary positions this module
    builds (else the trainer builds it with transformers)."""
    rope = _rope(spec.hf_config)
    return (rope.get("rope_type", rope.get("type", "default")) == "default" and spec.gated_mlp
            and spec.norm == "rmsnorm" and not spec.learned_positions and not spec.tied_embeddings
            and not (spec.qkv_bias or spec.mlp_bias or spec.o_bias) and spec.sliding_window is None
            and spec.heads % spec.kv_heads == 0)


@dataclass(frozen=True, slots=True)
class Output:
    """What the trainer reads of a forward (``transformers``' ``CausalLMOutput`` fields it uses)."""

    loss: Any
    logits: Any


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.q_proj = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.k_proj = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.v_proj = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        groups = self.heads // self.kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return y


class Mlp(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden, spec.ffn, bias=False)
        self.up_proj = nn.Linear(spec.hidden, spec.ffn, bias=False)
        self.down_proj = nn.Linear(spec.ffn, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return y


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(spec)
        self.mlp = Mlp(spec)
        self.input_layernorm = RMSNorm(spec.hidden, eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return y


class Decoder(nn.Module):
    def __init__(self, spec: ModelSpec, eps: float) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(DecoderLayer(spec, eps) for _ in range(spec.layers))
        self.norm = RMSNorm(spec.hidden, eps)


class StandInLM(nn.Module):
    """``LlamaForCausalLM`` of ``spec`` (bias-free, untied; see :func:`supports`) in plain torch."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        cfg = spec.hf_config
        eps = float(cfg.get("rms_norm_eps") or RMS_EPS_DEFAULT)  # type: ignore[arg-type]
        theta = float(_rope(cfg).get("rope_theta") or ROPE_THETA_DEFAULT)
        self.model = Decoder(spec, eps)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False)
        self.recompute = False
        inv = 1.0 / (theta ** (torch.arange(0, spec.head_dim, 2, dtype=torch.float32) / spec.head_dim))
        self.inv_freq: torch.Tensor
        self.register_buffer("inv_freq", inv, persistent=False)
        std = float(cfg.get("initializer_range") or 0.02)  # type: ignore[arg-type]
        for m in self.modules():  # LlamaPreTrainedModel._init_weights
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=std)

    def _rotary(self, s: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(s, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Output:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rotary(input_ids.shape[1], x.dtype, x.device)
        for layer in self.model.layers:
            if self.recompute and self.training:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        return Output(None if labels is None else causal_lm_loss(logits, labels), logits)


def build(spec: ModelSpec, *, dtype: torch.dtype, recompute: str) -> StandInLM:
    """The stand-in model of ``spec`` in ``dtype``; the caller seeds torch first."""
    model = StandInLM(spec).to(dtype)
    model.recompute = recompute == "full"
    return model.train()


def write_hf_dir(spec: ModelSpec, full: dict[str, Any], out: Path, *, dtype: torch.dtype) -> Path:
    """``full`` (the stand-in's parameters by name) as a ``LlamaForCausalLM`` directory: the model's
    ``config.json`` and ``model.safetensors``, as ``save_pretrained`` writes them."""
    from safetensors.torch import save_file

    with torch.device("meta"):  # the names only: no weights drawn
        names = {n for n, _ in StandInLM(spec).named_parameters()}
    if names != set(full):
        missing, extra = sorted(names - set(full))[:5], sorted(set(full) - names)[:5]
        raise RuntimeError(f"exported weights do not match the model: missing {missing}, unexpected {extra}")
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**spec.hf_config, "dtype": str(dtype).removeprefix("torch."), "use_cache": False}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file({n: t.detach().to(dtype).contiguous() for n, t in full.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out
