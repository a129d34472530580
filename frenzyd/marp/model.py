"""Turns a shipped preset or a Hugging Face ``config.json`` into a ModelSpec, and counts its parameters."""

from __future__ import annotations

import functools
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Final

from frenzyd.errors import ModelConfigError
from frenzyd.marp.spec import ModelSpec

_GPT2_TYPES = frozenset({"gpt2"})
_LLAMA_TYPES = frozenset({"llama", "mistral", "qwen2"})


def list_presets() -> list[str]:
    """Names of the shipped model presets (``frenzyd/marp/presets/*.json``), sorted."""
    return list(_preset_names())


@functools.cache
def _preset_names() -> tuple[str, ...]:
    # Shipped files: read once per process (the coordinator resolves presets for every queued job
    # on every pass).
    root = resources.files("frenzyd.marp").joinpath("presets")
    return tuple(sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json")))


@functools.cache
def _preset(name: str) -> ModelSpec:
    text = resources.files("frenzyd.marp").joinpath("presets", f"{name}.json").read_text()
    return spec_from_config(json.loads(text), name=name)


def load_model(name_or_path: str) -> ModelSpec:
    """A shipped preset by name, or a path to an HF ``config.json`` (GPT-2 or LLaMA family).

    Raises ModelConfigError (listing the presets) for an unknown name, and for a
    config that is unreadable, of an unsupported family or impossible.
    """
    if name_or_path in _preset_names():
        return _preset(name_or_path)  # a frozen value; its hf_config is only ever copied
    path = Path(name_or_path)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if not path.is_file():
        raise ModelConfigError(
            f"unknown model {name_or_path!r}: give a preset ({', '.join(list_presets())}) "
            "or the path of a Hugging Face config.json"
        )
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelConfigError(f"cannot read model config {str(path)!r}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{str(path)!r} is not a JSON object: expected a Hugging Face config.json")
    return spec_from_config(
        cfg, name=path.stem if path.name != "config.json" else path.parent.name or "model"
    )


def _int(cfg: dict[str, Any], key: str, *, default: int | None = None, minimum: int = 1) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ModelConfigError(f"model config lacks {key!r}: add it (an integer >= {minimum})")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ModelConfigError(f"model config {key!r} = {value!r} is not an integer >= {minimum}")
    return value


def _prob(cfg: dict[str, Any], key: str, default: float) -> float:
    value = cfg.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) < 1.0:
        raise ModelConfigError(f"model config {key!r} = {value!r} must be a probability in [0, 1)")
    return float(value)


def _bool(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool):
        raise ModelConfigError(f"model config {key!r} = {value!r} must be true or false")
    return value


def spec_from_config(cfg: dict[str, Any], *, name: str = "model") -> ModelSpec:
    """Map an HF config dict onto a ModelSpec; defaults are the HF config classes' (transformers 5)."""
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):  # a list is unhashable: refuse it
        model_type = repr(model_type)[:80]
    if model_type in _GPT2_TYPES:
        return _gpt2(cfg, name)
    if model_type in _LLAMA_TYPES:
        return _llama(cfg, name, str(model_type))
    raise ModelConfigError(
        f"model_type {model_type!r} is not supported: MARP knows the GPT-2 family (gpt2) and the "
        f"LLaMA family ({', '.join(sorted(_LLAMA_TYPES))}); presets: {', '.join(list_presets())}"
    )


def _check_heads(hidden: int, heads: int, kv_heads: int, head_dim_given: bool) -> None:
    if not head_dim_given and hidden % heads != 0:
        raise ModelConfigError(
            f"hidden size {hidden} is not divisible by the {heads} attention heads: "
            f"choose a head count that divides it (e.g. {_divisor_near(hidden, heads)}) or give head_dim"
        )
    if heads % kv_heads != 0:
        raise ModelConfigError(
            f"{heads} attention heads are not a multiple of {kv_heads} key/value heads (GQA groups "
            "must be whole): make num_key_value_heads divide num_attention_heads"
        )


DIVISOR_SEARCH: Final = 4096
"""Steps ``_divisor_near`` takes outward from the head count before it settles for 1."""


def _divisor_near(n: int, k: int) -> int:
    """The divisor of ``n`` nearest ``k`` (the smaller on a tie), searched outward from ``k``: at most
    ``DIVISOR_SEARCH`` steps, not a scan of ``n`` (a config's hidden size of 2**31 took minutes)."""
    k = min(k, n)  # no divisor exceeds n: the nearest to a larger k is n itself
    for step in range(min(k, DIVISOR_SEARCH)):
        for d in (k - step, k + step):
            if 1 <= d <= n and n % d == 0:
                return d
    return 1


def _gpt2(cfg: dict[str, Any], name: str) -> ModelSpec:
    hidden = _int(cfg, "n_embd", default=768)
    layers = _int(cfg, "n_layer", default=12)
    heads = _int(cfg, "n_head", default=12)
    _check_heads(hidden, heads, heads, head_dim_given=False)
    inner = cfg.get("n_inner")
    ffn = 4 * hidden if inner is None else _int(cfg, "n_inner")
    act = cfg.get("activation_function", "gelu_new")
    if act != "gelu_new":
        raise ModelConfigError(f"GPT-2 activation_function {act!r} is not modelled: use gelu_new")
    return ModelSpec(
        name=name,
        family="gpt2",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        ffn=ffn,
        vocab=_int(cfg, "vocab_size", default=50257),
        max_positions=_int(cfg, "n_positions", default=1024),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", True),
        gated_mlp=False,
        qkv_bias=True,
        mlp_bias=True,
        o_bias=True,
        norm="layernorm",
        learned_positions=True,
        attn_dropout=_prob(cfg, "attn_pdrop", 0.1),
        resid_dropout=_prob(cfg, "resid_pdrop", 0.1),
        embd_dropout=_prob(cfg, "embd_pdrop", 0.1),
        hf_config=dict(cfg),
    )


def _llama(cfg: dict[str, Any], name: str, model_type: str) -> ModelSpec:
    hidden = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", default=heads)
    head_dim_given = cfg.get("head_dim") is not None
    _check_heads(hidden, heads, kv_heads, head_dim_given)
    head_dim = _int(cfg, "head_dim") if head_dim_given else hidden // heads
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"hidden_act {act!r} is not modelled for the LLaMA family: use silu")
    if model_type == "qwen2":
        qkv_bias, o_bias, mlp_bias = True, False, False
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window", False) else None
    else:
        attn_bias = _bool(cfg, "attention_bias", False)
        qkv_bias = o_bias = attn_bias
        mlp_bias = _bool(cfg, "mlp_bias", False) if model_type == "llama" else False
        window = cfg.get("sliding_window") if model_type == "mistral" else None
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ModelConfigError(f"sliding_window = {window!r} must be a positive integer or null")
    return ModelSpec(
        name=name,
        family="llama",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=_int(cfg, "intermediate_size"),
        vocab=_int(cfg, "vocab_size"),
        max_positions=_int(cfg, "max_position_embeddings", default=2048),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", False),
        gated_mlp=True,
        qkv_bias=qkv_bias,
        mlp_bias=mlp_bias,
        o_bias=o_bias,
        norm="rmsnorm",
        learned_positions=False,
        attn_dropout=_prob(cfg, "attention_dropout", 0.0),
        resid_dropout=0.0,
        embd_dropout=0.0,
        sliding_window=window,
        hf_config=dict(cfg),
    )


def layer_linear_params(spec: ModelSpec) -> int:
    """Weights (no biases) of one decoder layer's linear maps: what autocast casts to bf16."""
    h, hd = spec.hidden, spec.head_dim
    attn = h * spec.heads * hd * 2 + h * spec.kv_heads * hd * 2
    mlp = (3 if spec.gated_mlp else 2) * h * spec.ffn
    return attn + mlp


def layer_params(spec: ModelSpec) -> int:
    """Parameters of one decoder layer, biases and norms included (equal to HF's)."""
    h, hd = spec.hidden, spec.head_dim
    n = layer_linear_params(spec)
    if spec.qkv_bias:
        n += (spec.heads + 2 * spec.kv_heads) * hd
    if spec.o_bias:
        n += h
    if spec.mlp_bias:
        n += spec.ffn + h if not spec.gated_mlp else 2 * spec.ffn + h
    n += 2 * h * (2 if spec.norm == "layernorm" else 1)
    return n


def layer_param_tensors(spec: ModelSpec) -> int:
    """Number of parameter tensors in one decoder layer (fused AdamW keeps a step scalar per tensor)."""
    n = 7 if spec.gated_mlp else 4
    n += 3 if spec.qkv_bias and spec.gated_mlp else (1 if spec.qkv_bias else 0)
    n += 1 if spec.o_bias else 0
    n += (3 if spec.gated_mlp else 2) if spec.mlp_bias else 0
    n += 2 * (2 if spec.norm == "layernorm" else 1)
    return n


def embedding_params(spec: ModelSpec) -> int:
    """Input-side parameters: token embedding (+ GPT-2's position table)."""
    return spec.vocab * spec.hidden + (spec.max_positions * spec.hidden if spec.learned_positions else 0)


def head_params(spec: ModelSpec) -> int:
    """Output-side parameters: final norm and, when untied, the LM head."""
    norm = spec.hidden * (2 if spec.norm == "layernorm" else 1)
    return norm + (0 if spec.tied_embeddings else spec.vocab * spec.hidden)


def param_count(spec: ModelSpec) -> int:
    """Exact parameter count, equal to ``sum(p.numel() for p in model.parameters())`` of the HF model."""
    return embedding_params(spec) + spec.layers * layer_params(spec) + head_params(spec)


def param_tensors(spec: ModelSpec) -> int:
    """Number of parameter tensors of the whole model."""
    emb = 2 if spec.learned_positions else 1
    head = (2 if spec.norm == "layernorm" else 1) + (0 if spec.tied_embeddings else 1)
    return emb + spec.layers * layer_param_tensors(spec) + head


def fmt_params(n: int) -> str:
    """Human size, e.g. ``6.74B``."""
    if n <= 0:
        return "0"
    exp = min(int(math.log10(n) // 3), 4)
    return f"{n / 1000**exp:.3g}{['', 'K', 'M', 'B', 'T'][exp]}"
