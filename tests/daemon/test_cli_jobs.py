"""frenzy-client run/status/jobs/logs/cancel as a user runs them (subprocesses) against a real client API."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from frenzy_client.cmd_jobs import parse_bytes
from frenzyd.api.client_api import ClientApi
from frenzyd.errors import ConfigError
from frenzyd.jobs.status import PeerState, build_status

from .orch_harness import DDP_SCRIPT, Pool, job_dir, wait_state

ROOT = Path(__file__).resolve().parents[2]


def status_of(pool: Pool, nid: str) -> Any:
    def status() -> dict[str, Any]:
        v = pool.view()
        return build_status(
            node_id=nid, node_name=nid, term=v.term,
            coordinator=(v.coordinator, v.coordinator) if v.coordinator else None,
            peers=[PeerState(p, p, "127.0.0.1:1", True, r) for p, r in v.peers.items()],
            jobs=pool.nodes[nid].orch.jobs_view(v),
        )
    return status


class Env:
    def __init__(self, pool: Pool, unix: ClientApi, tcp: ClientApi, tmp: Path) -> None:
        self.pool, self.unix, self.tcp, self.tmp = pool, unix, tcp, tmp

    async def cli(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                  daemon: str | None = "unix") -> tuple[int, str, str]:
        full = [sys.executable, "-m", "frenzy_client", args[0]]
        if daemon == "unix":
            full += ["--daemon", self.unix.address]
        elif daemon == "tcp":
            full += ["--daemon", self.tcp.address]
        full += list(args[1:])
        e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
        e.pop("FRENZY_DAEMON", None)
        proc = await asyncio.create_subprocess_exec(*full, cwd=cwd or self.tmp, env=e,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    pool = Pool(tmp_path)
    pool.add("a", 2)
    pool.coordinator = "a"
    pool.start()
    orch = pool.nodes["a"].orch
    unix = ClientApi(f"unix:{tmp_path}/a/client.sock", tmp_path / "a", orch, status_of(pool, "a"))
    tcp = ClientApi("127.0.0.1:0", tmp_path / "a", orch, status_of(pool, "a"))
    await unix.start()
    await tcp.start()
    try:
        yield Env(pool, unix, tcp, tmp_path)
    finally:
        await unix.stop()
        await tcp.stop()
        await pool.close()


async def test_run_streams_output_placement_and_results(env: Env) -> None:
    d = job_dir(env.tmp, DDP_SCRIPT)
    res = env.tmp / "results"
    rc, out, err = await env.cli("run", "--nproc", "2", "--mem-per-rank", "1GiB", "--results-dir", str(res),
                                 "--", "train.py", "--lr", "3e-4", cwd=d)
    assert rc == 0, err
    assert "[rank 0] rank 0/2 sum 3 args --lr 3e-4" in out
    assert "[rank 1] rank 1/2 sum 3" in out
    assert "plan: 2 x T4" in err
    assert "rank 0 -> peer a gpu SIM-a-0" in err
    assert "succeeded" in err
    assert (res / "result.txt").read_text() == "sum=3\n"


async def test_failed_job_exits_nonzero(env: Env) -> None:
    d = job_dir(env.tmp, "import sys\nsys.exit(5)\n")
    rc, _, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--", "train.py", cwd=d)
    assert rc == 1
    assert "rank 0 exited 5" in err


async def test_detach_jobs_logs_cancel_json(env: Env) -> None:
    d = job_dir(env.tmp, "import time\nprint('tick', flush=True)\ntime.sleep(600)\n")
    rc, out, err = await env.cli("run", "--detach", "--nproc", "1", "--mem-per-rank", "1GiB", "--",
                                 "train.py", cwd=d)
    assert rc == 0, err
    job_id = out.strip()
    orch = env.pool.nodes["a"].orch
    async with asyncio.timeout(60):
        async for ev in orch.store.follow(job_id):
            if ev["type"] == "output" and "tick" in ev["data"]:
                break
    rc, out, _ = await env.cli("jobs", "--json")
    assert rc == 0
    jobs = {j["id"]: j for j in json.loads(out)["jobs"]}
    assert jobs[job_id]["state"] == "running"
    rc, out, _ = await env.cli("logs", job_id, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert any(e["type"] == "output" and "tick" in e["data"] for e in events)
    rc, out, _ = await env.cli("logs", job_id)
    assert "[rank 0] tick" in out
    rc, out, _ = await env.cli("cancel", job_id)
    assert rc == 0
    assert "cancelled" in out
    rc, out, _ = await env.cli("logs", job_id, "--follow")
    assert rc == 3  # a cancelled job's status


async def test_status_json_over_tcp_needs_the_token(env: Env) -> None:
    rc, _, err = await env.cli("status", "--json", daemon="tcp")
    assert rc == 1
    assert "token" in err
    rc, _, err = await env.cli("status", "--json", daemon="tcp", env={"FRENZY_TOKEN": "wrong"})
    assert rc == 1
    assert "wrong API token" in err
    token = env.tmp / "a" / "client.token"
    assert token.stat().st_mode & 0o777 == 0o600
    assert (env.tmp / "a" / "client.sock").stat().st_mode & 0o777 == 0o660  # file permissions gate it
    rc, out, err = await env.cli("status", "--json", "--token-file", str(token), daemon="tcp")
    assert rc == 0, err
    st = json.loads(out)
    assert {"node", "coordinator", "peers", "jobs"} <= set(st)  # DESIGN §6 keys (extras are welcome)
    assert st["node"]["role"] == "coordinator"
    assert [g["uuid"] for g in st["peers"][0]["gpus"]] == ["SIM-a-0", "SIM-a-1"]
    assert all(g["simulated"] for g in st["peers"][0]["gpus"])
    rc, out, _ = await env.cli("status", daemon="tcp", env={"FRENZY_TOKEN_FILE": str(token)})
    assert rc == 0
    assert "role coordinator" in out


async def test_user_errors_are_messages_not_tracebacks(env: Env) -> None:
    d = job_dir(env.tmp)
    rc, _, err = await env.cli("run", "--", "train.py", cwd=d)
    assert rc == 1
    assert "--nproc N --mem-per-rank" in err
    rc, _, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--", "missing.py", cwd=d)
    assert rc == 1
    assert "not found" in err
    rc, _, err = await env.cli("status", daemon=None, env={"FRENZY_DAEMON": f"unix:{env.tmp}/nope.sock"})
    assert rc == 1
    assert "cannot reach frenzyd" in err
    rc, _, err = await env.cli("logs", "no-such-job")
    assert rc == 1
    assert "no job" in err
    for e in (err,):
        assert "Traceback" not in e


@pytest.mark.parametrize(("text", "value"), [
    ("4GiB", 4 << 30), ("512MiB", 512 << 20), ("1.5GiB", 3 << 29), ("8KiB", 8 << 10), ("1TiB", 1 << 40),
    ("1GB", 10**9), ("3MB", 3 * 10**6), ("2KB", 2000), ("1TB", 10**12), ("2gib", 2 << 30), ("4096B", 4096),
])
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["lots", "1G", "2 parsecs", "GiB", ""])
def test_parse_bytes_rejects_garbage(text: str) -> None:
    with pytest.raises(ConfigError, match="4GiB"):
        parse_bytes(text)


@pytest.mark.parametrize("text", ["2", "1024", "1.5"])
def test_parse_bytes_needs_a_unit(text: str) -> None:
    with pytest.raises(ConfigError, match=f"use e.g. {text}GiB"):
        parse_bytes(text)


# --- issue 17: the CLI's rough edges ----------------------------------------------------------


async def test_mem_per_rank_without_unit_is_refused_before_submitting(env: Env) -> None:
    d = job_dir(env.tmp)
    rc, _, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "2", "--", "train.py", cwd=d)
    assert rc == 2
    assert "use e.g. 2GiB" in err
    assert "Traceback" not in err
    assert env.pool.nodes["a"].orch.jobs_view() == []


async def test_unknown_preset_is_refused_before_submitting(env: Env) -> None:
    d = job_dir(env.tmp)
    rc, _, err = await env.cli("run", "--model", "no-such-model", "--seq-len", "8", "--", "train.py", cwd=d)
    assert rc == 2
    assert "unknown preset" in err
    assert "tiny-llama" in err  # the presets it could have named
    assert env.pool.nodes["a"].orch.jobs_view() == []  # no failed record left behind


async def test_name_shows_in_jobs_and_status(env: Env) -> None:
    d = job_dir(env.tmp, "import time\ntime.sleep(600)\n")
    rc, out, err = await env.cli("run", "--detach", "--name", "bert sweep #3", "--nproc", "1",
                                 "--mem-per-rank", "1GiB", "--", "train.py", cwd=d)
    assert rc == 0, err
    job_id = out.strip()
    for cmd in ("jobs", "status"):
        rc, out, _ = await env.cli(cmd)
        assert rc == 0
        (row,) = [line for line in out.splitlines() if line.startswith(job_id)]
        assert "bert sweep #3" in row
        assert "NAME" in out
    await env.cli("cancel", job_id)


async def test_final_status_line_is_printed_once(env: Env) -> None:
    d = job_dir(env.tmp)
    res = env.tmp / "results"
    rc, _, err = await env.cli("run", "--nproc", "2", "--mem-per-rank", "1GiB", "--results-dir", str(res),
                               "--", "train.py", cwd=d)
    assert rc == 0, err
    ended = [line for line in err.splitlines() if "succeeded" in line]
    assert len(ended) == 1, err
    assert "result file(s) in" in ended[0]
    # a failed job: its end once too, with the reason
    (env.tmp / "f").mkdir()
    d2 = job_dir(env.tmp / "f", "import sys\nsys.exit(5)\n")
    rc, _, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--", "train.py", cwd=d2)
    assert rc == 1
    assert len([line for line in err.splitlines() if " failed" in line]) == 1, err


async def test_status_into_a_closed_pipe_ends_quietly(env: Env) -> None:
    """``frenzy-client status | head -0``: the reader is gone before anything is written."""
    for args in (["status"], ["status", "--json"], ["jobs"]):
        r, w = os.pipe()
        os.close(r)  # the reader went away
        full = [sys.executable, "-m", "frenzy_client", args[0], "--daemon", env.unix.address, *args[1:]]
        e = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(*full, env=e, stdout=w, stderr=asyncio.subprocess.PIPE)
        os.close(w)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 141, err.decode()
        assert err.decode() == ""  # no BrokenPipeError traceback, no "Exception ignored"


async def test_results_of_a_detached_job_can_be_fetched(env: Env) -> None:
    d = job_dir(env.tmp)
    rc, out, err = await env.cli("run", "--detach", "--nproc", "2", "--mem-per-rank", "1GiB", "--",
                                 "train.py", cwd=d)
    assert rc == 0, err
    job_id = out.strip()
    done = await wait_state(env.pool.nodes["a"], job_id, {"succeeded", "failed", "cancelled"})
    assert done["state"] == "succeeded", done
    dest = env.tmp / "fetched"
    rc, out, err = await env.cli("results", job_id, "--out", str(dest))
    assert rc == 0, err
    assert f"1 file(s) of job {job_id}" in out, (out, err)
    assert (dest / "result.txt").read_text() == "sum=3\n"
    rc, out, err = await env.cli("results", job_id, "--json", "--out", str(env.tmp / "again"))
    assert rc == 0, err
    assert json.loads(out)["results_files"] == 1, (out, err)


async def test_earlier_results_are_never_shipped(env: Env) -> None:
    """Results of earlier jobs in ./frenzy-results (the default --results-dir) stay on the submitter;
    a --results-dir elsewhere inside the shipped directory is refused before submitting."""
    d = job_dir(env.tmp, "import os\nfor root, dirs, files in os.walk('.'):\n"
                         "    for f in files: print(os.path.join(root, f))\n")
    (d / "frenzy-results" / "old-job").mkdir(parents=True)
    (d / "frenzy-results" / "old-job" / "model.bin").write_bytes(b"x" * 4096)
    (d / "data.txt").write_text("keep me\n")
    rc, out, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--", "train.py", cwd=d)
    assert rc == 0, err
    shipped = {line.removeprefix("[rank 0] ") for line in out.splitlines()}
    assert "./data.txt" in shipped
    assert "./train.py" in shipped
    assert not any("frenzy-results" in f for f in shipped)
    rc, _, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--results-dir", "out",
                               "--", "train.py", cwd=d)
    assert rc == 2
    assert "shipped with every job" in err
    rc, _, err = await env.cli("run", "--nproc", "1", "--mem-per-rank", "1GiB", "--results-dir",
                               "frenzy-results/mine", "--", "train.py", cwd=d)
    assert rc == 0, err


async def test_a_detaching_client_is_not_an_error(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    """``run`` followed a job and the user pressed Ctrl-C: the server's next write fails; that is the
    client leaving, logged at debug at most, never an ERROR traceback."""
    import aiohttp

    d = job_dir(env.tmp, "import time\nfor i in range(6000):\n    print('tick', i, flush=True)\n"
                         "    time.sleep(0.01)\n")
    rc, out, err = await env.cli("run", "--detach", "--nproc", "1", "--mem-per-rank", "1GiB", "--",
                                 "train.py", cwd=d)
    assert rc == 0, err
    job_id = out.strip()
    orch = env.pool.nodes["a"].orch
    caplog.set_level(logging.DEBUG)
    conn = aiohttp.UnixConnector(path=str(env.unix.path))
    async with aiohttp.ClientSession(connector=conn) as s:
        resp = await s.get(f"http://frenzyd/v1/jobs/{job_id}/events", params={"follow": "1"})
        async for line in resp.content:
            if b"tick 5" in line:
                break
        resp.close()  # the client goes away mid-stream
    # the server keeps writing the ticks that follow into the closed connection
    seen = 0
    async with asyncio.timeout(60):
        async for ev in orch.store.follow(job_id):
            if ev["type"] == "output" and "tick" in ev["data"]:
                seen += 1
                if seen > 200:
                    break
    await asyncio.sleep(0.5)  # let the abandoned handler notice
    await env.cli("cancel", job_id)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def test_status_shows_why_a_gpu_is_not_offered_and_the_driver() -> None:
    import io

    from frenzy_client.cmd_jobs import render_status

    gpu = {"uuid": "GPU-1", "type": "RTX-3090", "memory_bytes": 24 << 30, "free_bytes": 12 << 30,
           "simulated": False, "leased_to": None, "offered": False, "compute_capability": "8.6",
           "driver_version": "550.54.14", "cuda_driver_version": "12.4",
           "reason": "cannot tell whether the owner uses it (compute processes: NVML answered Not Supported)"}
    idle = {**gpu, "uuid": "GPU-2", "offered": True, "reason": None}
    old = {k: v for k, v in gpu.items() if k not in ("reason", "compute_capability", "driver_version")}
    st = {"node": {"id": "n" * 32, "name": "ws", "role": "peer", "term": 1}, "coordinator": None,
          "peers": [{"id": "n" * 32, "name": "ws", "address": "10.0.0.1:7470", "alive": True,
                     "gpus": [gpu, idle, {**old, "uuid": "GPU-3"}]}], "jobs": []}
    out = io.StringIO()
    render_status(st, out)
    text = out.getvalue()
    assert "(driver 550.54.14, CUDA 12.4)" in text
    assert "GPU-1 cc 8.6" in text
    assert "not offered: cannot tell whether the owner uses it (compute processes" in text
    assert text.count("not offered") == 2  # GPU-3 (a peer without reasons) gets the generic one
    assert "not offered: the owner is using it" in text
