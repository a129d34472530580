"""Real frenzyd processes on loopback: mesh, a 2-rank gloo job across peers, restart, failover.

Three daemons (``frenzyd --config``) with static peers on 127.0.0.1, mutual TLS, simulated
GPUs of different types, driven only through ``frenzy-client`` (unix sockets).
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, cli, full_mesh, make_pool, wait_until  # noqa: E402

pytestmark = pytest.mark.slow

DDP_TINY = ROOT / "frenzyd" / "examples" / "ddp_tiny.py"
# A 20 GiB rank fits the A100 and the A6000 but not the T4: a 2-rank job from n2 runs on n0 and n1.
DEVICES = [[("A100-80GB", 1)], [("RTX-A6000", 1)], [("T4", 1)]]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run(d: Daemon, *args: str, check: bool = True, timeout: float = 300) -> str:
    """``frenzy-client SUB --daemon ADDR ARGS`` (client options before the script's ``--``)."""
    return cli(args[0], "--daemon", d.address, *args[1:], check=check, timeout=timeout)


def job_state(d: Daemon, job_id: str) -> str | None:
    try:
        jobs = json.loads(run(d, "jobs", "--json", timeout=30))["jobs"]
    except (RuntimeError, ValueError):
        return None
    return next((j["state"] for j in jobs if j["id"] == job_id), None)


def coordinator(st: dict[str, Any] | None) -> str | None:
    return ((st or {}).get("coordinator") or {}).get("id")


@pytest.mark.timeout(600)
def test_loopback_pool_runs_jobs_survives_restart_and_failover(tmp_path: Path) -> None:
    names = ["n0", "n1", "n2"]
    creds = make_pool(tmp_path / "pool", names)
    ports, webs = free_ports(3), free_ports(3)
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    shutil.copy(DDP_TINY, jobdir / "ddp_tiny.py")
    daemons = [
        Daemon(NodeConf(
            name=name, base=tmp_path / name, credentials=creds[name], devices=DEVICES[i],
            listen=f"127.0.0.1:{ports[i]}", web=f"127.0.0.1:{webs[i]}", interfaces=["lo"], mdns=False,
            peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i], priority=10 if i == 0 else 0,
            heartbeat_s=0.5, peer_timeout_s=2.0, rendezvous_ports=(29500 + 20 * i, 29519 + 20 * i),
        ))
        for i, name in enumerate(names)
    ]
    n0, n1, n2 = daemons
    try:
        for d in daemons:
            d.start()
        statuses: dict[str, dict[str, Any]] = {}
        wait_until(lambda: full_mesh(daemons, statuses), 120, "three daemons to mesh")
        ids = {n: statuses[n]["node"]["id"] for n in names}
        assert {coordinator(s) for s in statuses.values()} == {ids["n0"]}

        # --- a 2-rank job submitted on n2 runs on n0 and n1; output and result files come back
        results = tmp_path / "results"
        out = run(n2, "run", "--nproc", "2", "--mem-per-rank", "20GiB", "--results-dir", str(results),
                  "--", str(jobdir / "ddp_tiny.py"), "--steps", "12")
        losses = [float(x) for x in re.findall(r"step \d+ loss ([0-9.]+)", out)]
        assert len(losses) == 12, out
        assert losses[-1] < losses[0]
        assert json.loads((results / "result.json").read_text())["world_size"] == 2
        job_a = json.loads(run(n2, "jobs", "--json"))["jobs"][0]
        assert job_a["state"] == "succeeded"
        for d in daemons:  # every peer shows the coordinator and the job with its placement
            st = wait_until(lambda d=d: (s := d.status()) and any(
                j["id"] == job_a["id"] and j["state"] == "succeeded" for j in s["jobs"]) and s, 30,
                f"{d.conf.name} to show the job")
            assert coordinator(st) == ids["n0"]
            job = next(j for j in st["jobs"] if j["id"] == job_a["id"])
            assert {r["peer"] for r in job["ranks"]} == {ids["n0"], ids["n1"]}

        # --- SIGTERM stops the submitter cleanly; its records and logs survive the restart
        t = time.monotonic()
        assert n2.stop(deadline_s=30) == 0
        assert time.monotonic() - t < 15, n2.log_tail()
        n2.start()
        wait_until(lambda: full_mesh(daemons), 60, "n2 to rejoin")
        assert job_state(n2, job_a["id"]) == "succeeded"
        assert "loss" in run(n2, "logs", job_a["id"])

        # --- failover: B holds n0 and n1, C waits; SIGKILL the coordinator; C still completes
        job_b = json.loads(run(n2, "run", "--detach", "--json", "--nproc", "2", "--mem-per-rank", "20GiB",
                               "--", str(jobdir / "ddp_tiny.py"), "--steps", "400", "--sleep", "0.1"))["id"]
        wait_until(lambda: job_state(n2, job_b) == "running", 120, "job B to run")
        job_c = json.loads(run(n2, "run", "--detach", "--json", "--nproc", "1", "--mem-per-rank", "20GiB",
                               "--", str(jobdir / "ddp_tiny.py"), "--steps", "5"))["id"]
        wait_until(lambda: job_state(n2, job_c) == "queued", 30, "job C to be queued")
        n0.kill(signal.SIGKILL)
        wait_until(lambda: coordinator(n1.status()) not in (None, ids["n0"]), 60, "a new coordinator")
        wait_until(lambda: job_state(n2, job_c) == "succeeded", 240, "queued job C to complete")
        assert "done: loss" in run(n2, "logs", job_c)
        # B lost its rank on n0: requeued, and with only one 20 GiB GPU left it can no longer fit.
        wait_until(lambda: job_state(n2, job_b) in ("failed", "queued"), 60, "job B to leave 'running'")
    except BaseException:
        for d in daemons:
            print(f"===== {d.conf.name} log tail =====\n{d.log_tail(60)}")
        raise
    finally:
        for d in daemons:
            d.stop(deadline_s=15)


@pytest.mark.timeout(300)
def test_one_identity_runs_once_and_a_frozen_rank_host_never_runs_beside_the_new_attempt(
    tmp_path: Path,
) -> None:
    """Issue 13, cases 2 and 8, on real frenzyd processes.

    Case 2: a second frenzyd on a running daemon's data directory refuses to start and says why;
    one started with the same identity elsewhere is refused by the pool, and the job running on
    the first is untouched.  Case 8: the rank host is SIGSTOPped for longer than the lease: its
    ranks' supervisor (a process outside the frozen daemon) kills them, and only then does the
    coordinator place the job again, so no two attempts run at once.
    """
    names = ["n0", "n1", "n2"]
    creds = make_pool(tmp_path / "pool", names)
    ports, webs = free_ports(4), free_ports(4)
    ledger = tmp_path / "ledger.ndjson"
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    (jobdir / "work.py").write_text(
        "import json, os, time\n"
        "for step in range(600):\n"
        f"    with open({str(ledger)!r}, 'a') as f:\n"
        "        a = int(os.environ['FRENZY_ATTEMPT'])\n"
        "        f.write(json.dumps({'attempt': a, 't': time.time()}) + '\\n')\n"
        "    time.sleep(0.05)\n"
    )

    def conf(i: int, name: str, base: str, devices: list[tuple[str, int]]) -> NodeConf:
        return NodeConf(
            name=name, base=tmp_path / base, credentials=creds[name], devices=devices,
            listen=f"127.0.0.1:{ports[i]}", web=f"127.0.0.1:{webs[i]}", interfaces=["lo"], mdns=False,
            peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports[:3]) if j != i], priority=10 if i == 0 else 0,
            heartbeat_s=0.5, peer_timeout_s=2.0, rendezvous_ports=(29600 + 20 * i, 29619 + 20 * i),
            lease_timeout_s=6.0,
        )

    n0 = Daemon(conf(0, "n0", "n0", []))
    n1 = Daemon(conf(1, "n1", "n1", [("A100-80GB", 1)]))
    n2 = Daemon(conf(2, "n2", "n2", [("A100-80GB", 1)]))
    daemons = [n0, n1, n2]
    twin: Daemon | None = None
    try:
        for d in daemons:
            d.start()
        wait_until(lambda: full_mesh(daemons), 120, "three daemons to mesh")
        job = json.loads(run(n0, "run", "--detach", "--json", "--nproc", "1", "--mem-per-rank", "1GiB",
                             "--", str(jobdir / "work.py")))["id"]
        wait_until(lambda: job_state(n0, job) == "running", 60, "the job to run")
        host_st = next(j for j in n0.status()["jobs"] if j["id"] == job)  # type: ignore[index]
        host = n1 if host_st["ranks"][0]["peer"] == n1.status()["node"]["id"] else n2  # type: ignore[index]

        # Case 2: the same data directory, other ports: refused at start, with the reason.
        same_dir = NodeConf(**{**host.conf.__dict__, "listen": f"127.0.0.1:{ports[3]}",
                               "web": f"127.0.0.1:{webs[3]}", "base": tmp_path / "twin-dir"})
        same_dir.base.mkdir()
        cfg = same_dir.write()
        cfg.write_text(cfg.read_text().replace(str(same_dir.data_dir), str(host.conf.data_dir)))
        second = Daemon(same_dir)
        second.proc = subprocess.Popen([sys.executable, "-m", "frenzyd", "--config", str(cfg)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = second.proc.communicate(timeout=60)
        assert second.proc.returncode != 0
        assert b"is in use by another frenzyd" in out, out

        # Case 2: the same identity with its own data directory: the pool refuses it.
        twin = Daemon(NodeConf(**{**host.conf.__dict__, "listen": f"127.0.0.1:{ports[3]}",
                                  "web": f"127.0.0.1:{webs[3]}", "base": tmp_path / "twin"}))
        twin.start()
        time.sleep(8)
        assert job_state(n0, job) == "running"
        assert {json.loads(line)["attempt"] for line in ledger.read_text().splitlines()} == {1}
        twin.stop()
        twin = None

        # Case 8: freeze the rank host's daemon for longer than the lease.
        host.kill(signal.SIGSTOP)
        wait_until(lambda: job_state(n0, job) in ("running", "succeeded") and any(
            json.loads(line)["attempt"] > 1 for line in ledger.read_text().splitlines()), 180,
            "the job to run again elsewhere")
        host.kill(signal.SIGCONT)
        wait_until(lambda: job_state(n0, job) == "succeeded", 180, "the job to finish")
        spans: dict[int, list[float]] = {}
        for line in ledger.read_text().splitlines():
            e = json.loads(line)
            s = spans.setdefault(e["attempt"], [e["t"], e["t"]])
            s[1] = max(s[1], e["t"])
        ordered = sorted(spans.values())
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ordered)), spans
        # The thawed host's report about attempt 1 reaches the submitter, which refuses and counts it.
        metric = 'frenzy_stale_attempts_refused_total{kind="job.exit"}'

        def refused() -> bool:
            with urllib.request.urlopen(f"http://{n0.conf.web}/metrics", timeout=10) as r:
                return any(line.startswith(metric) and float(line.split()[-1]) >= 1
                           for line in r.read().decode().splitlines())

        wait_until(refused, 60, "the stale exit report to be refused and counted")
    finally:
        if twin is not None:
            twin.stop()
        for d in daemons:
            d.kill(signal.SIGCONT)
            d.stop()
