"""Bounds on jobs' data (issue 16): results only from the node that ran rank 0, a result archive's
expansion capped on the client, ranks with an allow-listed environment, private run directories,
and a data directory made private at every start.  Real TLS peers, a real launcher and a real
daemon on loopback."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import stat
import tarfile
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from frenzy_client.results import ResultsRefused, extract_results
from frenzyd.config import HostPort, WebSection
from frenzyd.daemon import Daemon
from frenzyd.errors import FrenzyError, PeerError
from frenzyd.jobs.context import ClusterView, RoleContext, Versions
from frenzyd.jobs.lifecycle import run_attempt
from frenzyd.jobs.messages import JobResults
from frenzyd.jobs.model import JobPlan, JobSpec, RankAssignment, new_record
from frenzyd.jobs.orchestrator import Orchestrator
from frenzyd.jobs.store import JobStore
from frenzyd.jobs.submitter import SubmitterRole
from frenzyd.net import auth
from frenzyd.net.election import ElectionState
from frenzyd.net.network import PeerNetwork
from frenzyd.node.launcher import Launcher, RankSpec, pack_dir, rank_env, unpack

from .conftest import fast_config

# --- 5. results only from rank 0's host --------------------------------------------------------


@pytest.fixture
async def submitter_net(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> AsyncIterator[tuple[PeerNetwork, SubmitterRole, dict[str, PeerNetwork]]]:
    """n1 submitted a 2-rank job placed on n2 (rank 0) and n3 (rank 1); all three on real TLS."""
    nets: dict[str, PeerNetwork] = {}
    try:
        yield await _submitter_net(tmp_path, pool_creds, nets)
    finally:
        for net in nets.values():
            await net.stop()


async def _submitter_net(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials], nets: dict[str, PeerNetwork]
) -> tuple[PeerNetwork, SubmitterRole, dict[str, PeerNetwork]]:
    for name in ("n1", "n2", "n3"):
        creds = pool_creds[name]
        cfg = fast_config(tmp_path, creds)
        nets[name] = PeerNetwork(cfg, creds, ElectionState(creds.node_id, 0, started_at=time.monotonic(),
                                                           grace_s=cfg.timing.election_grace_s))
        await nets[name].start()
    n1 = nets["n1"]

    async def no_send(node: str, msg: Any, limit_s: float) -> dict[str, Any]:
        raise AssertionError("the submitter sends nothing here")

    ctx = RoleContext(node_id=n1.creds.node_id, node_name="n1", send=no_send, send_order=no_send,
                      view=lambda: ClusterView(None, 0, {}), spawn=lambda coro, name: coro.close(),
                      wake=lambda: None)
    store = JobStore(tmp_path / "n1-data")
    sub = SubmitterRole(ctx, store, pack_dir=pack_dir, versions=Versions("3.11.7", "2.13.0"),
                        max_payload_bytes=1 << 20, max_result_bytes=1 << 20)
    spec = JobSpec(argv=("ddp.py",), payload_sha256="cd" * 32, payload_size=10, python_version="3.11.7",
                   torch_version="2.13.0", nproc=2, mem_per_rank=1 << 30)
    plan = JobPlan(gpu_type="T4", gpus=2, dp=2, tp=1, pp=1, zero=0, micro_batch=1, grad_accum=1,
                   bytes_per_gpu=1 << 30, gpu_memory_bytes=16 << 30, source="declared", policy="frenzy",
                   peers=2, backend="gloo")
    ranks = (RankAssignment(0, nets["n2"].creds.node_id, "n2", "GPU-0", 0, 0),
             RankAssignment(1, nets["n3"].creds.node_id, "n3", "GPU-1", 1, 0))
    rec = run_attempt(new_record("n1-job-1", spec, n1.creds.node_id, "n1", 1000.0), ranks, now=1001.0,
                      term=1, plan=plan)
    store.create(rec, b"payload")
    n1.on(JobResults.KIND, Orchestrator._safe(JobResults, sub.on_results))
    for a in nets.values():
        for b in nets.values():
            if a is not b:
                a.add_address(b.address, source="static")
    assert await n1.wait_until(lambda: len(n1.live_peers()) == 2, 10.0)
    for net in (nets["n2"], nets["n3"]):
        assert await net.wait_until(lambda net=net: n1.creds.node_id in net.live_peers(), 10.0)
    return n1, sub, nets


async def test_results_are_taken_only_from_the_node_that_ran_rank_0(
    submitter_net: tuple[PeerNetwork, SubmitterRole, dict[str, PeerNetwork]],
) -> None:
    n1, sub, nets = submitter_net
    forged = JobResults("n1-job-1", 1, 0, 6, b"forged")
    with pytest.raises(PeerError, match="not_rank0_host"):  # refused and counted, as any auth refusal
        await nets["n3"].send(n1.creds.node_id, forged.KIND, forged.to_body())
    assert n1.counters.auth_refusals["not_rank0_host"] == 1
    assert sub.store.results("n1-job-1") is None
    real = JobResults("n1-job-1", 1, 0, 4, b"real")
    reply = await nets["n2"].send(n1.creds.node_id, real.KIND, real.to_body())
    assert reply.body == {"ok": True}
    assert sub.store.results("n1-job-1") == b"real"


# --- 5. result expansion capped on the client ---------------------------------------------------


def _gzip_bomb(expanded: int) -> bytes:
    """A real tar.gz of one file of ``expanded`` zero bytes, about ``expanded / 1000`` bytes long:
    gzip members concatenated (one per MiB of zeros), as gzip allows."""
    info = tarfile.TarInfo("model.bin")
    info.size = expanded
    block = gzip.compress(b"\x00" * (1 << 20), compresslevel=9)
    parts = [gzip.compress(info.tobuf(format=tarfile.GNU_FORMAT))]
    parts += [block] * (expanded >> 20)
    parts.append(gzip.compress(b"\x00" * 1024))  # the end-of-archive blocks
    return b"".join(parts)


def test_a_small_result_archive_that_expands_hugely_is_refused(tmp_path: Path) -> None:
    bomb = _gzip_bomb(1 << 30)
    assert len(bomb) < 2 << 20  # ~1 MiB on the wire, 1 GiB unpacked
    dest = tmp_path / "frenzy-results" / "job-1"
    with pytest.raises(ResultsRefused, match=r"would expand to more than \d+ bytes") as info:
        extract_results(bomb, dest)
    assert not dest.exists()  # nothing was written
    kept = dest.with_name("job-1.refused.tar.gz")
    assert kept.read_bytes() == bomb
    assert str(kept) in str(info.value)


def test_a_result_archive_of_a_million_empty_files_is_refused(tmp_path: Path) -> None:
    header = tarfile.TarInfo("f").tobuf(format=tarfile.GNU_FORMAT)
    many = gzip.compress(header * 120_000 + b"\x00" * 1024, compresslevel=1)
    with pytest.raises(ResultsRefused, match="more than 100000 entries"):
        extract_results(many, tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_ordinary_results_unpack(tmp_path: Path) -> None:
    src = tmp_path / "out"
    (src / "model").mkdir(parents=True)
    (src / "model" / "w.bin").write_bytes(os.urandom(300_000))
    (src / "log.txt").write_text("ok\n" * 50_000)
    data, _ = pack_dir(src, 64 << 20)
    assert extract_results(data, tmp_path / "got") == 2
    assert (tmp_path / "got" / "log.txt").read_text() == "ok\n" * 50_000
    with pytest.raises(FrenzyError, match="could not be unpacked"):
        extract_results(b"not an archive" + zlib.compress(b"x"), tmp_path / "bad")


# --- 8. ranks' environment and directories ------------------------------------------------------

ENV_DUMP = "import json, os\nprint(json.dumps(dict(os.environ)))\n"


async def test_ranks_get_an_allow_listed_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/ssh-agent.sock")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("FRENZY_CREDENTIALS", "/etc/frenzy/node")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("WANDB_MODE", "offline")
    work = tmp_path / "work"
    work.mkdir()
    (work / "dump.py").write_text(ENV_DUMP)
    launcher = Launcher(tmp_path / "data", env_allow=("WANDB_*",))
    chunks: list[bytes] = []

    async def out(rank: int, stream: str, data: bytes) -> None:
        if stream == "stdout":
            chunks.append(data)

    spec = RankSpec(job_id="j-env", rank=0, local_rank=0, world_size=1, local_world_size=1,
                    master_addr="127.0.0.1", master_port=29500, gpu_indices=(), argv=["dump.py"],
                    workdir=work,
                    output_dir=tmp_path / "data" / "runs" / "j-env" / "a1" / "output", env={"EXTRA": "x"})
    handle = await launcher.launch(spec, out)
    assert await handle.wait() == 0
    await launcher.close()
    env = json.loads(b"".join(chunks))
    for secret in ("SSH_AUTH_SOCK", "AWS_SECRET_ACCESS_KEY", "FRENZY_CREDENTIALS"):
        assert secret not in env
    assert env["PATH"] == os.environ["PATH"]
    got = (env["NCCL_DEBUG"], env["LC_ALL"], env["WANDB_MODE"], env["EXTRA"])
    assert got == ("INFO", "C.UTF-8", "offline", "x")
    assert env["RANK"] == "0"
    assert env["FRENZY_JOB_ID"] == "j-env"
    assert "WANDB_MODE" not in rank_env(spec, base={"WANDB_MODE": "offline"})  # only when configured


def test_run_directories_are_private(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print(1)\n")
    data, sha = pack_dir(src, 1 << 20)
    work = tmp_path / "data" / "runs" / "j-1" / "a1" / "work"
    (tmp_path / "data").mkdir()
    unpack(data, sha, work, 1 << 20)
    for d in (tmp_path / "data" / "runs", work.parent.parent, work.parent, work):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


async def test_the_data_directory_is_made_private_at_every_start(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    cfg = fast_config(tmp_path, pool_creds["n4"])
    cfg = type(cfg)(**{**cfg.__dict__, "web": WebSection(HostPort("127.0.0.1", 0))})
    cfg.node.data_dir.mkdir(mode=0o755)
    cfg.node.data_dir.chmod(0o755)
    d, stop = Daemon(cfg), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 30)
        assert stat.S_IMODE(cfg.node.data_dir.stat().st_mode) == 0o700
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)

