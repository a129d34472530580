"""Which SDPA path the reference step takes (per device, dtype, K/V heads) and what it saves: issue 19.

The real-run tests measure on the CPU with real tensors; the CUDA math path is
the same ATen composite (``_scaled_dot_product_attention_math``), so forcing it
on the CPU measures the bytes a CUDA fp32 run with grouped K/V heads saves.
"""

from __future__ import annotations

from typing import Any

import pytest

from frenzyd.marp.activations import attention_kernel, kv_repeated, layer_bytes
from frenzyd.marp.analytic import predict
from frenzyd.marp.model import spec_from_config
from frenzyd.marp.spec import ModelSpec, TrainingSetup


def _llama(heads: int = 4, kv: int = 2, head_dim: int = 16, layers: int = 2, **kw: Any) -> ModelSpec:
    cfg: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": heads * head_dim,
        "intermediate_size": 176,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        **kw,
    }
    return spec_from_config(cfg, name=f"llama-h{heads}-kv{kv}-d{head_dim}")


@pytest.mark.parametrize(
    ("kv", "head_dim", "dtype", "device", "kernel", "repeated"),
    [
        # CPU: flash for fp32 and bf16, grouped heads through enable_gqa (no copy)
        (2, 16, "fp32", "cpu", "flash", False),
        (2, 16, "bf16", "cpu", "flash", False),
        (4, 16, "fp32", "cpu", "flash", False),
        # CUDA: 16-bit -> flash (GQA native); fp32 MHA -> memory-efficient;
        # fp32 GQA -> efficient rejects enable_gqa in torch 2.13 -> math
        (2, 16, "bf16", "cuda", "flash", False),
        (2, 16, "bf16-mixed", "cuda", "flash", False),
        (4, 16, "fp32", "cuda", "efficient", False),
        (2, 16, "fp32", "cuda", "math", False),
        (1, 16, "fp32", "cuda", "math", False),
        # head_dim > 256: transformers repeats K/V itself (use_gqa_in_sdpa is false)
        (2, 512, "fp32", "cuda", "efficient", True),
        (2, 512, "bf16", "cuda", "efficient", True),
        (2, 512, "fp32", "cpu", "flash", True),
        (4, 512, "fp32", "cpu", "flash", False),
    ],
)
def test_kernel_selection(
    kv: int, head_dim: int, dtype: str, device: str, kernel: str, repeated: bool
) -> None:
    spec = _llama(heads=4, kv=kv, head_dim=head_dim)
    assert attention_kernel(spec, dtype, device, 512) == kernel  # type: ignore[arg-type]
    assert kv_repeated(spec, 512) is repeated


def _saved_by_layer1(spec: ModelSpec, b: int, s: int, backend: str | None) -> int:
    """Bytes of the storages autograd saves inside decoder layer 1 in one real fp32 forward."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config = transformers.AutoConfig.for_model(**spec.hf_config)
    torch.manual_seed(0)
    auto = transformers.AutoModelForCausalLM
    model = auto.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    inside = [False]
    layer = model.model.layers[1]
    layer.register_forward_pre_hook(lambda m, i: inside.__setitem__(0, True))
    layer.register_forward_hook(lambda m, i, o: inside.__setitem__(0, False))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()
    total = [0]

    def pack(t):  # type: ignore[no-untyped-def]
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            if inside[0]:
                total[0] += st.nbytes()
        return t

    backends = [SDPBackend.MATH] if backend == "math" else [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    ids = torch.randint(0, config.vocab_size, (b, s))
    with sdpa_kernel(backends), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return total[0]


def _predicted_layer(spec: ModelSpec, b: int, s: int, device: str, kernel: Any = None) -> int:
    lb = layer_bytes(spec, "fp32", device, s, kernel=kernel)  # type: ignore[arg-type]
    return int(b * s * (lb.per_token + s * lb.per_token_s)) + lb.weight_copies


def test_math_kernel_saved_bytes_equal_a_real_forward_and_the_cuda_fp32_gqa_figure() -> None:
    spec, b, s = _llama(heads=4, kv=2, head_dim=16), 2, 128
    measured = _saved_by_layer1(spec, b, s, "math")
    # q scaled, K scaled and V repeated to 4 heads, probabilities b·a·s², the head-merge copy, norms, SwiGLU
    assert measured == _predicted_layer(spec, b, s, "cpu", "math")
    # CUDA picks the math kernel for fp32 with grouped heads; it computes in fp32 as the CPU does
    assert measured == _predicted_layer(spec, b, s, "cuda")
    # and the CPU's own choice (flash, grouped heads native) saves far less
    assert _saved_by_layer1(spec, b, s, None) == _predicted_layer(spec, b, s, "cpu") < measured


def test_repeated_kv_saved_bytes_equal_a_real_forward() -> None:
    # head_dim 512 > 256: transformers' repeat_kv copies K/V to every query head before SDPA
    spec, b, s = _llama(heads=4, kv=2, head_dim=512), 1, 32
    assert kv_repeated(spec, s)
    measured = _saved_by_layer1(spec, b, s, None)
    assert measured == _predicted_layer(spec, b, s, "cpu")
    # the copies (4 heads), not the grouped heads (2), are what SDPA holds: as much as 4 K/V heads
    lb_rep = layer_bytes(spec, "fp32", "cpu", s)
    assert lb_rep.per_token == layer_bytes(_llama(heads=4, kv=4, head_dim=512), "fp32", "cpu", s).per_token
    # one K/V head: repeat_kv's expand + reshape is a view, nothing is copied
    mqa = _llama(heads=2, kv=1, head_dim=512)
    assert kv_repeated(mqa, s)
    assert _saved_by_layer1(mqa, b, s, None) == _predicted_layer(mqa, b, s, "cpu")
    assert layer_bytes(mqa, "fp32", "cpu", s).per_token < layer_bytes(
        _llama(heads=2, kv=2, head_dim=512), "fp32", "cpu", s
    ).per_token


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_fp32_gqa_step_on_cpu_and_with_the_math_kernel_measured(recompute: str) -> None:
    """The issue's family (LLaMA fp32, grouped K/V heads) at a long sequence, real steps on the CPU.

    The CPU prediction equals the real step (flash kernel; within 0.1 %).  The CUDA path (math
    kernel) forced on the CPU: the prediction for that kernel under torch's
    MemTracker view stays within +2 % / -0.5 % of the real step.  Its backward
    phase is what the CUDA prediction holds too (the allocator and MemTracker
    see the same tensors there).
    """
    pytest.importorskip("torch")
    from frenzyd.marp.trace import measure_real

    spec = _llama(heads=8, kv=2, head_dim=32, layers=2)
    setup = TrainingSetup(seq_len=1024, micro_batch=1, dtype="fp32", recompute=recompute)  # type: ignore[arg-type]
    real = measure_real(spec, setup)
    if recompute == "none":  # (with recompute the default backward transients dominate this tiny model)
        assert abs(predict(spec, setup, device="cpu").peak_bytes / real.peak_bytes - 1) <= 0.001
    math = measure_real(spec, setup, sdpa_backend="math")
    pred = predict(spec, setup, device="cpu", sdpa_backend="math")
    assert -0.005 <= pred.peak_bytes / math.peak_bytes - 1 <= 0.02
    cuda = predict(spec, setup, device="cuda")
    assert cuda.phases["backward"] == pred.phases["backward"]
    assert cuda.peak_bytes >= pred.peak_bytes
    assert math.peak_bytes > real.peak_bytes  # the b·a·s² probabilities the flash kernel never stores


def test_cuda_forward_counts_the_allocator_view_of_the_math_kernel() -> None:
    # Beyond what MemTracker sees (mask added out of place, composites opaque), the caching allocator
    # holds _safe_softmax's softmax output, its eq(-inf) bool mask and the where result: at a sequence
    # long enough for the attention to dominate, the CUDA forward exceeds the CPU-math one by 1.25
    # score matrices of the one layer being run.
    spec = _llama(heads=4, kv=1, head_dim=16, layers=1)
    setup = TrainingSetup(seq_len=2048, micro_batch=1, dtype="fp32")
    cuda = predict(spec, setup, device="cuda").phases["forward"]
    cpu_math = predict(spec, setup, device="cpu", sdpa_backend="math").phases["forward"]
    assert cuda - cpu_math == int(1.25 * 4 * 4 * 2048 * 2048)
