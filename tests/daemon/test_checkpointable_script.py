"""A user's script submitted with ``run --checkpointable`` is preempted like a built-in trainer job
and resumes from its own checkpoint (DESIGN.md §8).

Real orchestrators, launchers, supervisors and script ranks (gloo; ``frenzyd/examples/
checkpointable_ddp.py``), linked by the harness's router; ``jobs.min_run_s`` shrunk to 2 s.  The
script's progress reaches the scheduler over its control channel (``FRENZY_CONTROL_FD``), its
checkpoint goes to the submitter, and the next attempt gets it back in ``FRENZY_CHECKPOINT_DIR``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import frenzyd.examples
from frenzy_client import cmd_jobs, trainer_job
from frenzyd.errors import ConfigError
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.rank_host import CONTROL_CHANNEL, rank_command

from .orch_harness import TINY_RESTART_S, Node, Pool, eventually, pool, wait_state

assert pool  # the fixture

EXAMPLE = Path(frenzyd.examples.__file__).parent / "checkpointable_ddp.py"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "attention_dropout": 0.0}


def script_request(tmp: Path, name: str, steps: int, *args: str) -> dict[str, Any]:
    """What ``frenzy-client run --checkpointable --model CONFIG --seq-len 16 --global-batch 8 --steps N
    -- checkpointable_ddp.py ARGS`` submits."""
    work = tmp / name
    work.mkdir()
    shutil.copy(EXAMPLE, work / EXAMPLE.name)
    return {"argv": [EXAMPLE.name, *args], "model_config": TINY, "name": name, "seq_len": 16,
            "global_batch": 8, "steps": steps, "dtype": "fp32", "checkpointable": True, "workdir": str(work)}


def reported(node: Node, job_id: str) -> list[tuple[int, int]]:
    """(attempt, step) of every progress report rank 0 made over its control channel, in order."""
    out = []
    for ev in node.orch.store.read_output(job_id):
        if ev.get("rank") == 0 and ev.get("stream") == "control":
            for line in str(ev.get("data", "")).splitlines():
                d = json.loads(line)
                assert (d["type"], d["job"], d["attempt"]) == ("step", job_id, ev["attempt"]), d
                out.append((int(ev["attempt"]), int(d["step"])))
    return out


def test_a_checkpointable_script_gets_its_checkpoint_dir_and_control_channel(tmp_path: Path) -> None:
    spec = JobSpec(argv=("train.py", "--lr", "1"), payload_sha256="ab" * 32, payload_size=1,
                   python_version="3.11.7", torch_version="2.13.0", model="gpt2", seq_len=128,
                   global_batch=16, checkpointable=True).validate()
    assert JobSpec.from_dict(spec.to_dict()) == spec
    argv, env = rank_command(spec, {"dp": 1, "tp": 1, "pp": 1, "zero": 0}, tmp_path, tmp_path / "work", 5.0)
    assert argv[1:] == ["-m", "frenzyd.trainer.control_exec", str(tmp_path / CONTROL_CHANNEL), "--",
                        "train.py", "--lr", "1"]
    assert env["FRENZY_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints")
    assert (tmp_path / "checkpoints").is_dir()
    assert json.loads(env["FRENZY_PLAN"])["model"] == "gpt2"
    plain = JobSpec(**{**spec.to_dict(), "argv": ("train.py",), "checkpointable": False})
    assert "checkpointable" not in plain.to_dict()  # a plain script's frames are unchanged


def test_the_client_flag_declares_a_script_checkpointable_and_nothing_else(tmp_path: Path) -> None:
    shutil.copy(EXAMPLE, tmp_path / EXAMPLE.name)
    p = cmd_jobs.argparse.ArgumentParser()
    cmd_jobs.register(p.add_subparsers())

    def request(*argv: str) -> dict[str, Any]:
        return cmd_jobs.build_request(p.parse_args(["run", *argv]), tmp_path)

    req = request("--checkpointable", "--model", "tiny-llama", "--seq-len", "16", "--steps", "9", "--",
                  EXAMPLE.name, "--sleep", "0")
    assert req["checkpointable"] is True
    assert req["argv"] == [EXAMPLE.name, "--sleep", "0"]
    assert "checkpointable" not in request("--nproc", "1", "--mem-per-rank", "1GiB", "--", EXAMPLE.name)
    (tmp_path / "corpus.txt").write_text("abc " * 100)
    with pytest.raises(trainer_job.UsageError, match="always checkpoints"):
        request("--checkpointable", "--model", "tiny-llama", "--data", "corpus.txt", "--seq-len", "4",
                "--global-batch", "2", "--steps", "3")
    with pytest.raises(trainer_job.UsageError, match="give the script"):
        request("--checkpointable", "--nproc", "1", "--mem-per-rank", "1GiB")
    trainer = JobSpec(argv=(), payload_sha256="ab" * 32, payload_size=1, python_version="3.11.7",
                      torch_version="2.13.0", model="tiny-llama", seq_len=16, global_batch=8, steps=3,
                      trainer=True, data_name="corpus.txt", checkpointable=True)
    with pytest.raises(ConfigError, match="always checkpoints"):
        trainer.validate()


async def test_a_checkpointable_script_is_preempted_and_resumes_from_its_step(pool: Pool,
                                                                              tmp_path: Path) -> None:
    """One GPU, a long checkpointable script on it; a short one arrives.  HAS, which knows the long
    one's progress from its reports, stops it (SIGTERM: the script saves and exits 143), the short
    one runs on the freed GPU and finishes first, and the long one's next attempt resumes from the
    step it stopped at, from the checkpoint its submitter kept."""
    pool.min_run_s = 2.0
    pool.restart_s = TINY_RESTART_S
    pool.add("a", 0)
    pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    long = await c.orch.submit(script_request(tmp_path, "long", 100_000, "--sleep", "0.05",
                                              "--checkpoint-every", "0"))
    await wait_state(c, long.id, {"running"})
    await eventually(lambda: any(s >= 8 for _, s in reported(c, long.id)), limit=120)
    entry = next(j for j in c.orch.jobs_view() if j["id"] == long.id)
    assert entry["progress"]["step"] >= 8  # what the coordinator's HAS pass counts as done
    short = await c.orch.submit(script_request(tmp_path, "short", 6))
    done = await wait_state(c, short.id, {"succeeded", "failed"}, limit=180)
    assert done["state"] == "succeeded", done
    assert pool.nodes["a"].orch.coordinator.preemptions >= 1
    await eventually(lambda: any(a >= 2 for a, _ in reported(c, long.id)), limit=120)
    rec = c.orch.store.get(long.id)
    assert rec.attempt >= 2, rec
    assert rec.lost == 0  # a preemption, not a lost attempt
    steps = reported(c, long.id)
    stopped_at = max(s for a, s in steps if a == 1)
    resumed_at = min(s for a, s in steps if a == 2)
    # --checkpoint-every 0: its only checkpoint is the one its stop wrote, at the step it stopped
    assert resumed_at == stopped_at + 1, steps
    assert c.orch.store.checkpoint_meta(long.id)["step"] >= stopped_at  # type: ignore[index]
    assert c.orch.store.get(short.id).finished_at is not None
    await c.orch.submitter.cancel(long.id)
    await asyncio.sleep(0.5)
