"""Refused inputs and their messages, the data order, the corpus, the control channel, and the entry point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frenzyd.errors import ConfigError, PlanError
from frenzyd.marp.combos import COMBOS, refusal
from frenzyd.marp.model import load_model
from frenzyd.trainer import control
from frenzyd.trainer.corpus import generate, write_corpus
from frenzyd.trainer.data import DataError, TokenData
from frenzyd.trainer.plan import plan_from, resolve
from tests.trainer.conftest import ROOT, write_configs


@pytest.fixture
def cfg(tmp_path: Path) -> dict[str, str]:
    return write_configs(tmp_path)


def _plan(cfg: dict[str, str], **kw: Any) -> dict[str, Any]:
    return {"model": cfg["llama"], "data": "d.txt", "seq_len": 16, "global_batch": 12, "steps": 3, **kw}


# --------------------------------------------------------------------------- refusals


def test_data_shorter_than_one_global_batch(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("x" * (16 * 12 - 1))
    with pytest.raises(DataError, match=r"11 sequences of 16, shorter than one global batch of 12 sequences"):
        TokenData(path, vocab=256, seq_len=16, global_batch=12, seed=0)
    path.write_text("x" * (16 * 12))
    assert TokenData(path, vocab=256, seq_len=16, global_batch=12, seed=0).sequences == 12


def test_token_ids_beyond_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    ids = np.zeros(16 * 12, dtype=np.uint16)
    ids[77] = 300
    ids.tofile(path)
    with pytest.raises(DataError, match=r"token id 300 >= the model's vocabulary of 256"):
        TokenData(path, vocab=256, seq_len=16, global_batch=12, seed=0)
    assert TokenData(path, vocab=301, seq_len=16, global_batch=12, seed=0).sequences == 12


def test_text_bytes_beyond_a_small_vocabulary_and_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("zzzz" * 100)
    with pytest.raises(DataError, match=r"byte value 122 >= the model's vocabulary of 100"):
        TokenData(path, vocab=100, seq_len=4, global_batch=2, seed=0)
    path.write_bytes(b"ok" * 100 + b"\xff\xfe")
    with pytest.raises(DataError, match=r"is not UTF-8 text \(byte 200\)"):
        TokenData(path, vocab=256, seq_len=4, global_batch=2, seed=0)


def test_bin_width_follows_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    np.arange(64, dtype=np.uint32).tofile(path)
    data = TokenData(path, vocab=70_000, seq_len=4, global_batch=2, seed=0)
    assert data.tokens.dtype == np.uint32
    assert int(data.tokens[63]) == 63
    path.write_bytes(b"\x00" * 7)
    with pytest.raises(DataError, match=r"not a whole number of uint16 tokens"):
        TokenData(path, vocab=256, seq_len=1, global_batch=1, seed=0)


def test_global_batch_no_plan_divides(cfg: dict[str, str]) -> None:
    with pytest.raises(PlanError, match=r"global batch 10 is not divisible by dp=4"):
        resolve(_plan(cfg, global_batch=10, dp=4))
    with pytest.raises(PlanError, match=r"6 sequences per data-parallel rank are not a multiple of 4"):
        resolve(_plan(cfg, dp=2, micro_batch=4))
    with pytest.raises(PlanError, match=r"use grad_accum=3"):
        resolve(_plan(cfg, dp=2, micro_batch=2, grad_accum=2))
    p = resolve(_plan(cfg, dp=2, micro_batch=2))
    assert (p.micro_batch, p.grad_accum) == (2, 3)


def test_plans_outside_the_table_are_refused(cfg: dict[str, str]) -> None:
    with pytest.raises(PlanError, match=r"tp=8 does not divide the 4 attention heads"):
        resolve(_plan(cfg, model=cfg["gpt2"], tp=8))
    with pytest.raises(ConfigError, match=r"zero = 4 must be 0, 1, 2 or 3"):
        resolve(_plan(cfg, dp=2, tp=2, pp=2, zero=4))
    from frenzyd.marp.spec import TrainingSetup

    outside = TrainingSetup(seq_len=16, micro_batch=1, global_batch=8, dp=2, tp=2, pp=2, zero=4)
    assert "does not run dp=2 tp=2 pp=2 zero=4" in str(refusal(outside, load_model("tiny-llama")))
    three_d = resolve(_plan(cfg, dp=2, tp=2, pp=2, zero=3))  # 3-D meshes are in the table
    assert (three_d.world_size, three_d.micro_batch, three_d.grad_accum) == (8, 3, 2)
    with pytest.raises(PlanError, match=r"tp=4 does not divide the 2 key/value heads"):
        resolve(_plan(cfg, tp=4))
    with pytest.raises(PlanError, match=r"1F1B needs at least as many micro-batches as stages"):
        resolve(_plan(cfg, pp=2, micro_batch=12))
    with pytest.raises(ConfigError, match=r"the trainer needs training data"):
        resolve({**_plan(cfg), "data": None})


def test_flags_override_frenzy_plan_and_bad_json_is_refused(cfg: dict[str, str]) -> None:
    env = {"FRENZY_PLAN": json.dumps({**_plan(cfg), "dp": 2, "gpu_type": "RTX-3090", "bytes_per_gpu": 1})}
    plan, _ = plan_from(["--steps", "7", "--zero", "3"], env)
    assert (plan.steps, plan.dp, plan.zero, plan.micro_batch, plan.grad_accum) == (7, 2, 3, 6, 1)
    with pytest.raises(ConfigError, match=r"FRENZY_PLAN is not valid JSON"):
        plan_from([], {"FRENZY_PLAN": "{dp: 2"})


def test_combos_table_is_consistent() -> None:
    """Each entry's own degree pattern is accepted, and names are unique."""
    from frenzyd.marp.spec import TrainingSetup

    spec = load_model("tiny-llama")
    assert len({c.name for c in COMBOS}) == len(COMBOS)
    for c in COMBOS:
        deg = {w: (1 if getattr(c, w) == "one" else 2) for w in ("dp", "tp", "pp")}
        setup = TrainingSetup(seq_len=16, micro_batch=1, global_batch=8, zero=c.zero, **deg)
        assert refusal(setup, spec) is None, c.name


# --------------------------------------------------------------------------- data order, corpus, control


def test_data_order_is_a_seeded_permutation_split_by_rank(tmp_path: Path) -> None:
    path = write_corpus(tmp_path / "c.txt", 4000, seed=3)
    a = TokenData(path, vocab=256, seq_len=10, global_batch=8, seed=5)
    b = TokenData(path, vocab=256, seq_len=10, global_batch=8, seed=5)
    assert np.array_equal(a.batch_sequences(7), b.batch_sequences(7))
    epoch = np.concatenate([a.batch_sequences(k) for k in range(a.batches_per_epoch)])
    assert len(set(epoch.tolist())) == len(epoch)  # no sequence twice in an epoch
    whole = a.local_batch(2, 0, 1)
    halves = np.concatenate([a.local_batch(2, r, 2) for r in range(2)])
    assert np.array_equal(whole, halves)
    assert not np.array_equal(a.batch_sequences(0), TokenData(path, vocab=256, seq_len=10, global_batch=8,
                                                              seed=6).batch_sequences(0))


def test_corpus_is_deterministic_utf8() -> None:
    text = generate(5000, seed=1)
    assert text == generate(5000, seed=1)
    assert text != generate(5000, seed=2)
    assert len(text.encode()) >= 5000
    assert any(ord(ch) > 127 for ch in text)


def test_report_writes_json_lines_to_the_control_fd(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    for var in ("FRENZY_CONTROL_FD", "FRENZY_JOB_ID", "FRENZY_ATTEMPT"):
        monkeypatch.delenv(var, raising=False)
    control.reset_for_tests()
    assert control.report(1, 2.5) is False
    assert "FRENZY_CONTROL_FD is not set" in caplog.text
    r, w = os.pipe()
    try:
        monkeypatch.setenv("FRENZY_CONTROL_FD", str(w))
        monkeypatch.setenv("RANK", "3")
        control.reset_for_tests()
        assert control.report(4, 1.25, tokens_per_s=10.0)
        assert control.checkpoint_complete(4, "/ck/step-4")
        monkeypatch.setenv("FRENZY_JOB_ID", "j7")
        monkeypatch.setenv("FRENZY_ATTEMPT", "2")
        assert control.report(5, 1.0)
        os.close(w)
        lines = [json.loads(x) for x in os.read(r, 10_000).decode().splitlines()]
    finally:
        os.close(r)
        control.reset_for_tests()
    assert lines == [{"type": "step", "step": 4, "loss": 1.25, "tokens_per_s": 10.0, "rank": 3},
                     {"type": "checkpoint_complete", "rank": 3, "step": 4, "path": "/ck/step-4"},
                     {"type": "step", "step": 5, "loss": 1.0, "rank": 3, "job": "j7", "attempt": 2}]
    with pytest.raises(ValueError, match="finite"):
        control.report(1, float("nan"))


def test_import_is_light() -> None:
    code = ("import sys, frenzyd.trainer; "
            "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


# --------------------------------------------------------------------------- the entry point


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRENZY_", "RANK", "WORLD_SIZE",
                                                                     "MASTER_", "LOCAL_RANK"))}
    return {**env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
            **extra}


def test_cli_refuses_short_data_and_a_world_size_mismatch(tmp_path: Path, cfg: dict[str, str]) -> None:
    data = tmp_path / "tiny.txt"
    data.write_text("hello world")
    args = [sys.executable, "-m", "frenzyd.trainer", "--model", cfg["llama"], "--data", str(data),
            "--seq-len", "16", "--global-batch", "12", "--steps", "2"]
    out = subprocess.run(args, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120,
                         check=False)
    assert out.returncode == 2
    assert "shorter than one global batch of 12 sequences" in out.stderr
    out = subprocess.run([*args, "--dp", "2"], capture_output=True, text=True, env=_env(WORLD_SIZE="1"),
                         cwd=tmp_path, timeout=120, check=False)
    assert out.returncode == 2
    assert "the plan needs 2 ranks" in out.stderr


def test_cli_stops_on_sigterm_with_a_complete_checkpoint(tmp_path: Path, cfg: dict[str, str]) -> None:
    """torchrun's world of one: FRENZY_PLAN + env dirs; SIGTERM mid-run -> checkpoint, exit 143."""
    data = write_corpus(tmp_path / "c.txt", 20_000)
    plan = _plan(cfg, data=str(data), steps=100_000, dtype="fp32", checkpoint_every=0)
    env = _env(FRENZY_PLAN=json.dumps(plan), FRENZY_CHECKPOINT_DIR=str(tmp_path / "ck"),
               FRENZY_OUTPUT_DIR=str(tmp_path / "out"), FRENZY_STOP_GRACE_S="30")
    lines = []
    with subprocess.Popen([sys.executable, "-m", "frenzyd.trainer"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append(json.loads(raw))
            if len(lines) == 3:
                proc.send_signal(signal.SIGTERM)
                break
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 143
    lines += [json.loads(x) for x in rest.splitlines()]
    assert set(lines[0]) == {"step", "steps", "loss", "lr", "tokens_per_s", "eta_s", "step_s"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["state"] == "stopped"
    assert summary["steps_done"] == lines[-1]["step"]
    step_dir = tmp_path / "ck" / f"step-{summary['steps_done']:08d}"
    assert (step_dir / "COMPLETE").is_file()
    assert (step_dir / ".metadata").is_file()
    assert json.loads((tmp_path / "out" / "memory" / "rank-0.json").read_text())["peak_tensor_bytes"] > 0
