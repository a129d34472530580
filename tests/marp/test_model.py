"""Model loading: presets, HF config parsing, exact parameter counts (checked against HF-built models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzyd.errors import ModelConfigError
from frenzyd.marp.model import list_presets, load_model, param_count, spec_from_config

PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
}


@pytest.mark.parametrize(("name", "count"), sorted(PUBLISHED.items()))
def test_preset_parameter_counts_match_published_sizes(name: str, count: int) -> None:
    assert param_count(load_model(name)) == count


def test_presets_listed_include_required_ones() -> None:
    presets = list_presets()
    for name in [*PUBLISHED, "gpt2-large", "tiny-llama", "tiny-gpt2"]:
        assert name in presets


def test_preset_fields() -> None:
    llama3 = load_model("llama-3-8b")
    assert (llama3.family, llama3.kv_heads, llama3.head_dim, llama3.ffn) == ("llama", 8, 128, 14336)
    assert not llama3.tied_embeddings
    assert llama3.gated_mlp
    assert llama3.norm == "rmsnorm"
    qwen = load_model("qwen2.5-7b")
    assert qwen.qkv_bias
    assert not qwen.o_bias
    gpt2 = load_model("gpt2")
    assert gpt2.tied_embeddings
    assert gpt2.ffn == 3072
    assert gpt2.learned_positions
    assert gpt2.attn_dropout == 0.1


HF_CASES = [
    {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 500, "n_positions": 128},
    {
        "model_type": "gpt2",
        "n_embd": 64,
        "n_layer": 3,
        "n_head": 2,
        "vocab_size": 300,
        "n_positions": 64,
        "n_inner": 100,
        "tie_word_embeddings": False,
    },
    {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 500,
    },
    {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 300,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "head_dim": 32,
    },
    {
        "model_type": "mistral",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 320,
        "sliding_window": 32,
    },
    {
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 400,
        "tie_word_embeddings": True,
    },
]


@pytest.mark.parametrize("cfg", HF_CASES, ids=lambda c: f"{c['model_type']}-{len(c)}")
def test_param_count_equals_hf_model_built_on_meta(cfg: dict[str, object]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    assert param_count(spec_from_config(dict(cfg))) == sum(p.numel() for p in hf.parameters())


def test_presets_param_count_equals_hf_model_for_each_family() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name in ("gpt2-medium", "llama-3-8b", "qwen2.5-7b", "mistral-7b", "tiny-qwen2"):
        spec = load_model(name)
        config = transformers.AutoConfig.for_model(**spec.hf_config)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(config)
        assert param_count(spec) == sum(p.numel() for p in hf.parameters()), name


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(ModelConfigError, match="llama-3-8b") as info:
        load_model("llama-9-1t")
    assert "gpt2" in str(info.value)


def test_config_json_path_loads(tmp_path: Path) -> None:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(HF_CASES[2]))
    spec = load_model(str(path))
    assert spec.name == "cfg"
    assert spec.kv_heads == 2
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(HF_CASES[0]))
    assert load_model(str(tmp_path / "m")).name == "m"


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"model_type": "gpt2", "n_embd": 100, "n_head": 3}, "not divisible by the 3 attention heads"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 6,
                "num_hidden_layers": 2,
                "intermediate_size": 10,
                "vocab_size": 10,
            },
            "not divisible",
        ),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 8,
                "num_key_value_heads": 3,
                "num_hidden_layers": 2,
                "intermediate_size": 10,
                "vocab_size": 10,
            },
            "key/value heads",
        ),
        ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 8}, "lacks 'num_hidden_layers'"),
        (
            {
                "model_type": "llama",
                "hidden_size": -4,
                "num_attention_heads": 8,
                "num_hidden_layers": 2,
                "intermediate_size": 10,
                "vocab_size": 10,
            },
            "hidden_size",
        ),
        ({"model_type": "gpt2", "n_layer": "twelve"}, "n_layer"),
        ({"model_type": "gpt2", "attn_pdrop": 1.5}, "probability"),
        ({"model_type": "bert"}, "not supported"),
        (
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_attention_heads": 8,
                "num_hidden_layers": 2,
                "intermediate_size": 10,
                "vocab_size": 10,
                "hidden_act": "relu",
            },
            "silu",
        ),
    ],
)
def test_bad_configs_raise_clear_errors(cfg: dict[str, object], match: str) -> None:
    with pytest.raises(ModelConfigError, match=match):
        spec_from_config(cfg)


def test_unreadable_config_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelConfigError, match="cannot read"):
        load_model(str(bad))
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="not a JSON object"):
        load_model(str(arr))
