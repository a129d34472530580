#!/usr/bin/env python3
"""Benchmark a local frenzyd pool on loopback: mesh time, failover time, launch latency, status req/s.

Starts N real daemons (``frenzyd --config``; static peers on 127.0.0.1, simulated GPUs
of different types) and measures, each from the outside through public interfaces:

* **start to full mesh**: from spawning the daemons until every daemon's
  ``/api/v1/status`` lists every daemon alive and all name one coordinator (also
  reported from the first answer, which removes interpreter start-up);
* **coordinator failover**: SIGKILL the coordinator's daemon, time until every
  survivor names one new coordinator (compare with ``peer_timeout_s``);
* **submit to all ranks running**: wall time from invoking ``frenzy-client run
  --detach`` until the last rank's first line of Python runs (each rank prints
  ``time.time()`` before importing anything); the client's own start-up
  (``frenzy-client status``) is measured beside it;
* **status endpoint requests/s**: a bounded request loop of ``GET /api/v1/status``
  (and ``/metrics``, ``/``) on 127.0.0.1 with C concurrent connections.

Prints a table and writes JSON (command line, git commit, machine, results).
``--tiny`` is what CI runs (< 2 min).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _pool import Daemon, NodeConf, make_pool
from benchmeta import provenance, write_results

TYPES = ["A100-80GB", "RTX-3090", "RTX-A6000", "T4", "L4", "V100-32GB", "A10", "RTX-4090"]

RANK_SCRIPT = """\
import time; T0 = time.time()
import os, sys
print(f"RANK_STARTED {os.environ['RANK']} {T0:.6f}", flush=True)
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print(f"RANK_JOINED {dist.get_rank()} {time.time():.6f}", flush=True)
dist.destroy_process_group()
"""


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


async def fetch_status(session: aiohttp.ClientSession, port: int) -> dict[str, Any] | None:
    try:
        async with session.get(f"http://127.0.0.1:{port}/api/v1/status",
                               timeout=aiohttp.ClientTimeout(total=2)) as r:
            if r.status != 200:
                return None
            return dict(await r.json())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def coordinator(st: dict[str, Any] | None) -> str | None:
    return ((st or {}).get("coordinator") or {}).get("id")


def meshed(sts: list[dict[str, Any] | None]) -> bool:
    if any(s is None for s in sts):
        return False
    ids = {s["node"]["id"] for s in sts if s}
    coords = {coordinator(s) for s in sts}
    alive_ok = all({p["id"] for p in s["peers"] if p.get("alive")} >= ids for s in sts if s)
    return alive_ok and len(coords) == 1 and None not in coords


async def poll(ports: list[int], cond: Any, limit_s: float, what: str) -> list[dict[str, Any] | None]:
    """Poll the web status of ``ports`` every 50 ms until ``cond(statuses)``; return them."""
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession() as session:
        while True:
            sts = list(await asyncio.gather(*(fetch_status(session, p) for p in ports)))
            if cond(sts):
                return sts
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not reached within {limit_s:.0f}s")
            await asyncio.sleep(0.05)


async def request_loop(url: str, total: int, concurrency: int) -> dict[str, float]:
    lat: list[float] = []
    errors = 0
    counter = iter(range(total))
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            nonlocal errors
            for _ in counter:
                t = time.perf_counter()
                try:
                    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                        await r.read()
                        if r.status != 200:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    return {"requests": total, "errors": errors, "wall_s": wall, "req_per_s": total / wall,
            "p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * p99}


def build_pool(base: Path, n: int, heartbeat_s: float, peer_timeout_s: float) -> list[Daemon]:
    names = [f"b{i}" for i in range(n)]
    creds = make_pool(base / "pool", names)
    peer_ports, web_ports = free_ports(n), free_ports(n)
    daemons = []
    for i, name in enumerate(names):
        conf = NodeConf(
            name=name, base=base / name, credentials=creds[name], devices=[(TYPES[i % len(TYPES)], 2)],
            listen=f"127.0.0.1:{peer_ports[i]}", web=f"127.0.0.1:{web_ports[i]}",
            peers=[f"127.0.0.1:{p}" for j, p in enumerate(peer_ports) if j != i], interfaces=["lo"],
            mdns=False, heartbeat_s=heartbeat_s, peer_timeout_s=peer_timeout_s,
            rendezvous_ports=(29400 + 20 * i, 29419 + 20 * i),
        )
        daemons.append(Daemon(conf))
    return daemons


def web_port(d: Daemon) -> int:
    return int(d.conf.web.rsplit(":", 1)[1])


def submit_latency(d: Daemon, jobdir: Path, nproc: int, limit_s: float) -> dict[str, float]:
    t_submit = time.time()
    out = d.client("run", "--detach", "--json", "--nproc", str(nproc), "--mem-per-rank", "1GiB",
                   "--", str(jobdir / "ranks.py"))
    t_answer = time.time()
    job = json.loads(out)
    job_id = str(job["job"])  # DESIGN §6: --detach prints {"job": ID}
    deadline = time.monotonic() + limit_s
    starts: dict[int, float] = {}
    joined: dict[int, float] = {}
    while True:
        log = d.client("logs", job_id, check=False)
        starts = {int(r): float(t) for r, t in re.findall(r"RANK_STARTED (\d+) ([0-9.]+)", log)}
        joined = {int(r): float(t) for r, t in re.findall(r"RANK_JOINED (\d+) ([0-9.]+)", log)}
        if len(joined) == nproc:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id}: ranks did not all start within {limit_s:.0f}s:\n{log}")
        time.sleep(0.2)
    return {
        "submit_answer_s": t_answer - t_submit,
        "submit_to_all_ranks_running_s": max(starts.values()) - t_submit,
        "submit_to_first_rank_running_s": min(starts.values()) - t_submit,
        "submit_to_process_group_ready_s": max(joined.values()) - t_submit,
    }


def client_startup(d: Daemon, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        d.client("status", "--json")
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CI size: 3 daemons, 1 launch, 300 requests")
    ap.add_argument("--daemons", type=int, default=None, help="pool size (default 3 tiny, 5 full)")
    ap.add_argument(
        "--launches", type=int, default=None, help="jobs timed for launch latency (1 tiny, 5 full)"
    )
    ap.add_argument("--requests", type=int, default=None, help="status requests (300 tiny, 5000 full)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--heartbeat-s", type=float, default=0.5)
    ap.add_argument("--peer-timeout-s", type=float, default=2.0)
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    args = ap.parse_args()
    prov = provenance()
    n = args.daemons or (3 if args.tiny else 5)
    launches = args.launches or (1 if args.tiny else 5)
    requests = args.requests or (300 if args.tiny else 5000)
    if n < 2:
        ap.error("--daemons must be at least 2 (failover needs a survivor)")

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="frenzy-bench-") as tmp:
        base = Path(tmp)
        daemons = build_pool(base, n, args.heartbeat_s, args.peer_timeout_s)
        jobdir = base / "job"
        jobdir.mkdir()
        (jobdir / "ranks.py").write_text(RANK_SCRIPT)
        ports = [web_port(d) for d in daemons]
        try:
            t0 = time.monotonic()
            for d in daemons:
                d.start()
            asyncio.run(poll(ports, lambda s: any(x is not None for x in s), 120, "first daemon answering"))
            t_first = time.monotonic()
            sts = asyncio.run(poll(ports, meshed, 180, "full mesh"))
            t_mesh = time.monotonic()
            results["mesh"] = {"daemons": n, "start_to_full_mesh_s": t_mesh - t0,
                               "first_answer_to_full_mesh_s": t_mesh - t_first}

            # status endpoint throughput on a meshed pool
            results["web"] = {}
            for path in ("/api/v1/status", "/metrics", "/"):
                url = f"http://127.0.0.1:{ports[0]}{path}"
                results["web"][path] = asyncio.run(request_loop(url, requests, args.concurrency))

            # launch latency (submitter: the last daemon, which is not the coordinator unless it has to be)
            results["client_startup_s"] = client_startup(daemons[-1], 3)
            lat = [submit_latency(daemons[-1], jobdir, 2, 180) for _ in range(launches)]
            results["launch"] = {k: statistics.median(x[k] for x in lat) for k in lat[0]}
            results["launch"]["runs"] = lat

            # failover: SIGKILL the coordinator's daemon
            coord = coordinator(sts[0])
            victim = next(i for i, s in enumerate(sts) if s and s["node"]["id"] == coord)
            survivors = [p for i, p in enumerate(ports) if i != victim]
            t_kill = time.monotonic()
            daemons[victim].kill(signal.SIGKILL)

            def new_coord(s: list[dict[str, Any] | None]) -> bool:
                cs = {coordinator(x) for x in s}
                return None not in s and len(cs) == 1 and None not in cs and coord not in cs

            asyncio.run(poll(survivors, new_coord, 120, "new coordinator"))
            results["failover"] = {"failover_s": time.monotonic() - t_kill,
                                   "peer_timeout_s": args.peer_timeout_s, "heartbeat_s": args.heartbeat_s}
        except BaseException:
            for d in daemons:
                print(f"===== {d.conf.name} =====\n{d.log_tail(40)}", file=sys.stderr)
            raise
        finally:
            for d in daemons:
                d.stop(deadline_s=15)

    rows = [
        ("daemons", f"{n}"),
        ("start -> full mesh (s)", f"{results['mesh']['start_to_full_mesh_s']:.2f}"),
        ("first answer -> full mesh (s)", f"{results['mesh']['first_answer_to_full_mesh_s']:.2f}"),
        (f"failover after SIGKILL (s; peer_timeout {args.peer_timeout_s}s)",
         f"{results['failover']['failover_s']:.2f}"),
        ("client start-up, `status --json` (s)", f"{results['client_startup_s']:.2f}"),
        (f"submit -> all ranks running (s, median of {launches})",
         f"{results['launch']['submit_to_all_ranks_running_s']:.2f}"),
        ("submit -> process group ready (s)", f"{results['launch']['submit_to_process_group_ready_s']:.2f}"),
    ]
    for path, r in results["web"].items():
        rows.append((f"GET {path} req/s (c={args.concurrency}; p50/p99 ms)",
                     f"{r['req_per_s']:.0f} ({r['p50_ms']:.1f}/{r['p99_ms']:.1f}; {r['errors']} errors)"))
    width = max(len(k) for k, _ in rows)
    print(f"| {'measure':<{width}} | value |\n| {'-' * width} | --- |")
    for k, v in rows:
        print(f"| {k:<{width}} | {v} |")
    doc = {"config": {"daemons": n, "launches": launches, "requests": requests,
                      "concurrency": args.concurrency, "heartbeat_s": args.heartbeat_s,
                      "peer_timeout_s": args.peer_timeout_s},
           "results": results}
    if args.out:
        write_results(args.out, doc, prov)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
