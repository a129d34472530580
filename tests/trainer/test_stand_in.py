"""The stand-in a trainer job runs on simulated GPUs (``StandIn``, ``rank_host.stand_in_plan``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from frenzyd.errors import ConfigError
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import MIN_STAND_IN_STEP_S
from frenzyd.jobs.rank_host import rank_command
from frenzyd.trainer.loop import RunEnv, train
from frenzyd.trainer.plan import StandIn, resolve


def spec(**kw: object) -> JobSpec:
    base = {"argv": (), "payload_sha256": "0" * 64, "payload_size": 0, "python_version": "3.11.7",
            "torch_version": "2.13.0", "model": "llama-2-7b", "seq_len": 2048, "global_batch": 64,
            "steps": 10,
            "dtype": "bf16-mixed", "trainer": True, "data_name": "corpus.txt", "stand_in": True}
    return JobSpec(**{**base, **kw})  # type: ignore[arg-type]


PLAN = {"gpu_type": "A100-80GB", "gpus": 4, "dp": 1, "tp": 2, "pp": 2, "zero": 0, "micro_batch": 1,
        "grad_accum": 64, "bytes_per_gpu": 30 << 30, "gpu_memory_bytes": 80 << 30, "step_time_s": 7.5,
        "backend": "gloo"}


def test_simulated_gpus_get_a_paced_stand_in_and_real_ones_the_model(tmp_path: Path) -> None:
    _, env = rank_command(spec(), PLAN, tmp_path, tmp_path / "work", 10.0)
    plan = json.loads(env["FRENZY_PLAN"])
    assert plan["stand_in"] == {"stands_for": "llama-2-7b", "pace_s": 7.5, "bytes_per_gpu": 30 << 30,
                                "gpu_memory_bytes": 80 << 30}
    assert (plan["dp"], plan["tp"], plan["pp"], plan["global_batch"]) == (4, 1, 1, 4)
    assert json.loads(Path(plan["model"]).read_text())["vocab_size"] == 32000  # the declared vocabulary
    resolved = resolve({**plan, "data": "x"})
    assert resolved.stand_in == StandIn("llama-2-7b", 7.5, 30 << 30, 80 << 30)
    assert resolve(resolved.to_json()) == resolved
    fast = rank_command(spec(), {**PLAN, "step_time_s": 0.01}, tmp_path, tmp_path / "w", 10.0)[1]
    assert json.loads(fast["FRENZY_PLAN"])["stand_in"]["pace_s"] == MIN_STAND_IN_STEP_S
    real = rank_command(spec(), {**PLAN, "backend": "nccl"}, tmp_path / "r", tmp_path / "w", 10.0)[1]
    assert "stand_in" not in json.loads(real["FRENZY_PLAN"])
    assert json.loads(real["FRENZY_PLAN"])["model"] == "llama-2-7b"
    with pytest.raises(ConfigError, match="--stand-in"):
        JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                torch_version="2.13.0", nproc=1, mem_per_rank=1, stand_in=True).validate()


def test_a_plan_over_the_simulated_devices_memory_is_an_out_of_memory_error(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("hello world " * 100)
    plan = resolve({"model": "tiny-llama", "data": str(tmp_path / "c.txt"), "seq_len": 16, "global_batch": 1,
                    "steps": 1, "stand_in": {"stands_for": "llama-2-70b", "pace_s": 0.5,
                                             "bytes_per_gpu": 90 << 30, "gpu_memory_bytes": 80 << 30}})
    env = RunEnv()
    with pytest.raises(torch.OutOfMemoryError, match=r"llama-2-70b on this plan needs 90\.00 GiB"):
        train(plan, env)


def test_the_client_asks_for_a_stand_in_with_stand_in(tmp_path: Path) -> None:
    from frenzy_client.cli import build_parser
    from frenzy_client.trainer_job import build_trainer_request
    from frenzyd.trainer.corpus import write_corpus

    write_corpus(tmp_path / "corpus.txt", 8 << 10)
    argv = ["run", "--model", "gpt2-medium", "--data", "corpus.txt", "--seq-len", "16", "--global-batch", "8",
            "--steps", "3"]
    plain = build_trainer_request(build_parser().parse_args(argv), tmp_path, 1 << 30)
    paced = build_trainer_request(build_parser().parse_args([*argv, "--stand-in"]), tmp_path, 1 << 30)
    assert "stand_in" not in plain
    assert paced["stand_in"] is True
    sent = {k: v for k, v in paced.items() if k != "data_file"}
    versions = {"python_version": "3.11.7", "torch_version": "2.13.0"}
    assert JobSpec.from_dict({**sent, **versions, "payload_sha256": "0" * 64, "payload_size": 1}).stand_in


def test_the_stand_in_model_is_llama_in_plain_torch_and_exports_a_directory_transformers_loads(
    tmp_path: Path
) -> None:
    """The stand-in is built without transformers (its start is most of a loopback placement's cost)
    but is LlamaForCausalLM: the directory it exports loads there and gives the same logits; the
    names a checkpoint or export uses are the same; a shape it does not cover goes to transformers."""
    import dataclasses

    from transformers import LlamaForCausalLM

    from frenzyd.marp.model import load_model
    from frenzyd.trainer import stand_in_model
    from frenzyd.trainer.export import write_hf_dir
    from frenzyd.trainer.model import build_model

    _, env = rank_command(spec(), PLAN, tmp_path, tmp_path / "work", 10.0)
    model_spec = load_model(json.loads(env["FRENZY_PLAN"])["model"])
    assert stand_in_model.supports(model_spec)
    ours = build_model(model_spec, dtype_mode="fp32", recompute="none", seed=3, stand_in=True)
    assert isinstance(ours, stand_in_model.StandInLM)
    hf = build_model(model_spec, dtype_mode="fp32", recompute="none", seed=3)
    assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in hf.named_parameters()}
    full = {n: p.detach() + 0.01 * torch.randn_like(p) for n, p in ours.named_parameters()}  # not the init
    out = write_hf_dir(model_spec, full, tmp_path / "model", dtype_mode="fp32", stand_in=True)
    loaded = LlamaForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        for n, p in ours.named_parameters():
            p.copy_(full[n])
        x = torch.randint(0, model_spec.vocab, (2, 12))
        mine = ours.eval()(input_ids=x, labels=x)
        theirs = loaded(input_ids=x, labels=x)
    torch.testing.assert_close(mine.logits, theirs.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mine.loss, theirs.loss, rtol=1e-4, atol=1e-4)
    gpt2 = load_model("gpt2")
    assert not stand_in_model.supports(gpt2)
    assert not stand_in_model.supports(dataclasses.replace(model_spec, tied_embeddings=True))
    scaled = dataclasses.replace(model_spec, hf_config={**model_spec.hf_config,
                                                        "rope_parameters": {"rope_type": "llama3"}})
    assert not stand_in_model.supports(scaled)
