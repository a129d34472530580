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
    assert set(obj) == {"model", "params", "peak_bytes", "peak_phase", "breakdown"}
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
