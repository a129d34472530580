"""The live pool runs the scheduler the simulator measures (issue 14): HAS gets the running
checkpointable jobs, and the coordinator carries out its preemptions through checkpoints.

Real orchestrators, launchers, supervisors and built-in trainer ranks (gloo), linked by the
harness's router (the real wire codec); ``jobs.min_run_s`` shrunk to 2 s.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

from frenzyd.trainer.corpus import write_corpus

from .orch_harness import Node, Pool, eventually, pool, wait_state

assert pool  # the fixture

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "attention_dropout": 0.0}


def trainer_request(tmp: Path, name: str, steps: int, checkpoint_every: int = 5) -> dict[str, Any]:
    """What ``frenzy-client run --model CONFIG --data corpus.txt`` submits (trainer_job.py)."""
    work = tmp / name
    work.mkdir()
    write_corpus(work / "corpus.txt", 32 << 10)
    return {"trainer": True, "argv": [], "model_config": TINY, "name": name, "data_name": "corpus.txt",
            "seq_len": 16, "global_batch": 8, "steps": steps, "dtype": "fp32", "optimizer": "adamw",
            "recompute": "none", "lr": 3e-3, "warmup": None, "checkpoint_every": checkpoint_every,
            "seed": 0, "workdir": str(work)}


def steps_of(node: Node, job_id: str) -> list[tuple[int, int]]:
    """(attempt, step) of every step line rank 0 printed, in order."""
    out = []
    for ev in node.orch.store.read_output(job_id):
        if ev.get("rank") != 0 or ev.get("stream") != "stdout":
            continue
        for line in str(ev.get("data", "")).splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and isinstance(d.get("step"), int) and "loss" in d:
                out.append((int(ev.get("attempt", 0)), d["step"]))
    return out


async def test_a_short_job_preempts_a_long_one_which_resumes_from_its_checkpoint(
    pool: Pool, tmp_path: Path
) -> None:
    """One GPU, a long trainer job on it; a short job arrives.  HAS stops the long one (a preemption:
    SIGTERM, checkpoint, requeue, not a lost attempt), the short one runs on the freed GPU and
    finishes first, and the long one resumes from its checkpoint, not from step 0."""
    pool.min_run_s = 2.0
    pool.add("a", 0)
    pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    long = await c.orch.submit(trainer_request(tmp_path, "long", steps=100_000))
    await wait_state(c, long.id, {"running"})
    await eventually(lambda: any(s >= 8 for _, s in steps_of(c, long.id)), limit=120)
    short = await c.orch.submit(trainer_request(tmp_path, "short", steps=6))
    done = await wait_state(c, short.id, {"succeeded", "failed"}, limit=180)
    assert done["state"] == "succeeded", done
    assert pool.nodes["a"].orch.coordinator.preemptions >= 1
    # The long job runs again and resumes where its checkpoint left it.
    await eventually(lambda: any(a >= 2 for a, _ in steps_of(c, long.id)), limit=120)
    rec = c.orch.store.get(long.id)
    assert rec.attempt >= 2, rec
    assert rec.lost == 0  # a preemption is not a lost attempt
    first = steps_of(c, long.id)
    stopped_at = max(s for a, s in first if a == 1)
    resumed_at = min(s for a, s in first if a >= 2)
    assert resumed_at > 5, (stopped_at, resumed_at)  # not step 0: it loaded a checkpoint
    assert resumed_at <= stopped_at + 1
    short_rec = c.orch.store.get(short.id)
    assert short_rec.finished_at is not None
    assert short_rec.finished_at < (c.orch.store.get(long.id).finished_at or float("inf"))
    await c.orch.submitter.cancel(long.id)
    await asyncio.sleep(0.5)


async def test_a_job_whose_gpu_owner_returns_resumes_on_another_node_from_its_submitters_checkpoint(
    pool: Pool, tmp_path: Path
) -> None:
    """The owner of the GPU a trainer job runs on comes back: the ranks get SIGTERM and write a
    checkpoint, the rank host sends its part to the submitter before the exit report, and the next
    attempt, on another node, fetches that checkpoint and resumes from it (no shared disk)."""
    pool.add("a", 0)
    b = pool.add("b", 1)
    d = pool.add("d", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    job = await c.orch.submit(trainer_request(tmp_path, "long", steps=100_000, checkpoint_every=5))
    first = await wait_state(c, job.id, {"running"})
    host = pool.nodes[first["ranks"][0]["peer"]]
    other = d if host is b else b
    await eventually(lambda: any(s >= 8 for _, s in steps_of(c, job.id)), limit=120)
    host.gpus[0]["offered"] = False  # the owner's own work: not offered again
    assert await host.orch.protect_owner([{**host.gpus[0], "foreign_processes": 1}]) == [job.id]
    await eventually(lambda: any(a >= 2 for a, _ in steps_of(c, job.id)), limit=120)
    rec = c.orch.store.get(job.id)
    assert rec.ranks[0].peer == other.nid
    meta = c.orch.store.checkpoint_meta(job.id)
    assert meta is not None  # (by now attempt 2's own copies may have replaced attempt 1's)
    steps = steps_of(c, job.id)
    resumed_at = min(s for a, s in steps if a >= 2)
    stopped_at = max(s for a, s in steps if a == 1)
    # from attempt 1's checkpoint (the one its stop wrote, or an earlier one), not from step 0
    assert resumed_at > 5, steps[-5:]
    assert resumed_at <= stopped_at + 1
    assert not (pool.tmp / other.nid / "runs" / job.id / "a1").exists()  # not a local leftover
    await c.orch.submitter.cancel(job.id)
    await asyncio.sleep(0.5)


async def test_a_stand_in_runs_on_simulated_gpus_at_marps_pace(pool: Pool, tmp_path: Path) -> None:
    """``stand_in``: a gpt2-medium job on simulated GPUs trains a small stand-in whose every step
    takes MARP's step time for gpt2-medium on the placed plan (at least 0.5 s); steps, checkpoint
    and results are real."""
    pool.add("a", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    req = trainer_request(tmp_path, "medium", steps=4, checkpoint_every=0)
    req.update(model="gpt2-medium", model_config=None, seq_len=128, stand_in=True)
    job = await c.orch.submit(req)
    done = await wait_state(c, job.id, {"succeeded", "failed"}, limit=180)
    assert done["state"] == "succeeded", done
    pace = max(0.5, done["plan"]["step_time_s"])
    times = [ev["t"] for ev in c.orch.store.read_output(job.id)
             if ev.get("rank") == 0 and '"step"' in str(ev.get("data"))]
    assert len(times) >= 2
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.8 * pace, (pace, gaps)  # paced (output batching blurs single gaps a little)
    assert [s for _, s in steps_of(c, job.id)] == [1, 2, 3, 4]


async def test_a_job_survives_the_loss_of_its_rank_host_from_the_checkpoint_its_submitter_keeps(
    pool: Pool, tmp_path: Path
) -> None:
    """The node running a trainer job dies (SIGKILL: no stop, no exit report).  Its checkpoints were
    copied to the submitter after each save while it ran, so the next attempt, on another node,
    resumes from the last one and the job finishes with every step done."""
    pool.add("a", 0)
    b = pool.add("b", 1)
    d = pool.add("d", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    job = await c.orch.submit(trainer_request(tmp_path, "long", steps=400, checkpoint_every=5))
    first = await wait_state(c, job.id, {"running"})
    host = pool.nodes[first["ranks"][0]["peer"]]
    other = d if host is b else b

    def kept() -> int:
        meta = c.orch.store.checkpoint_meta(job.id)
        return int(meta["step"]) if meta is not None else 0

    await eventually(lambda: kept() >= 10, limit=120)
    await pool.kill(host.nid)
    done = await wait_state(c, job.id, {"succeeded", "failed"}, limit=400)
    assert done["state"] == "succeeded", done
    assert done["ranks"][0]["peer"] == other.nid
    steps = steps_of(c, job.id)
    resumed_at = min(s for a, s in steps if a >= 2)
    assert resumed_at > 10  # from a checkpoint the dead node had sent, not from step 0
    assert max(s for a, s in steps if a >= 2) == 400
