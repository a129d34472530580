"""Retention (issue 16): finished jobs' records and old run leftovers are pruned after
``[jobs] keep_finished_days`` / ``keep_unfetched_days``; a queued or running job never is."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from frenzyd.errors import JobStateError
from frenzyd.jobs.model import JobRecord, JobSpec, new_record
from frenzyd.jobs.store import DAY_S, JobStore, prune_once
from frenzyd.net import auth

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, wait_until  # noqa: E402

SPEC = JobSpec(argv=("t.py",), payload_sha256="ab" * 32, payload_size=1, python_version="3.11.7",
               torch_version="2.13.0", nproc=1, mem_per_rank=1 << 30)
NOW = time.time()


def _job(store: JobStore, job_id: str, state: str, age_days: float, *, results: bool = False,
         fetched: bool = False) -> JobRecord:
    """A job of ``store`` in ``state`` whose last change (and end, when finished) was ``age_days`` ago."""
    t = NOW - age_days * DAY_S
    rec = new_record(job_id, SPEC, "n" * 32, "n0", t)
    store.create(rec, b"payload")
    done = state in ("succeeded", "failed", "cancelled")
    rec = dataclasses.replace(rec, state=state, updated_at=t, finished_at=t if done else None,
                              phase="done" if done else "running" if state == "running" else "waiting")
    store.save(rec)
    if results:
        store.write_results(job_id, b"results")
    if fetched:
        store.mark_fetched(job_id)
    return rec


def _old_run_dir(runs: Path, job_id: str, age_days: float) -> Path:
    d = runs / job_id / "a1" / "work"
    d.mkdir(parents=True)
    (d / "left.txt").write_text("x")
    t = NOW - age_days * DAY_S
    for p in (d / "left.txt", d, d.parent, d.parent.parent):
        os.utime(p, (t, t))
    return runs / job_id


def test_only_finished_jobs_past_their_time_and_stale_run_leftovers_go(tmp_path: Path) -> None:
    store = JobStore(tmp_path)
    runs = tmp_path / "runs"
    _job(store, "old-fetched", "succeeded", 40, results=True, fetched=True)
    _job(store, "old-no-results", "failed", 40)
    _job(store, "old-unfetched", "succeeded", 40, results=True)  # kept: results never fetched (< 90 d)
    _job(store, "ancient-unfetched", "cancelled", 100, results=True)
    _job(store, "young", "succeeded", 2, results=True, fetched=True)
    _job(store, "queued-forever", "queued", 400)
    _job(store, "running-long", "running", 400)
    for job_id in ("old-fetched", "gone-elsewhere", "running-long", "leased-here"):
        _old_run_dir(runs, job_id, 60)
    _old_run_dir(runs, "recent", 1)

    live = {"running-long", "leased-here"}
    jobs, dirs = asyncio.run(prune_once(store, runs, keep_finished_s=30 * DAY_S, keep_unfetched_s=90 * DAY_S,
                                        live=lambda: live, now=NOW))
    assert sorted(jobs) == ["ancient-unfetched", "old-fetched", "old-no-results"]
    assert sorted(d.name for d in dirs) == ["gone-elsewhere", "old-fetched"]
    left = {r.id for r in store.all()}
    assert left == {"old-unfetched", "young", "queued-forever", "running-long"}
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == sorted(left)
    assert sorted(p.name for p in runs.iterdir()) == ["leased-here", "recent", "running-long"]
    with pytest.raises(JobStateError, match="only finished jobs"):
        store.remove("queued-forever")
    # Once its results are fetched, the 40-day-old job goes at the next round; 0 keeps forever.
    store.mark_fetched("old-unfetched")
    assert store.expired(NOW, 0, 0) == []
    assert store.expired(NOW, 30 * DAY_S, 90 * DAY_S) == ["old-unfetched"]
    # A restart reads what is left (and finishes a removal cut short).
    (tmp_path / "jobs" / ".removing-x").mkdir()
    assert {r.id for r in JobStore(tmp_path).all()} == left
    assert not (tmp_path / "jobs" / ".removing-x").exists()


@pytest.mark.timeout(120)
def test_a_daemon_prunes_at_start_and_never_a_live_job(tmp_path: Path) -> None:
    """A real frenzyd started over a data directory with old records: at start it removes the expired
    finished jobs and leftovers, keeps the rest, and the queued job is still listed and cancellable."""
    auth.create_pool(tmp_path / "pool")  # what `pool init` / `pool add-node` do, in this process
    creds = {"n0": auth.add_node(tmp_path / "pool", "n0").out_dir}
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    peer, web = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    conf = NodeConf(name="n0", base=tmp_path / "n0", credentials=creds["n0"], devices=[],
                    listen=f"127.0.0.1:{peer}", web=f"127.0.0.1:{web}", mdns=False,
                    extra_toml="[jobs]\nkeep_finished_days = 10\nkeep_unfetched_days = 20\n")
    conf.data_dir.mkdir(parents=True, mode=0o700)
    store = JobStore(conf.data_dir)
    _job(store, "n0-old-fetched", "succeeded", 11, results=True, fetched=True)
    _job(store, "n0-old-unfetched", "failed", 11, results=True)
    _job(store, "n0-queued", "queued", 30)
    _old_run_dir(conf.data_dir / "runs", "n0-gone", 30)
    _old_run_dir(conf.data_dir / "runs", "n0-queued", 30)
    daemon = Daemon(conf)
    try:
        daemon.start()
        wait_until(lambda: _http(conf.socket, "GET", "/v1/status")[0] == 200, 60, "frenzyd to answer")
        wait_until(lambda: not (conf.data_dir / "jobs" / "n0-old-fetched").exists(), 20, "the pruning")
        assert (conf.data_dir / "jobs" / "n0-old-unfetched").is_dir()
        assert (conf.data_dir / "jobs" / "n0-queued").is_dir()
        assert not (conf.data_dir / "runs" / "n0-gone").exists()
        assert (conf.data_dir / "runs" / "n0-queued").is_dir()
        status, body = _http(conf.socket, "GET", "/v1/jobs")
        assert status == 200
        listed = {j["id"]: j["state"] for j in json.loads(body)["jobs"]}
        assert "n0-queued" in listed
        assert "n0-old-fetched" not in listed
        assert "n0-old-unfetched" in listed
        assert _http(conf.socket, "POST", "/v1/jobs/n0-queued/cancel")[0] == 200
    except BaseException:
        print(daemon.log_tail(60))
        raise
    finally:
        daemon.kill()
        daemon.stop(deadline_s=5)


def _http(sock_path: Path, method: str, path: str) -> tuple[int, str]:
    """One request on the daemon's unix socket, as this process (an admin): (status, body); (0, "")
    while it does not answer.  No client process per request."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(sock_path))
            sock.sendall(f"{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        return 0, ""
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split(b" ")
    return (int(status[1]) if len(status) > 1 and status[1].isdigit() else 0), body.decode(errors="replace")
