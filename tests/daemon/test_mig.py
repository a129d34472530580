"""MIG instances are devices: a workstation whose A100 is split into MIG instances offers each
instance, a one-rank job runs on one with ``CUDA_VISIBLE_DEVICES`` naming it by UUID (CUDA's only
way to address an instance), and a job of several ranks is never put on MIG instances (a process
sees one instance; NCCL cannot join instances of one GPU)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from frenzyd.daemon import Daemon
from frenzyd.errors import InfeasibleError
from frenzyd.gpu_types import GIB, MIG_INDEX_BASE, cuda_device, is_mig_type, known_type, mig_index
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import OfferedGpu, PeerOffer, marp_plans, place
from frenzyd.net import auth
from frenzyd.node.launcher import RankSpec, rank_env

from .conftest import fast_config
from .test_inventory_nvml import FakeGpu, Proc, fake_nvml

ROOT = Path(__file__).resolve().parents[2]
MIG_3G = "A100-40GB-MIG-3g.20gb"


def test_a_mig_type_is_its_parent_scaled_by_its_compute_slices() -> None:
    parent, mig = known_type("A100-40GB"), known_type(MIG_3G)
    assert parent is not None
    assert mig is not None
    assert mig.speed == pytest.approx(parent.speed * 3 / 7)
    assert mig.peak_tflops == pytest.approx(parent.peak_tflops * 3 / 7)
    assert mig.memory_bytes == 20 * GIB
    assert mig.assumed
    assert known_type("NOPE-MIG-3g.20gb") is None  # an unknown parent is not guessed
    assert is_mig_type(MIG_3G)
    assert not is_mig_type("A100-40GB")


def test_cuda_names_a_mig_instance_by_uuid() -> None:
    assert cuda_device(2, "GPU-x") == "2"
    assert cuda_device(mig_index(0, 1), "MIG-abc") == "MIG-abc"
    assert mig_index(3, 6) == MIG_INDEX_BASE + 36
    spec = RankSpec(job_id="j", rank=0, local_rank=0, world_size=1, local_world_size=1,
                    master_addr="127.0.0.1", master_port=29500, gpu_indices=(1000,), argv=["x"],
                    workdir=Path("/tmp"), output_dir=Path("/tmp"), cuda_devices=("MIG-abc",))
    assert rank_env(spec, base={})["CUDA_VISIBLE_DEVICES"] == "MIG-abc"


def _offer(*gpus: OfferedGpu) -> PeerOffer:
    return PeerOffer("p1", "p1", "127.0.0.1:1", f"{sys.version_info.major}.{sys.version_info.minor}.0",
                     "2.13.0", gpus)


def _mig(slot: int) -> OfferedGpu:
    return OfferedGpu(f"MIG-{slot}", mig_index(0, slot), MIG_3G, 20 * GIB, 20 * GIB, simulated=False,
                      available=True)


def _spec(**kw: Any) -> JobSpec:
    return JobSpec(argv=("train.py",), payload_sha256="0" * 64, payload_size=0,
                   python_version=f"{sys.version_info.major}.{sys.version_info.minor}.0",
                   torch_version="2.13.0", **kw)


def test_one_rank_fits_a_mig_instance_and_two_never_share_them() -> None:
    offers = [_offer(_mig(0), _mig(1))]
    one = place(_spec(nproc=1, mem_per_rank=GIB), offers)
    assert one is not None
    assert one.ranks[0].gpu.startswith("MIG-")
    with pytest.raises(InfeasibleError, match="MIG"):
        place(_spec(nproc=2, mem_per_rank=GIB), offers)


def test_marp_plans_a_mig_type_for_one_gpu_only() -> None:
    offers = [_offer(_mig(0), _mig(1), _mig(2))]
    plans = marp_plans(_spec(model="tiny-llama", seq_len=128, global_batch=8), offers, headroom=0.1,
                       only_available=True)
    assert plans
    assert {p.gpus for p in plans} == {1}


async def test_a_real_daemon_runs_a_one_rank_job_on_a_mig_instance(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = FakeGpu("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-aaaa", 20 * GIB)
    b = FakeGpu("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "MIG-bbbb", 20 * GIB)
    parent = FakeGpu("NVIDIA A100-SXM4-40GB", "GPU-parent", 40 * GIB, mig=[a, b])
    busy = FakeGpu(uuid="GPU-owner", used=9 * GIB, compute=[Proc(11, 9 * GIB)])  # the owner's: withheld
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([parent, busy], names={11: "python"}))
    config = fast_config(tmp_path, pool_creds["n1"])
    config = replace(config, jobs=replace(config.jobs, unplaceable_after_s=2.0))
    d, stop = Daemon(config), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 30)
        gpus = {g["uuid"]: g for g in d._gpus()}
        assert {u: (g["index"], g["offered"]) for u, g in gpus.items()} == {
            "MIG-aaaa": (mig_index(0, 0), True), "MIG-bbbb": (mig_index(0, 1), True),
            "GPU-owner": (1, False)}
        work = tmp_path / "work"
        work.mkdir()
        (work / "show.py").write_text(
            "import os\nprint('DEV', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['LOCAL_RANK'])\n")
        code, out, err = await _client(tmp_path / "n1" / "client.sock", work, "--nproc", "1",
                                       "--mem-per-rank", "1GiB")
        assert code == 0, err
        lines = [json.loads(x) for x in out.splitlines()]
        text = "".join(x["data"] for x in lines if x.get("type") == "output" and x["stream"] == "stdout")
        assert text.startswith("DEV "), out
        dev, local = text.split()[1:3]
        assert dev in {"MIG-aaaa", "MIG-bbbb"}
        assert local == "0"
        # Two ranks never share MIG instances: the job waits, says why, and fails once it has been
        # unplaceable for [jobs] unplaceable_after_s.
        code, out, err = await _client(tmp_path / "n1" / "client.sock", work, "--nproc", "2",
                                       "--mem-per-rank", "1GiB")
        assert code == 1, (out, err)
        final = json.loads(out.splitlines()[-1])
        assert final["state"] == "failed"
        assert "MIG instance(s) are left out" in final["message"]
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


async def _client(sock: Path, work: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("FRENZY_DAEMON", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "frenzy_client", "run", "--daemon", f"unix:{sock}", "--json", *args, "--",
        "show.py", cwd=work, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
