"""Fixtures for the trainer tests: tiny model configs, a corpus, and real gloo process groups on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")

TINY_LLAMA = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_dropout": 0.0, "hidden_act": "silu",
}
TINY_GPT2 = {
    "model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64,
    "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "activation_function": "gelu_new",
}


def write_configs(root: Path) -> dict[str, str]:
    """Tiny (2 layers, hidden 32) LLaMA and GPT-2 configs with dropout 0, byte vocabulary."""
    out = {}
    for name, cfg in (("llama", TINY_LLAMA), ("gpt2", TINY_GPT2)):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = str(d / "config.json")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_group(world: int, tasks: list[dict[str, Any]], workdir: Path, *,
              timeout: float = 240) -> dict[str, Any]:
    """Run ``tasks`` in ONE process group of ``world`` real ranks (gloo, loopback); rank 0's summaries."""
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / f"results-ws{world}.json"
    scenario = workdir / f"scenario-ws{world}.json"
    scenario.write_text(json.dumps({"tasks": tasks, "results": str(results)}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "TRANSFORMERS_VERBOSITY": "error",
           "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(WORKER), str(scenario), str(world), str(free_port()), str(workdir)]
    with subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
            failed, detail = proc.returncode != 0, out[-2000:]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it forked
            proc.communicate()
            failed, detail = True, f"timed out after {timeout} s"
    if failed:
        tails = "\n".join(f"--- rank {r}\n" + (workdir / f"ws{world}-rank{r}.log").read_text()[-3000:]
                          for r in range(world) if (workdir / f"ws{world}-rank{r}.log").exists())
        pytest.fail(f"process group of {world} failed: {detail}\n{tails}")
    return dict(json.loads(results.read_text()))
