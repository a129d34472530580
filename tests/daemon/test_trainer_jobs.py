"""Training with no script: ``frenzy-client run --model --data`` through real orchestrators, launchers
and trainer ranks (gloo), and the refusals the client makes before submitting anything."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from frenzy_client import cmd_jobs, trainer_job
from frenzyd.errors import WireError
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.rank_host import rank_command
from frenzyd.marp.calibration import load_calibration
from frenzyd.marp.combos import runs
from frenzyd.marp.model import load_model, spec_from_config
from frenzyd.marp.plans import feasible_plans
from frenzyd.marp.spec import GpuPool, TrainingSetup
from frenzyd.node.launcher import Launcher, RankSpec
from frenzyd.trainer.corpus import write_corpus

from . import test_cli_jobs
from .test_cli_jobs import Env

env = test_cli_jobs.env
"""The fixture: one node with 2 simulated T4s, its client API on a unix socket, the CLI as a subprocess."""

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "attention_dropout": 0.0}
"""A LLaMA small enough to train 2 ranks x 12 steps in seconds on this machine."""

TRAIN = ("--seq-len", "16", "--global-batch", "8", "--steps", "12", "--dtype", "fp32", "--lr", "3e-3",
         "--checkpoint-every", "5")


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


async def test_run_with_no_script_trains_on_a_marp_plan_and_returns_the_model(env: Env) -> None:
    work = env.tmp / "me"
    work.mkdir()
    write_corpus(work / "corpus.txt", 32 << 10)
    (work / "frenzy-results" / "old").mkdir(parents=True)  # an earlier job's results: never shipped
    (work / "frenzy-results" / "old" / "big.bin").write_bytes(b"x" * 1024)
    # HAS picks among MARP's trainer plans (here: one T4, the plan using the fewest GPUs); the
    # two-rank path of the same command is test_two_ranks_run_the_trainer_on_a_marp_plan.
    rc, out, err = await env.cli("run", "--model", "tiny-llama", "--data", "corpus.txt", *TRAIN, "--json",
                                 cwd=work)
    assert rc == 0, err
    lines = _lines(out)
    final = lines[-1]
    assert final["type"] == "final"
    assert sum(ln["type"] == "final" for ln in lines) == 1
    job = final["job"]
    states = [ln["job"]["state"] for ln in lines if ln["type"] == "state"]
    assert states[-1] == "succeeded"
    assert "running" in states
    steps = [ln for ln in lines if ln["type"] == "step"]
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert all(s["job"] == job and s["attempt"] == 1 and s["steps"] == 12 for s in steps)
    plan = final["plan"]
    # MARP chose the plan, and only one the trainer runs; the ranks ran it.
    model = load_model("tiny-llama")
    setup = TrainingSetup(seq_len=16, micro_batch=plan["micro_batch"], dtype="fp32", global_batch=8,
                          dp=plan["dp"], tp=plan["tp"], pp=plan["pp"], zero=plan["zero"])
    assert plan["source"] == "marp"
    assert runs(setup, model)
    assert final["plans"] == [plan]
    assert final["attempts"] == 1
    assert final["state"] == "succeeded"
    assert final["failed_rank"] is None
    assert final["steps"] == 12
    assert final["steps_done"] == 12
    assert len(final["losses"]) == 12
    assert final["losses"] == [s["loss"] for s in steps]
    assert final["loss_last"] < final["loss_first"] - 0.5  # it learned (bytes of a vocabulary of 8000)
    assert final["final_eval_loss"] is not None
    assert final["tokens_per_s"] > 0
    assert len(final["measured_peak_bytes"]) == plan["gpus"]
    assert len(final["predicted_peak_bytes"]) == plan["gpus"]
    assert min(final["predicted_peak_bytes"]) > 0
    res = work / "frenzy-results" / job
    assert final["model_dir"] == str((res / "model").resolve())
    assert (res / "model" / "config.json").is_file()
    assert (res / "model" / "model.safetensors").is_file()
    written = json.loads((res / "summary.json").read_text())
    assert written["losses"] == final["losses"]
    assert written["job"] == job
    assert json.loads((res / "trainer-summary.json").read_text())["steps_done"] == 12

    # The job's record says what ran; its payload held the data file only.
    rec = env.pool.nodes["a"].orch.store.get(job)
    assert rec.spec.trainer
    assert rec.spec.argv == ()
    assert rec.spec.data_name == "corpus.txt"
    assert rec.spec.lr == 3e-3
    assert rec.spec.checkpoint_every == 5
    ckpts = sorted((env.tmp / "a" / "runs" / job / "a1" / "checkpoints").glob("step-*"))
    assert ckpts
    assert ckpts[-1].name == "step-00000010"
    # The submitter folded the measured per-rank peaks into its MARP calibration file (issue 19);
    # a CPU run is kept but never corrects a GPU type.
    listed = json.loads((await env.cli("jobs", "--json", cwd=work))[1])["jobs"]
    entry = next(j for j in listed if j["id"] == job)
    progress = entry["progress"]
    assert (progress["step"], progress["steps"], progress["attempt"]) == (12, 12, 1)
    assert entry["memory"]["measured_peak_bytes"] == final["measured_peak_bytes"]
    assert entry["memory"]["predicted_peak_bytes"] == final["predicted_peak_bytes"]
    cal = load_calibration(env.tmp / "a" / "marp-calibration.json")
    corr = cal.correction("T4", "llama", "2.13.0")
    assert (corr.applies, corr.runs, corr.cpu_runs_ignored) == (False, 0, 1)

    # wait and results on the finished job give the same final summary.
    rc, out, err = await env.cli("wait", job, "--json", cwd=work)
    assert rc == 0, err
    again = _lines(out)[-1]
    assert again["type"] == "final"
    assert again["losses"] == final["losses"]
    rc, out, err = await env.cli("results", job, "--out", str(env.tmp / "fetched"), "--json", cwd=work)
    assert rc == 0, err
    assert (env.tmp / "fetched" / "model" / "model.safetensors").is_file()
    assert json.loads(out)["final_eval_loss"] == final["final_eval_loss"]


async def test_run_with_a_config_file(env: Env) -> None:
    work = env.tmp / "me"
    work.mkdir()
    (work / "tiny.json").write_text(json.dumps(TINY))
    write_corpus(work / "corpus.txt", 8 << 10)
    rc, out, err = await env.cli("run", "--model", "tiny.json", "--data", "corpus.txt", "--seq-len", "16",
                                 "--global-batch", "4", "--steps", "3", "--dtype", "fp32", "--name", "mine",
                                 "--results-dir", str(env.tmp / "res"), cwd=work)
    assert rc == 0, err
    assert '"step": 3' in out
    assert "succeeded" in err
    final = json.loads((env.tmp / "res" / "summary.json").read_text())
    assert final["steps_done"] == 3
    assert len(final["losses"]) == 3
    cfg = json.loads((env.tmp / "res" / "model" / "config.json").read_text())
    assert cfg["hidden_size"] == 32
    assert cfg["vocab_size"] == 256


async def test_refusals_before_submission(env: Env) -> None:
    work = env.tmp / "me"
    work.mkdir()
    write_corpus(work / "corpus.txt", 4 << 10)
    (work / "train.py").write_text("print('hi')\n")
    base = ("run", "--model", "tiny-llama", "--data", "corpus.txt", "--seq-len", "16", "--global-batch", "8",
            "--steps", "3")
    cases: list[tuple[tuple[str, ...], str]] = [
        ((*base, "--", "train.py"), "drop a script after '--'"),
        ((*base, "--micro-batch", "2"), "drop --micro-batch"),
        ((*base, "--zero", "3"), "drop --zero"),
        ((*base, "--nproc", "2"), "drop --nproc"),
        (("run", "--model", "tiny-llama", "--data", "corpus.txt", "--seq-len", "16"),
         "needs --global-batch, --steps"),
        (("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--lr", "0.1", "--", "train.py"),
         "--lr only apply to the built-in trainer"),
        (("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--stand-in", "--", "train.py"),
         "--stand-in only apply to the built-in trainer"),
        (("run", "--model", "no-such-model", "--data", "corpus.txt", "--seq-len", "16", "--global-batch", "8",
          "--steps", "3"), "unknown preset"),
        (("run", "--model", "tiny-llama", "--data", "missing.txt", "--seq-len", "16", "--global-batch", "8",
          "--steps", "3"), "no such file"),
        (("run", "--model", "tiny-llama", "--data", "corpus.txt", "--seq-len", "512", "--global-batch", "64",
          "--steps", "3"), "global batch"),
    ]
    np.arange(300, 400, dtype=np.uint16).tofile(work / "ids.bin")
    cases.append((("run", "--model", "tiny.json", "--data", "ids.bin", "--seq-len", "4",
                   "--global-batch", "2", "--steps", "3"), "vocabulary"))
    (work / "tiny.json").write_text(json.dumps(TINY))
    for args, why in cases:
        rc, out, err = await env.cli(*args, cwd=work)
        assert rc == 2, (args, rc, err)
        assert why in err, (args, err)
        assert out == ""
    assert env.pool.nodes["a"].orch.store.all() == []  # nothing was submitted
    assert not list(work.glob(".frenzy-data-*"))


def test_data_over_the_cap_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    work = tmp_path
    write_corpus(work / "corpus.txt", 4 << 10)
    monkeypatch.setattr(trainer_job, "default_max_data_bytes", lambda: 1000)
    p = cmd_jobs.argparse.ArgumentParser()
    sub = p.add_subparsers()
    cmd_jobs.register(sub)
    args = p.parse_args(["run", "--model", "tiny-llama", "--data", "corpus.txt", "--seq-len", "16",
                         "--global-batch", "2", "--steps", "3"])
    with pytest.raises(trainer_job.UsageError, match="over the pool's cap of 1000"):
        cmd_jobs.build_request(args, work)


def test_trainer_spec_round_trip_and_older_records() -> None:
    spec = JobSpec(argv=(), payload_sha256="ab" * 32, payload_size=10, python_version="3.11.7",
                   torch_version="2.13.0", model="tiny-llama", seq_len=16, global_batch=8, steps=3,
                   trainer=True, data_name="corpus.txt", lr=1e-3, warmup=1, checkpoint_every=2, seed=4)
    assert JobSpec.from_dict(spec.to_dict()) == spec.validate()
    script = JobSpec(argv=("train.py",), payload_sha256="ab" * 32, payload_size=10, python_version="3.11.7",
                     torch_version="2.13.0", nproc=1, mem_per_rank=1)
    old = script.to_dict()
    assert "trainer" not in old  # a script job's dict (and its wire frames) did not change
    assert JobSpec.from_dict(old) == script
    assert not JobSpec.from_dict(old).trainer
    for bad, why in (({"argv": ["x.py"]}, "runs no script"), ({"data_name": "../x"}, "plain file name"),
                     ({"micro_batch": 2}, "plan comes from MARP"), ({"steps": None}, "--steps")):
        with pytest.raises(WireError, match=why.replace("-", r"\-")):
            JobSpec.from_dict(spec.to_dict() | bad)


def test_marp_proposes_only_plans_the_trainer_runs() -> None:
    model = load_model("tiny-llama")
    setup = TrainingSetup(seq_len=16, micro_batch=1, dtype="fp32", global_batch=8)
    pools = [GpuPool(gpu_type="T4", count=4, memory_bytes=16 << 30, speed=1.0, gpus_per_node=4)]
    every = feasible_plans(model, setup, pools)
    ours = feasible_plans(model, setup, pools, trainer_only=True)

    def setup_of(p: Any) -> TrainingSetup:
        return TrainingSetup(seq_len=16, micro_batch=p.micro_batch, dtype="fp32", global_batch=8, dp=p.dp,
                             tp=p.tp, pp=p.pp, zero=p.zero)

    assert any(not runs(setup_of(p), model) for p in every)  # MARP alone proposes 1F1B with grad_accum < pp
    assert ours
    assert all(runs(setup_of(p), model) for p in ours)


async def test_two_ranks_run_the_trainer_on_a_marp_plan(tmp_path: Path) -> None:
    """What a rank host starts for a trainer job placed on two GPUs: MARP's two-GPU trainer plan
    (pp=2, 1F1B), the model given as a config, through the real launcher and rendezvous store."""
    spec = JobSpec(argv=(), payload_sha256="ab" * 32, payload_size=1, python_version="3.11",
                   torch_version="2.13.0", name="tiny", model_config=TINY, seq_len=16, global_batch=8,
                   steps=4, dtype="fp32", trainer=True, data_name="corpus.txt", lr=3e-3,
                   checkpoint_every=2).validate()
    setup = TrainingSetup(seq_len=16, micro_batch=1, dtype="fp32", global_batch=8)
    pool = [GpuPool(gpu_type="T4", count=2, memory_bytes=16 << 30, speed=1.0, gpus_per_node=2)]
    best = next(p for p in feasible_plans(spec_from_config(TINY, name="tiny"), setup, pool, trainer_only=True)
                if p.gpus == 2)
    plan = {"gpu_type": best.gpu_type, "gpus": 2, "dp": best.dp, "tp": best.tp, "pp": best.pp,
            "zero": best.zero, "micro_batch": best.micro_batch, "grad_accum": best.grad_accum}
    run_dir, work, out = tmp_path / "run", tmp_path / "run" / "work", tmp_path / "run" / "output"
    work.mkdir(parents=True)
    write_corpus(work / "corpus.txt", 8 << 10)
    argv, env_ = rank_command(spec, plan, run_dir, work, 2.0)
    sent = json.loads(env_["FRENZY_PLAN"])
    assert sent["model"] == str(run_dir / "model-config.json")
    assert sent["data"] == str(work / "corpus.txt")
    assert (sent["seq_len"], sent["global_batch"], sent["steps"], sent["lr"]) == (16, 8, 4, 3e-3)
    assert env_["FRENZY_STOP_GRACE_S"] == "2.0"
    launcher = Launcher(tmp_path / "data", term_grace_s=2.0, lease_s=120.0)
    lines: list[bytes] = []
    try:
        port = await launcher.start_store("j", 1, "127.0.0.1")
        handles = [await launcher.launch(
            RankSpec(job_id="j", rank=r, local_rank=r, world_size=2, local_world_size=2,
                     master_addr="127.0.0.1", master_port=port, gpu_indices=(0, 1), argv=argv, workdir=work,
                     output_dir=out, env=env_),
            lambda rank, stream, data: lines.append(data) if rank == 0 and stream == "stdout" else None)
            for r in (0, 1)]
        codes = [await h.wait() for h in handles]
    finally:
        await launcher.cancel("j", 1)
    assert codes == [0, 0], b"".join(lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["plan"]["pp"] == best.pp
    assert summary["plan"]["dp"] * best.pp * best.tp == 2
    assert summary["steps_done"] == 4
    assert summary["losses"][-1] < summary["losses"][0]
    assert len(summary["measured_peak_bytes"]) == 2
    assert (out / "model" / "model.safetensors").is_file()
    # every 2 steps, not after the last one (the model is the result then); only the newest is kept
    assert sorted(os.listdir(env_["FRENZY_CHECKPOINT_DIR"])) == ["step-00000002"]


def test_client_states_the_trainers_defaults() -> None:
    from frenzyd.trainer.plan import DEFAULTS

    assert {k: DEFAULTS[k] for k in trainer_job.TRAINER_DEFAULTS} == trainer_job.TRAINER_DEFAULTS
    parser = cmd_jobs.argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cmd_jobs.register(sub)
    text = " ".join(sub.choices["run"].format_help().split())
    for flag, v in (("--lr", "0.0003"), ("--warmup", "0"), ("--checkpoint-every", "50"), ("--seed", "0"),
                    ("--dtype", "bf16-mixed"), ("--recompute", "none"), ("--optimizer", "adamw")):
        assert f"default {v}" in text, flag


def test_client_refuses_the_data_the_trainer_refuses(tmp_path: Path) -> None:
    from frenzyd.errors import ConfigError
    from frenzyd.trainer.data import TokenData

    cases = {
        "ok.txt": "héllo wörld " * 40,
        "empty.txt": b"",
        "latin1.txt": "caf\xe9 ".encode("latin-1") * 100,
        "cut.txt": "é".encode() * 100 + b"\xc3",
        "short.txt": "abc",
        "odd.bin": b"\x01\x02\x03",
        "big.bin": np.array([1, 2, 70, 3] * 100, dtype=np.uint16).tobytes(),
        "ok.bin": np.array([1, 2, 63, 3] * 100, dtype=np.uint16).tobytes(),
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        for vocab in (64, 256):
            try:
                TokenData(path, vocab=vocab, seq_len=8, global_batch=4, seed=0)
                trainer_ok = True
            except ConfigError:
                trainer_ok = False
            try:
                trainer_job.check_data(path, vocab=vocab, seq_len=8, global_batch=4)
                client_ok = True
            except trainer_job.UsageError:
                client_ok = False
            assert client_ok == trainer_ok, (name, vocab)


async def test_a_vacated_trainer_job_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The owner takes the GPU of a running trainer job: its rank is stopped (SIGTERM: it saves a
    checkpoint), the job is requeued, and the next attempt on the node's other GPU continues from
    the newest complete checkpoint instead of step 0 (local resume; see rank_host.rank_command)."""
    from .orch_harness import Pool, wait_state

    pool = Pool(tmp_path)
    try:
        a = pool.add("a", 2)
        pool.coordinator = "a"
        pool.start()
        d = tmp_path / "job"
        d.mkdir()
        write_corpus(d / "corpus.txt", 16 << 10)
        steps = 600
        rec = await a.orch.submit({
            "workdir": str(d), "argv": [], "trainer": True, "data_name": "corpus.txt", "model_config": TINY,
            "name": "tiny", "seq_len": 16, "global_batch": 8, "steps": steps, "dtype": "fp32", "lr": 3e-3,
            "checkpoint_every": 20})
        first = await wait_state(a, rec.id, {"running"})
        progress = trainer_job.Progress(rec.id)
        async with asyncio.timeout(120):
            async for ev in a.orch.store.follow(rec.id):
                progress.event(ev)
                if progress.last_step is not None and progress.last_step["step"] >= 25:
                    break
        gpu = next(g for g in a.gpus if g["uuid"] == first["ranks"][0]["gpu"])
        gpu["foreign_processes"] = 1  # the workstation's owner starts something on that GPU
        gpu["offered"] = False
        assert await a.orch.protect_owner(a.gpus) == [rec.id]
        done = await wait_state(a, rec.id, {"succeeded", "failed"}, limit=180)
        assert done["state"] == "succeeded", done
        assert done["attempt"] >= 2
        assert done["ranks"][0]["gpu"] != gpu["uuid"]
        summary = json.loads(_results_file(a.orch.store.results(rec.id), "summary.json"))
        resumed = summary["resumed_from_step"]
        assert resumed >= 20
        assert resumed < steps
        assert summary["steps_done"] == steps
        assert len(summary["losses"]) == steps
        printed = trainer_job.Progress(rec.id)
        for ev in a.orch.store.read_output(rec.id):
            printed.event(ev)
        before = printed.losses[1]  # attempt 1's losses, as its rank 0 printed them
        assert max(before) >= resumed  # it got as far as its last checkpoint (and perhaps further)
        assert summary["losses"][:resumed] == [before[s] for s in range(1, resumed + 1)]
        after = printed.losses[done["attempt"]]
        assert min(after) == resumed + 1  # the last attempt started where the checkpoint left off
    finally:
        await pool.close()


def _results_file(data: bytes | None, name: str) -> str:
    import io
    import tarfile

    assert data
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        f = tf.extractfile(name)
        assert f is not None
        return f.read().decode()


def test_placement_of_a_trainer_job_uses_only_trainer_plans_and_says_what_to_change() -> None:
    from frenzyd.errors import InfeasibleError
    from frenzyd.jobs.placement import OfferedGpu, PeerOffer, marp_plans, place

    gpus = tuple(OfferedGpu(f"G{i}", i, "T4", 16 << 30, 16 << 30, True, True) for i in range(4))
    offers = [PeerOffer("a", "a", "127.0.0.1:1", "3.11.7", "2.13.0", gpus)]
    spec = JobSpec(argv=(), payload_sha256="ab" * 32, payload_size=1, python_version="3.11.7",
                   torch_version="2.13.0", model="tiny-llama", seq_len=16, global_batch=8, steps=3,
                   dtype="fp32", trainer=True, data_name="corpus.txt")
    model = load_model("tiny-llama")
    plans = marp_plans(spec, offers, headroom=0.1, only_available=True)
    assert plans
    for p in plans:
        assert p.micro_batch is not None
        setup = TrainingSetup(seq_len=16, micro_batch=p.micro_batch, dtype="fp32", global_batch=8, dp=p.dp,
                              tp=p.tp, pp=p.pp, zero=p.zero)
        assert runs(setup, model), p
    huge = JobSpec(**{**spec.to_dict(), "argv": (), "model": "llama-2-70b", "seq_len": 4096})
    with pytest.raises(InfeasibleError, match="no plan the built-in trainer runs"):
        place(huge, offers)


def test_script_jobs_get_the_model_in_their_plan_and_keep_their_command(tmp_path: Path) -> None:
    spec = JobSpec(argv=("train.py", "--lr", "1"), payload_sha256="ab" * 32, payload_size=1,
                   python_version="3.11.7", torch_version="2.13.0", model="gpt2", seq_len=128,
                   global_batch=16).validate()
    argv, env_ = rank_command(spec, {"dp": 2, "tp": 1, "pp": 1, "zero": 0}, tmp_path, tmp_path / "work", 7.0)
    assert argv == ["train.py", "--lr", "1"]
    plan = json.loads(env_["FRENZY_PLAN"])
    assert plan == {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "model": "gpt2", "seq_len": 128, "global_batch": 16}
    assert env_["FRENZY_STOP_GRACE_S"] == "7.0"
    assert "FRENZY_CHECKPOINT_DIR" not in env_  # a script declares nothing checkpointable yet
