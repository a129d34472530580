"""frenzy-client predict: flags, JSON keys, GPU list parsing, fix-it errors."""

from __future__ import annotations

import json

import pytest

from frenzy_client.cli import run_cli
from frenzy_client.cmd_predict import parse_gpus
from frenzyd.errors import ConfigError

BASE = ["predict", "--model", "tiny-llama", "--seq-len", "256", "--micro-batch", "2", "--dtype", "fp32"]


def run(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    rc = run_cli([*BASE, *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_schema_keys_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--json")
    assert rc == 0
    obj = json.loads(out)
    assert set(obj) == {
        "model",
        "params",
        "device",
        "method",
        "peak_bytes",
        "per_rank_peak_bytes",
        "peak_phase",
        "breakdown",
    }
    assert obj["device"] == "cuda"
    assert obj["method"] == "analytic"
    assert obj["per_rank_peak_bytes"] == [obj["peak_bytes"]]  # one rank
    assert set(obj["breakdown"]) == {"parameters", "gradients", "optimizer", "activations", "temporaries"}
    assert sum(obj["breakdown"].values()) == obj["peak_bytes"]
    assert obj["model"] == "tiny-llama"
    assert obj["params"] == 6_867_200
    assert obj["peak_phase"] in ("forward", "loss", "backward", "optimizer")


def test_json_with_gpus_has_plans(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--json", "--gpus", "A100-80GB:2,rtx-3090:4/2", "--global-batch", "8")
    assert rc == 0
    plans = json.loads(out)["plans"]
    assert plans
    keys = {
        "gpu_type",
        "gpus",
        "dp",
        "tp",
        "pp",
        "zero",
        "micro_batch",
        "grad_accum",
        "bytes_per_gpu",
        "gpu_memory_bytes",
        "step_time_s",
    }
    for p in plans:
        assert set(p) == keys
        assert p["gpu_type"] in ("A100-80GB", "RTX-3090")


def test_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--gpus", "T4:2")
    assert rc == 0
    assert "peak tensor memory" in out
    assert "activations" in out
    assert "feasible plans" in out
    assert "T4" in out


def test_help_states_headroom_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_cli(["predict", "--help"])
    assert "(default: 0.1)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-9"], "give a preset (gpt2"),
        (["--tp", "3"], "tp in [1, 2]"),
        (["--pp", "3"], "divide the 4 layers"),
        (["--dp", "2", "--global-batch", "6"], "not a multiple"),
        (["--gpus", "B200:4"], "unknown GPU type 'B200'"),
        (["--gpus", "A100-80GB"], "TYPE:COUNT"),
        (["--gpus", "A100-80GB:x"], "integers"),
        (["--gpus", "A100-80GB:0"], "positive"),
        (["--headroom", "-1"], "headroom"),
        (["--method", "trace", "--seq-len", "99999"], "positions"),
    ],
)
def test_errors_say_what_to_do(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    rc, _, err = run(capsys, *args)
    assert rc == 1
    assert message in err
    assert "Traceback" not in err


def test_heads_not_dividing_hidden(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_embd": 100, "n_head": 3, "n_layer": 2}))
    rc = run_cli(["predict", "--model", str(cfg), "--seq-len", "16", "--micro-batch", "1", "--dtype", "fp32"])
    assert rc == 1
    assert "not divisible by the 3 attention heads" in capsys.readouterr().err


def test_infeasible_pool_message(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run_cli(
        [
            "predict",
            "--model",
            "llama-2-70b",
            "--seq-len",
            "4096",
            "--micro-batch",
            "1",
            "--dtype",
            "fp32",
            "--gpus",
            "RTX-3090:2",
        ]
    )
    assert rc == 1
    err = capsys.readouterr().err
    assert "needs at least" in err
    assert "the largest GPU offers 24.0 GiB" in err


def test_parse_gpus_merges_and_canonicalises() -> None:
    pools = parse_gpus("a100-80gb:4, A100-80GB:4/4,T4:2")
    assert [(p.gpu_type, p.count) for p in pools] == [("A100-80GB", 8), ("T4", 2)]
    assert pools[0].gpus_per_node == 4
    with pytest.raises(ConfigError):
        parse_gpus(" , ")


def test_per_rank_peaks_one_per_rank_pipeline_stages_differ(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--json", "--dp", "2", "--pp", "2", "--global-batch", "8")
    assert rc == 0
    obj = json.loads(out)
    ranks = obj["per_rank_peak_bytes"]
    assert len(ranks) == 4  # dp x pp, rank = stage x dp + d
    assert ranks[0] == ranks[1]
    assert ranks[2] == ranks[3]
    assert ranks[0] != ranks[2]  # the first stage holds the embedding and more microbatches in flight
    assert max(ranks) == obj["peak_bytes"]


def test_per_rank_peaks_cover_middle_stages(capsys: pytest.CaptureFixture[str]) -> None:
    from frenzyd.marp.analytic import predict
    from frenzyd.marp.model import load_model
    from frenzyd.marp.spec import TrainingSetup

    setup = TrainingSetup(seq_len=256, micro_batch=1, dtype="bf16", pp=4, tp=2, global_batch=8)
    pred = predict(load_model("tiny-llama"), setup, per_rank=True)
    assert len(pred.rank_peaks) == 8
    stages = pred.rank_peaks[::2]
    assert stages[0] > stages[1] > stages[2]  # fewer microbatches in flight further down the pipe
    assert max(stages) == pred.peak_bytes
    assert predict(load_model("tiny-llama"), setup).rank_peaks == ()  # only when asked (the planner's path)


def test_device_flag_changes_the_attention_path_and_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-llama is GQA; in fp32 at seq 1024 CUDA takes the math kernel (b·a·s² probabilities), the CPU flash
    args = ["predict", "--model", "tiny-llama", "--seq-len", "1024", "--micro-batch", "1", "--dtype", "fp32"]
    assert run_cli([*args, "--json", "--device", "cpu"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert run_cli([*args, "--json", "--device", "cuda"]) == 0
    cuda = json.loads(capsys.readouterr().out)
    assert cpu["device"] == "cpu"
    assert cuda["device"] == "cuda"
    assert cuda["peak_bytes"] > cpu["peak_bytes"]
    assert run_cli([*args, "--device", "cpu"]) == 0
    assert "cpu kernels" in capsys.readouterr().out


def test_trace_prediction_fills_every_rank() -> None:
    from frenzyd.marp.spec import Breakdown
    from frenzyd.marp.trace import Measurement

    bd = Breakdown(10, 0, 0, 0, 0)
    one = Measurement("m", 1, 10, "loss", bd, {"loss": 10}, "trace", world_size=2)
    assert one.to_prediction().rank_peaks == (10, 10)  # one rank traced; data-parallel ranks are symmetric
    every = Measurement("m", 1, 10, "loss", bd, {"loss": 10}, "real", world_size=2, rank_peaks=(9, 10))
    assert every.to_prediction().rank_peaks == (9, 10)
