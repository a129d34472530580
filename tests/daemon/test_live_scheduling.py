"""The live pool runs the scheduler the simulator measures (issue 14): HAS gets the running
checkpointable jobs, and the coordinator carries out its preemptions through checkpoints.

Real orchestrators, launchers, supervisors and built-in trainer ranks (gloo), linked by the
harness's router (the real wire codec); ``jobs.min_run_s`` shrunk to 2 s.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from frenzyd.jobs.placement import DEFAULT_START_S, DEFAULT_STOP_S
from frenzyd.trainer.corpus import write_corpus

from .orch_harness import TINY_RESTART_S, Node, Pool, eventually, pool, wait_state

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
    finishes first, and the long one resumes from its checkpoint, not from step 0.  The restart
    costs are the pool's own (60 + 36 s until measured): by MARP's ~1 us a step the 100,000-step job
    would have ~0.1 s left and never be worth stopping; HAS is told the step the pool measures."""
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
    # The coordinator measured the stop it ordered and the starts (first steps) it saw, and tells HAS
    # those instead of the defaults; and the long job's step, far above MARP's.
    coord = pool.nodes["a"].orch.coordinator
    costs = coord.restart
    await eventually(lambda: costs.starts >= 2, limit=30)
    assert costs.stops >= 1
    assert (costs.start_s, costs.stop_s) != (DEFAULT_START_S, DEFAULT_STOP_S)
    fit = coord.fits.jobs.get(long.id)
    assert fit is not None
    assert fit.extra_s > 1e-3  # a tiny CPU step takes milliseconds, not MARP's microsecond
    assert pool.nodes["a"].orch.coordinator.restart_costs()["stops_measured"] == costs.stops
    await c.orch.submitter.cancel(long.id)
    await asyncio.sleep(0.5)


async def test_a_preempted_job_resumes_from_the_checkpoint_its_stop_wrote(pool: Pool, tmp_path: Path) -> None:
    """No periodic checkpoint comes before the stop (every 10,000 steps) and the grace is long enough
    to write one: the preempted job resumes at exactly the step after its last one.  So the SIGTERM
    checkpoint was written, copied to the submitter and loaded by the next attempt: no step lost,
    none repeated.  (The other tests' 2 s grace often ends in SIGKILL on a loaded machine.)"""
    pool.min_run_s = 2.0
    pool.restart_s = TINY_RESTART_S
    pool.term_grace_s = 60.0
    pool.lease_s = 120.0  # the ranks get at most half the lease as their grace
    pool.add("a", 0)
    pool.add("b", 1)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    long = await c.orch.submit(trainer_request(tmp_path, "long", steps=100_000, checkpoint_every=10_000))
    await wait_state(c, long.id, {"running"})
    await eventually(lambda: any(s >= 3 for _, s in steps_of(c, long.id)), limit=120)
    short = await c.orch.submit(trainer_request(tmp_path, "short", steps=4, checkpoint_every=10_000))
    done = await wait_state(c, short.id, {"succeeded", "failed"}, limit=180)
    assert done["state"] == "succeeded", done
    await eventually(lambda: any(a >= 2 for a, _ in steps_of(c, long.id)), limit=120)
    rec = c.orch.store.get(long.id)
    assert rec.lost == 0
    steps = steps_of(c, long.id)
    stopped_at = max(s for a, s in steps if a == 1)
    resumed_at = min(s for a, s in steps if a >= 2)
    assert stopped_at >= 3
    assert resumed_at == stopped_at + 1, (stopped_at, resumed_at)
    # the submitter keeps it stored, not re-deflated (tensors hardly shrink; the CPU is the ranks')
    kept = (c.orch.store.dir(long.id) / "checkpoint" / "checkpoint.tgz").read_bytes()
    assert len(gzip.decompress(kept)) < len(kept)
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


def stand_in(tmp: Path, name: str, steps: int, model: str, seq_len: int, checkpoint_every: int = 2
             ) -> dict[str, Any]:
    """A ``model`` job on simulated GPUs: a paced stand-in (MARP's step time of its plan, >= 0.5 s)."""
    req = trainer_request(tmp, name, steps=steps, checkpoint_every=checkpoint_every)
    req.update(model=model, model_config=None, seq_len=seq_len, global_batch=16 if seq_len > 128 else 8,
               stand_in=True)
    return req


SLOW = ("gpt2-medium", 1024)
"""MARP: 1.44 s a step on one T4, 0.82 s on two, 0.5 s (the stand-in's floor) on an A100."""
QUICK = ("gpt2", 128)
"""0.5 s a step on any one GPU (the floor): one GPU is its cheapest plan everywhere."""


def ran_s(coord: Any, job_id: str) -> float:
    """Seconds since the coordinator saw the job's current attempt's first step (-inf: not yet)."""
    rec = coord.table.get(job_id)
    ready = coord._first_step.get((job_id, rec.attempt)) if rec is not None else None
    return -math.inf if ready is None else coord.ctx.clock() - ready


class Plans:
    """Every (attempt, GPU type, GPU count) a job ran with, from its submitter's record (polled)."""

    def __init__(self, node: Node, job_id: str) -> None:
        self.node, self.job_id = node, job_id
        self.seen: list[tuple[int, str, int]] = []
        self.task = asyncio.create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            rec = self.node.orch.store.get(self.job_id)
            if rec.state == "running" and rec.plan is not None:
                row = (rec.attempt, rec.plan.gpu_type, rec.plan.gpus)
                if not self.seen or self.seen[-1] != row:
                    self.seen.append(row)
            await asyncio.sleep(0.05)

    def stop(self) -> list[tuple[int, str, int]]:
        self.task.cancel()
        return self.seen


def assert_continues(steps: list[tuple[int, int]], total: int, every: int) -> None:
    """Each attempt's steps run on from the last checkpoint: none lost, at most ``every`` repeated,
    and the job's last step is ``total``."""
    runs: dict[int, list[int]] = {}
    for a, s in steps:
        runs.setdefault(a, []).append(s)
    order = sorted(runs)
    for a in order:
        assert runs[a] == list(range(runs[a][0], runs[a][0] + len(runs[a]))), (a, runs[a])
    assert runs[order[0]][0] == 1
    for a, b in itertools.pairwise(order):
        stopped, resumed = runs[a][-1], runs[b][0]
        assert stopped - every < resumed <= stopped + 1, (a, stopped, b, resumed)
    assert runs[order[-1]][-1] == total, runs


@pytest.mark.slow
@pytest.mark.timeout(900)  # several trainer starts: each took 40-120 s at a load of 15-30 on 2 cores
async def test_a_job_grows_onto_an_idle_gpu_then_shrinks_for_a_short_one_continuing_its_steps(
    pool: Pool, tmp_path: Path
) -> None:
    """GROW: a job on one of two GPUs takes the second once it is idle (stop with a checkpoint, restart
    on the two-GPU plan).  SHRINK: a short job arrives on the full pool; the grown job gives it one
    GPU and carries on with one.  Its steps run on from its checkpoints through every change, and both
    finish.  (Restart costs pinned at 3 s + 2 s: the decisions of a quiet pool, in test time; enough
    that the job, shrunk, does not grow again once the short one is done: one restart fewer.)"""
    pool.min_run_s = 2.0
    pool.restart_s = (3.0, 2.0)
    pool.add("a", 0)
    pool.add("b", 2)
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    coord = pool.nodes["a"].orch.coordinator
    first = await c.orch.submit(stand_in(tmp_path, "first", 2, *QUICK))
    await wait_state(c, first.id, {"running"})
    # It grows while more than 15 steps are left (2 GPUs: 0.82 s a step, 5 s to restart, against 1.44 s):
    # room for the first job's exit and its GPU's release to take 20 s on a loaded machine.
    long = await c.orch.submit(stand_in(tmp_path, "long", 30, *SLOW))
    plans = Plans(c, long.id)
    await eventually(lambda: any(g == 2 for _, _, g in plans.seen), limit=400)  # grown onto the idle GPU
    grown = plans.seen[-1][0]
    await eventually(lambda: any(a == grown for a, _ in steps_of(c, long.id)), limit=300)
    short = await c.orch.submit(stand_in(tmp_path, "short", 2, *QUICK))
    done = await wait_state(c, short.id, {"succeeded", "failed"}, limit=300)
    assert done["state"] == "succeeded", done
    end = await wait_state(c, long.id, {"succeeded", "failed"}, limit=300)
    assert end["state"] == "succeeded", end
    seen = plans.stop()
    assert seen[0][2] == 1, seen
    assert any(g == 1 and a > grown for a, _, g in seen), seen  # shrunk back to one GPU for the short job
    assert coord.preemptions >= 2
    assert c.orch.store.get(long.id).lost == 0
    assert_continues(steps_of(c, long.id), 30, every=2)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_job_on_slow_gpus_moves_onto_freed_faster_ones_continuing_its_steps(
    pool: Pool, tmp_path: Path
) -> None:
    """UPGRADE: a job runs on a T4 while the A100 is busy and another long job waits; once the A100 is
    freed, HAS moves the T4 job there (stop with a checkpoint, restart on the A100 plan) and gives the
    T4 to the waiting job.  The moved job's steps run on from its checkpoint and it finishes.
    (The product's 10 s stop grace, not the harness' 2 s: under two CPU burners the moved job once
    started again from step 1, no checkpoint complete at its stop after 3 steps, most likely the 2 s
    ending in SIGKILL while the step-2 save and the stop's own were still being written.)"""
    pool.min_run_s = 2.0
    pool.restart_s = (1.0, 1.0)
    pool.term_grace_s = 10.0
    pool.lease_s = 20.0  # the ranks get at most half the lease as their grace
    pool.add("a", 0)
    pool.add("s", 1, "T4")
    pool.add("f", 1, "A100-80GB")
    c = pool.add("c", 0)
    pool.coordinator = "a"
    pool.start()
    coord = pool.nodes["a"].orch.coordinator
    # Not much longer than the mover (HAS would stop it for the mover), and cancelled to free the A100.
    busy = await c.orch.submit(stand_in(tmp_path, "busy", 50, *SLOW))
    first = await wait_state(c, busy.id, {"running"})
    assert first["plan"]["gpu_type"] == "A100-80GB", first["plan"]  # 2.9x faster for it than a T4
    mover = await c.orch.submit(stand_in(tmp_path, "mover", 24, *SLOW))  # >= 10 left on the T4: HAS moves it
    plans = Plans(c, mover.id)
    await eventually(lambda: bool(steps_of(c, mover.id)), limit=300)
    assert plans.seen[0][1] == "T4", plans.seen
    waiting = await c.orch.submit(stand_in(tmp_path, "waiting", 400, *SLOW))
    await eventually(lambda: coord.table.get(waiting.id) is not None)
    # HAS moves only a job with min_run_s of progress as the coordinator knows it (its first step
    # reached the coordinator by a heartbeat): free the A100 after that, not when the submitter sees
    # the step (on a loaded machine the A100 could free up first, and rightly go to the waiting job).
    await eventually(lambda: ran_s(coord, mover.id) >= pool.min_run_s, limit=120)
    await c.orch.submitter.cancel(busy.id)
    # HAS moves the mover and keeps the T4 it gives up for the waiting job, until the stop frees it.
    await eventually(lambda: waiting.id in coord._pending or c.orch.store.get(waiting.id).state != "queued",
                     limit=120)
    held = coord._pending.get(waiting.id, (None,))[0]
    gpus = [r.gpu for r in held.ranks] if held is not None else [
        r.gpu for r in c.orch.store.get(waiting.id).ranks]
    assert gpus == ["SIM-s-0"], gpus
    await c.orch.submitter.cancel(waiting.id)  # not needed any more: spare the CPU
    end = await wait_state(c, mover.id, {"succeeded", "failed"}, limit=300)
    assert end["state"] == "succeeded", end
    seen = plans.stop()
    assert [t for _, t, _ in seen] == ["T4", "A100-80GB"], seen
    assert c.orch.store.get(mover.id).lost == 0
    assert_continues(steps_of(c, mover.id), 24, every=2)
