#!/usr/bin/env python3
"""Chaos benchmark (issue 13's proof): do jobs keep their promises while peers die, freeze and split?

A 4-daemon pool (``frenzyd --config``) in network namespaces on two bridges joined by one
trunk link (half A = n0, n1; half B = n2, n3), static peers, mutual TLS, shrunken timing
(heartbeat 0.5 s, peer timeout 2 s, ``lease_timeout_s`` 6 s), two simulated GPUs per daemon.
A seeded schedule submits plain-script jobs (1-2 ranks, a few seconds each) through
``frenzy-client run --detach --json`` on every daemon, while faults hit peers that are running
ranks or holding an unfinished record:

* ``kill_rank_host`` / ``kill_coordinator`` / ``kill_submitter``: SIGKILL, restart a few seconds later;
* ``sigstop``: SIGSTOP a rank host for 2 x lease_timeout_s + 1 s, then SIGCONT;
* ``partition``: the trunk between the halves goes down (``ip link set ... down``), then up;
* ``submitter_down``: SIGKILL the submitter of a job that is about to finish on other peers,
  restart it after the job has ended (its exit report and results wait in the rank host's outbox).

Every rank appends ``{job, attempt, rank, host, pid, step, t}`` to a ledger file outside every
data directory (no daemon touches it) once per step; rank 0 writes ``result.json`` under
``$FRENZY_OUTPUT_DIR`` before its last ledger line.  From the ledger and the submitters' answers
(the client API ``frenzy-client`` uses: ``GET /v1/jobs/ID`` and ``/v1/jobs/ID/results``):

* **completed**: jobs ``succeeded`` at their submitter;
* **lost** (target 0): jobs not terminal by the end, failed or cancelled (no job fails on its own);
* **run concurrently twice** (target 0): two attempts of one job alive at overlapping times;
* **rerun after success** (target 0): an attempt that started after an attempt whose every rank
  finished all its steps;
* **results lost** (target 0): a succeeded job whose submitter does not return its ``result.json``;
* **GPU-time lost to restarts**: rank-seconds of attempts that did not finish.

Faults planned vs injected are reported (a fault with no eligible victim within its window is
not injected, and says why).  Prints a table and writes JSON (``--out``).  Needs root and
iproute2 (network namespaces); otherwise it says so and writes ``{"skipped": REASON}``.
``--tiny`` (CI) runs 6 jobs, one SIGKILL and one SIGSTOP.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
for _p in (str(SCRIPTS), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _pool import Daemon, NodeConf, cli, make_pool  # noqa: E402
from benchmeta import provenance, write_results  # noqa: E402

NAMES = ("n0", "n1", "n2", "n3")
HALF_A, HALF_B = ("n0", "n1"), ("n2", "n3")
GPU_TYPE = "A100-80GB"
GPUS_PER_DAEMON = 2
TERMINAL = ("succeeded", "failed", "cancelled")
RUNNING_WINDOW_S = 0.8
"""A rank is running when its last ledger line is younger than this (steps are 0.1-0.2 s)."""

RANK_SCRIPT = '''\
"""A chaos-benchmark rank: one ledger line per step; rank 0 writes result.json before its last line."""
import json, os, sys, time

steps, dt, ledger, hosts_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
ino = str(os.stat("/proc/self/ns/net").st_ino)
try:
    with open(hosts_file) as f:
        host = json.load(f).get(ino, ino)
except (OSError, ValueError):
    host = ino
job, attempt = os.environ["FRENZY_JOB_ID"], int(os.environ["FRENZY_ATTEMPT"])
rank, pid = int(os.environ["RANK"]), os.getpid()


def note(step, **extra):
    line = {"job": job, "attempt": attempt, "rank": rank, "host": host, "pid": pid, "step": step,
            "t": time.time(), **extra}
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\\n").encode())
    finally:
        os.close(fd)


for step in range(steps):
    note(step)
    time.sleep(dt)
if rank == 0:
    out = os.environ.get("FRENZY_OUTPUT_DIR", "output")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"job": job, "attempt": attempt, "steps": steps}, f)
note(steps, done=True)
'''


# ----------------------------------------------------------------------------- ledger analysis (pure)


@dataclass
class Span:
    """What the ledger says about one attempt of one job."""

    job: str
    attempt: int
    start: float
    end: float
    ranks: dict[int, tuple[float, float]] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    pids: set[int] = field(default_factory=set)

    def complete(self, nproc: int) -> bool:
        """Every rank wrote its last (``done``) line."""
        return self.done >= set(range(nproc))

    def rank_seconds(self) -> float:
        return sum(b - a for a, b in self.ranks.values())


def parse_ledger(text: str) -> list[dict[str, Any]]:
    """The ledger's entries; a torn last line (a rank killed mid-write) is skipped."""
    out = []
    for line in text.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and {"job", "attempt", "rank", "t"} <= e.keys():
            out.append(e)
    return out


def attempt_spans(entries: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], Span]:
    """Per (job, attempt): first and last ledger time, per rank too, ranks done, hosts, pids."""
    spans: dict[tuple[str, int], Span] = {}
    for e in entries:
        key = (str(e["job"]), int(e["attempt"]))
        t, rank = float(e["t"]), int(e["rank"])
        s = spans.get(key)
        if s is None:
            s = spans[key] = Span(key[0], key[1], t, t)
        s.start, s.end = min(s.start, t), max(s.end, t)
        a, b = s.ranks.get(rank, (t, t))
        s.ranks[rank] = (min(a, t), max(b, t))
        if e.get("done"):
            s.done.add(rank)
        if e.get("host") is not None:
            s.hosts.add(str(e["host"]))
        if e.get("pid") is not None:
            s.pids.add(int(e["pid"]))
    return spans


def _by_job(spans: Mapping[tuple[str, int], Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans.values():
        out.setdefault(s.job, []).append(s)
    for v in out.values():
        v.sort(key=lambda s: (s.start, s.attempt))
    return out


def concurrent_attempts(spans: Mapping[tuple[str, int], Span]) -> list[tuple[str, int, int, float]]:
    """(job, attempt a, attempt b, overlap seconds) for every two attempts of one job alive at once."""
    out = []
    for job, ss in sorted(_by_job(spans).items()):
        for a, b in itertools.combinations(ss, 2):
            overlap = min(a.end, b.end) - max(a.start, b.start)
            if overlap > 0:
                out.append((job, a.attempt, b.attempt, overlap))
    return out


def reruns_after_success(
    spans: Mapping[tuple[str, int], Span], nproc: Mapping[str, int]
) -> list[tuple[str, int, int]]:
    """(job, successful attempt, later attempt) for every attempt started after one that completed."""
    out = []
    for job, ss in sorted(_by_job(spans).items()):
        n = nproc.get(job)
        if n is None:
            continue
        for ok in (s for s in ss if s.complete(n)):
            out += [(job, ok.attempt, s.attempt) for s in ss if s is not ok and s.start > ok.end]
    return out


@dataclass(frozen=True)
class Outage:
    """A window (ledger wall time) in which ``host`` could not talk to peers: killed or stopped
    (``side`` None), or cut off from the other half of the pool (``side`` = its half)."""

    host: str
    start: float
    end: float
    side: str | None = None


def unreportable(
    rerun: tuple[str, int, int], spans: Mapping[tuple[str, int], Span], submitter_side: str | None,
    outages: Sequence[Outage],
) -> bool:
    """Whether a rank host of the successful attempt was silent (killed, frozen, or cut off from the
    job's submitter) from that attempt's end until the rerun started: then no exit report could
    reach the pool before the coordinator's silent-peer timeout re-placed the job.  A host that was
    back before the rerun started could have told the pool: that rerun is a broken promise."""
    job, ok_a, later_a = rerun
    ok, later = spans[(job, ok_a)], spans[(job, later_a)]
    for o in outages:
        if o.host not in ok.hosts or o.start > ok.end or o.end < later.start:
            continue
        if o.side is None or submitter_side is None or o.side != submitter_side:
            return True
    return False


def lost_rank_seconds(spans: Mapping[tuple[str, int], Span], nproc: Mapping[str, int]) -> float:
    """Rank-seconds (ledger time) of attempts that did not finish: the work restarts threw away."""
    return sum(s.rank_seconds() for s in spans.values() if not s.complete(nproc.get(s.job, 1 << 30)))


# ----------------------------------------------------------------------------- schedule (pure)


@dataclass
class JobPlan:
    index: int
    t: float
    nproc: int
    steps: int
    dt: float
    submitter: str

    @property
    def duration_s(self) -> float:
        return self.steps * self.dt


@dataclass
class Fault:
    """One planned fault and what became of it (times in seconds from the schedule's start)."""

    kind: str
    planned_t: float
    injected: bool = False
    t_inject: float | None = None
    t_restore: float | None = None
    t_back: float | None = None  # a restarted or continued daemon answers its client API again
    victim: str | None = None
    why: str = ""
    note: str = ""


FULL_FAULTS = (
    "kill_rank_host", "kill_coordinator", "sigstop", "partition", "submitter_down", "kill_submitter",
)
TINY_FAULTS = ("kill_rank_host", "sigstop")


def make_schedule(
    seed: int, n_jobs: int, span_s: float, kinds: Sequence[str], min_s: float, max_s: float
) -> tuple[list[JobPlan], list[Fault]]:
    """Jobs at seeded times over ``span_s`` (1-2 ranks, ``min_s``-``max_s`` long); faults spread over it."""
    rng = random.Random(seed)
    times = [(i + rng.uniform(0.0, 1.0)) * span_s / n_jobs for i in range(n_jobs)]
    jobs = []
    for i, t in enumerate(times):
        dt = rng.choice((0.1, 0.15, 0.2))
        steps = max(5, round(rng.uniform(min_s, max_s) / dt))
        jobs.append(JobPlan(i, round(t, 2), rng.choice((1, 2)), steps, dt, rng.choice(NAMES)))
    order = list(kinds)
    rng.shuffle(order)
    if "submitter_down" in order and order[0] == "submitter_down":  # give the pool work to finish first
        order.append(order.pop(0))
    gap = span_s / (len(order) + 1)
    faults = [Fault(k, round(gap * (i + 1) * rng.uniform(0.85, 1.0), 1)) for i, k in enumerate(order)]
    return jobs, faults


# ----------------------------------------------------------------------------- the pool in namespaces


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(argv), capture_output=True, text=True, check=False, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res


def split_bridge(lab: Any) -> list[str]:
    """Move hosts 2 and 3 to a second bridge joined to the first by one veth pair (the trunk)."""
    br = lab.bridge_ns
    sh("ip", "-n", br, "link", "add", "br1", "type", "bridge", "mcast_snooping", "0")
    sh("ip", "-n", br, "link", "set", "br1", "up")
    for i in (2, 3):
        sh("ip", "-n", br, "link", "set", f"{lab.tag}b{i}"[-15:], "master", "br1")
    sh("ip", "-n", br, "link", "add", "trunk0", "type", "veth", "peer", "name", "trunk1")
    sh("ip", "-n", br, "link", "set", "trunk0", "master", "br0")
    sh("ip", "-n", br, "link", "set", "trunk1", "master", "br1")
    trunk = ["trunk0", "trunk1"]
    set_links(lab, trunk, up=True)
    return trunk


def set_links(lab: Any, links: Sequence[str], up: bool) -> None:
    for link in links:
        sh("ip", "-n", lab.bridge_ns, "link", "set", link, "up" if up else "down")


def kill_namespace_procs(namespaces: Iterable[str]) -> int:
    """SIGKILL whatever still runs in the lab's namespaces (ranks, supervisors of our daemons)."""
    n = 0
    for ns in namespaces:
        res = sh("ip", "netns", "pids", ns, check=False)
        for pid in res.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
                n += 1
    return n


async def _call(sock: Path, what: str, *args: str, limit_s: float = 8.0) -> Any:
    from frenzy_client.daemon_client import DaemonClient

    async with DaemonClient(f"unix:{sock}") as c:
        return await asyncio.wait_for(getattr(c, what)(*args), limit_s)


def call(sock: Path, what: str, *args: str, timeout: float = 8.0) -> Any:
    """One client-API call (``status``, ``jobs``, ``job``, ``results``) or None when it fails."""
    try:
        return asyncio.run(_call(sock, what, *args, limit_s=timeout))
    except Exception:  # a down, frozen or partitioned daemon is an expected answer here
        return None


def result_from_tar(data: bytes | None) -> dict[str, Any] | None:
    """``result.json`` from rank 0's result archive, or None."""
    if not data:
        return None
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            for m in tf.getmembers():
                if m.isfile() and Path(m.name).name == "result.json":
                    f = tf.extractfile(m)
                    return dict(json.loads(f.read())) if f else None
    except (tarfile.TarError, ValueError, OSError):
        return None
    return None


class Chaos:
    """Runs the schedule against the pool and keeps what happened."""

    def __init__(self, args: argparse.Namespace, base: Path, lab: Any, daemons: dict[str, Daemon],
                 trunk: list[str], jobs: list[JobPlan], faults: list[Fault]) -> None:
        self.args, self.base, self.lab, self.daemons, self.trunk = args, base, lab, daemons, trunk
        self.plan, self.faults = jobs, faults
        self.ledger = base / "ledger.ndjson"
        self.jobdir = base / "job"
        self.hosts_file = base / "hosts.json"
        self.down: dict[str, str] = {}  # name -> "killed" | "stopped"
        self.t0, self.wall0 = time.monotonic(), time.time()
        self.returning: dict[str, Fault] = {}  # restarted daemons not answering yet
        self.submitted: dict[int, dict[str, Any]] = {}  # plan index -> {id, submitter, t}
        self.pending: dict[int, tuple[Future[str], str]] = {}
        self.submit_tries: dict[int, int] = {}
        self.states: dict[str, dict[str, Any]] = {}
        self.entries: list[dict[str, Any]] = []
        self._ledger_off = 0
        self.unexpected_exits: list[dict[str, Any]] = []
        self.pool = ThreadPoolExecutor(2)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def log(self, msg: str) -> None:
        print(f"[{self.now():7.1f}s] {msg}", file=sys.stderr, flush=True)

    # --- observation
    def read_ledger(self) -> None:
        with contextlib.suppress(FileNotFoundError), self.ledger.open("rb") as f:
            f.seek(self._ledger_off)
            chunk = f.read()
            cut = chunk.rfind(b"\n") + 1
            self._ledger_off += cut
            self.entries += parse_ledger(chunk[:cut].decode(errors="replace"))

    def running(self) -> dict[str, dict[str, Any]]:
        """job id -> {attempt, hosts, step, steps_left_s} for attempts with a rank writing right now."""
        wall = time.time()
        last: dict[tuple[str, int, int], dict[str, Any]] = {}
        for e in self.entries[-4000:]:
            last[(e["job"], e["attempt"], e["rank"])] = e
        out: dict[str, dict[str, Any]] = {}
        for (job, attempt, _), e in last.items():
            if e.get("done") or wall - e["t"] > RUNNING_WINDOW_S:
                continue
            r = out.setdefault(job, {"attempt": attempt, "hosts": set(), "step": e["step"]})
            r["hosts"].add(e["host"])
            r["step"] = min(r["step"], e["step"])
        return out

    def job_plan(self, job_id: str) -> JobPlan | None:
        for i, s in self.submitted.items():
            if s["id"] == job_id:
                return self.plan[i]
        return None

    def submitter_of(self, job_id: str) -> str | None:
        return next((s["submitter"] for s in self.submitted.values() if s["id"] == job_id), None)

    def unfinished_holders(self) -> set[str]:
        return {s["submitter"] for s in self.submitted.values()
                if self.states.get(s["id"], {}).get("state") not in TERMINAL}

    def coordinator(self) -> str | None:
        for name in NAMES:
            if name in self.down:
                continue
            st = call(self.daemons[name].conf.socket, "status", timeout=4)
            if st and st.get("coordinator"):
                return str(st["coordinator"]["name"])
        return None

    def poll_states(self) -> None:
        for name in NAMES:
            if name in self.down:
                continue
            mine = {s["id"] for s in self.submitted.values() if s["submitter"] == name}
            if not mine:
                continue
            jobs = call(self.daemons[name].conf.socket, "jobs", timeout=5)
            for j in jobs or ():
                if j.get("id") in mine:
                    self.states[j["id"]] = j

    def check_daemons(self) -> None:
        """A daemon that exited while nobody killed it is a finding: note it and start it again."""
        for name, d in self.daemons.items():
            if name in self.down or d.proc is None or d.proc.poll() is None:
                continue
            code = d.proc.returncode
            self.unexpected_exits.append({"daemon": name, "t": round(self.now(), 1), "code": code,
                                          "log_tail": d.log_tail(15)})
            self.log(f"!! {name} exited on its own (code {code}); restarting it")
            d.stop()
            d.start()

    # --- submission
    def submit_due(self) -> None:
        for idx, (fut, name) in list(self.pending.items()):
            if not fut.done():
                continue
            del self.pending[idx]
            try:
                job_id = fut.result()
                self.submitted[idx] = {"id": job_id, "submitter": name, "t": round(self.now(), 2)}
                self.log(f"submitted job {idx} = {job_id} on {name} ({self.plan[idx].nproc} ranks, "
                         f"{self.plan[idx].duration_s:.1f} s)")
            except Exception as exc:  # retried below
                self.submit_tries[idx] = self.submit_tries.get(idx, 0) + 1
                self.log(f"submission of job {idx} on {name} failed ({str(exc).strip()[-200:]}); retrying")
        for job in self.plan:
            if job.index in self.submitted or job.index in self.pending or self.now() < job.t:
                continue
            if self.submit_tries.get(job.index, 0) >= 20:
                continue
            order = [job.submitter, *(n for n in NAMES if n != job.submitter)]
            name = next((n for n in order if n not in self.down), None)
            if name is None:
                continue
            self.pending[job.index] = (self.pool.submit(self._submit, job, name), name)

    def _submit(self, job: JobPlan, name: str) -> str:
        out = cli("run", "--daemon", self.daemons[name].address, "--detach", "--json", "--nproc",
                  str(job.nproc), "--mem-per-rank", "1GiB", "--", str(self.jobdir / "chaos_rank.py"),
                  str(job.steps), str(job.dt), str(self.ledger), str(self.hosts_file), timeout=60)
        data = json.loads(out)  # {"job": ID, "id": ID, ...} (older clients: the summary, or {"job": summary})
        if isinstance(data.get("id"), str):
            return str(data["id"])
        job = data.get("job")
        return str(job["id"] if isinstance(job, dict) else job)

    # --- faults
    def find_victim(self, f: Fault, waited: float) -> tuple[str, str] | None:
        run = self.running()
        up = [n for n in NAMES if n not in self.down]
        rank_hosts = {h for r in run.values() for h in r["hosts"]} & set(up)
        rng = random.Random(f"{self.args.seed}-{f.kind}-{int(waited * 3)}")
        if f.kind in ("kill_rank_host", "sigstop"):
            cands = sorted(rank_hosts)
            if f.kind == "kill_rank_host" and "kill_coordinator" in (x.kind for x in self.faults):
                coord = self.coordinator()
                cands = [c for c in cands if c != coord] or cands
            if cands:
                v = rng.choice(cands)
                jobs = sorted(j for j, r in run.items() if v in r["hosts"])
                return v, f"running ranks of {', '.join(jobs)}"
        elif f.kind == "kill_coordinator":
            coord = self.coordinator()
            if coord and coord not in self.down:
                if coord in rank_hosts:
                    return coord, "coordinator, running ranks of " + ", ".join(
                        sorted(j for j, r in run.items() if coord in r["hosts"]))
                if coord in self.unfinished_holders():
                    return coord, "coordinator, holding an unfinished record"
        elif f.kind == "kill_submitter":
            coord = self.coordinator()
            cands = sorted((self.unfinished_holders() & set(up)) - {coord})
            if cands:
                v = rng.choice(cands)
                held = sorted(s["id"] for s in self.submitted.values() if s["submitter"] == v
                              and self.states.get(s["id"], {}).get("state") not in TERMINAL)
                return v, f"holding unfinished records {', '.join(held)}"
        elif f.kind == "submitter_down":
            for job_id, r in sorted(run.items()):
                p, sub = self.job_plan(job_id), self.submitter_of(job_id)
                if p is None or sub is None or sub in self.down or sub in r["hosts"]:
                    continue
                left = (p.steps - 1 - r["step"]) * p.dt
                if 0.6 <= left <= 3.5:
                    on = "+".join(sorted(r["hosts"]))
                    return sub, f"submitter of {job_id} (attempt {r['attempt']} on {on}, ~{left:.1f} s left)"
        elif f.kind == "partition":
            for job_id, r in sorted(run.items()):
                sub = self.submitter_of(job_id)
                sides = {("A" if h in HALF_A else "B") for h in r["hosts"] | {sub}}
                if len(sides) == 2 or (waited > 15 and run):
                    return "A|B", f"{job_id} running on {'+'.join(sorted(r['hosts']))}, submitted on {sub}"
        return None

    def inject(self, f: Fault) -> float:
        """Inject ``f`` (victim chosen); return how long until it is undone."""
        lease = self.args.lease_timeout_s
        v = f.victim
        if f.kind == "partition":
            set_links(self.lab, self.trunk, up=False)
            return lease + 2.0 + 4.0
        assert v is not None
        d = self.daemons[v]
        if f.kind == "sigstop":
            d.kill(signal.SIGSTOP)
            self.down[v] = "stopped"
            return 2 * lease + 1.0
        d.kill(signal.SIGKILL)
        if d.proc is not None:
            d.proc.wait(10)
        self.down[v] = "killed"
        if f.kind == "submitter_down":
            return max(15.0, 2 * lease + 3.0)
        return random.Random(f"{self.args.seed}-{f.kind}").uniform(2.0, 5.0)

    def restore(self, f: Fault) -> None:
        if f.kind == "partition":
            set_links(self.lab, self.trunk, up=True)
            return
        assert f.victim is not None
        d = self.daemons[f.victim]
        if f.kind == "sigstop":
            d.kill(signal.SIGCONT)
        else:
            d.stop()
            d.start()
        self.down.pop(f.victim, None)
        self.returning[f.victim] = f

    def check_returning(self) -> None:
        for name, f in list(self.returning.items()):
            if call(self.daemons[name].conf.socket, "status", timeout=2) is not None:
                f.t_back = round(self.now(), 2)
                del self.returning[name]

    # --- the run
    def run(self) -> None:
        give_up_s = 25.0 if self.args.tiny else 45.0
        gap_s = 4.0
        todo = list(self.faults)
        cur: Fault | None = None
        t_try = restore_at = 0.0
        last_restore = -1e9
        last_poll = 0.0
        while True:
            now = self.now()
            self.read_ledger()
            self.check_daemons()
            self.submit_due()
            if cur is None and todo and now >= todo[0].planned_t and now >= last_restore + gap_s:
                cur, t_try = todo.pop(0), now
            if cur is not None and not cur.injected:
                found = self.find_victim(cur, now - t_try)
                if found is not None:
                    cur.victim, cur.why = found
                    hold = self.inject(cur)
                    cur.injected, cur.t_inject, restore_at = True, round(self.now(), 2), self.now() + hold
                    self.log(f"FAULT {cur.kind} -> {cur.victim} ({cur.why}); undone in {hold:.1f} s")
                elif now - t_try > give_up_s:
                    cur.note = f"no eligible victim within {give_up_s:.0f} s"
                    self.log(f"fault {cur.kind} not injected: {cur.note}")
                    cur, last_restore = None, now
            elif cur is not None and now >= restore_at:
                self.restore(cur)
                cur.t_restore = round(self.now(), 2)
                self.log(f"undone: {cur.kind} on {cur.victim}")
                cur, last_restore = None, self.now()
            if now - last_poll > 2.0:
                self.poll_states()
                last_poll = self.now()
            if self.returning:
                self.check_returning()
            all_in = len(self.submitted) == len(self.plan) or all(
                self.submit_tries.get(j.index, 0) >= 20 for j in self.plan if j.index not in self.submitted)
            if cur is None and not todo and all_in and not self.pending:
                break
            time.sleep(0.2)
        self.log("schedule done; draining")
        deadline = self.now() + (90.0 if self.args.tiny else 240.0)
        while self.now() < deadline:
            self.read_ledger()
            self.check_daemons()
            self.check_returning()
            self.poll_states()
            if all(self.states.get(s["id"], {}).get("state") in TERMINAL for s in self.submitted.values()):
                break
            time.sleep(1.0)
        time.sleep(self.args.settle_s)  # anything that would run again after the end shows here
        self.read_ledger()
        self.pool.shutdown(wait=True)

    def report(self) -> dict[str, Any]:
        final: dict[str, dict[str, Any]] = {}
        for idx, s in sorted(self.submitted.items()):
            sock = self.daemons[s["submitter"]].conf.socket
            got = call(sock, "job", s["id"], timeout=10)
            job = dict(got["job"]) if got else dict(self.states.get(s["id"], {}))
            res = None
            if job.get("state") == "succeeded":
                res = result_from_tar(call(sock, "results", s["id"], timeout=30))
            final[s["id"]] = {"index": idx, "submitter": s["submitter"], "nproc": self.plan[idx].nproc,
                              "planned_s": round(self.plan[idx].duration_s, 2), "state": job.get("state"),
                              "attempts": job.get("attempt"), "message": job.get("message", ""),
                              "result": res}
        spans = attempt_spans(self.entries)
        nproc = {j: f["nproc"] for j, f in final.items()}
        conc = concurrent_attempts(spans)
        reruns = reruns_after_success(spans, nproc)
        outages = self.outages()
        silent = [r for r in reruns if unreportable(r, spans, half(final[r[0]]["submitter"]), outages)]
        reruns = [r for r in reruns if r not in silent]
        succeeded = [j for j, f in final.items() if f["state"] == "succeeded"]
        lost = {j: f"{f['state']}: {f['message']}" for j, f in final.items() if f["state"] != "succeeded"}
        lost.update({f"plan#{j.index}": "never submitted" for j in self.plan
                     if j.index not in self.submitted})
        results_lost = [j for j in succeeded if (final[j]["result"] or {}).get("job") != j]
        for j, f in final.items():
            f["ledger_attempts"] = sorted(a for (jj, a) in spans if jj == j)
        total_rs = sum(s.rank_seconds() for s in spans.values())
        lost_rs = lost_rank_seconds(spans, nproc)
        injected = [f for f in self.faults if f.injected]
        return {
            "jobs_planned": len(self.plan),
            "jobs_submitted": len(self.submitted),
            "jobs_completed": len(succeeded),
            "jobs_lost": len(lost),
            "lost": lost,
            "run_concurrently_twice": len({c[0] for c in conc}),
            "concurrent": [list(c) for c in conc],
            "rerun_after_success": len({r[0] for r in reruns}),
            "reruns": [list(r) for r in reruns],
            "rerun_after_unreportable_success": len({r[0] for r in silent}),
            "silent_reruns": [list(r) for r in silent],
            "results_lost": len(results_lost),
            "results_lost_jobs": results_lost,
            "attempts_started": len(spans),
            "restarted_jobs": sum(1 for f in final.values() if len(f["ledger_attempts"]) > 1),
            "gpu_time_lost_rank_s": round(lost_rs, 2),
            "gpu_time_total_rank_s": round(total_rs, 2),
            "faults_planned": len(self.faults),
            "faults_injected": len(injected),
            "sigkills": sum(1 for f in injected if f.kind.startswith("kill_") or f.kind == "submitter_down"),
            "faults": [asdict(f) for f in self.faults],
            "unexpected_daemon_exits": self.unexpected_exits,
            "jobs": final,
            "attempts": [
                {"job": sp.job, "attempt": sp.attempt, "start_s": round(sp.start - self.wall0, 2),
                 "end_s": round(sp.end - self.wall0, 2), "hosts": sorted(sp.hosts), "ranks": sorted(sp.ranks),
                 "complete": sp.complete(nproc.get(sp.job, 1 << 30))}
                for sp in sorted(spans.values(), key=lambda sp: sp.start)
            ],
        }

    def outages(self) -> list[Outage]:
        """When each fault kept a host from reporting (ledger wall time)."""
        out = []
        end_of_run = self.now()
        for f in self.faults:
            if not f.injected or f.t_inject is None:
                continue
            start = self.wall0 + f.t_inject
            end = self.wall0 + (f.t_back or f.t_restore or end_of_run)
            if f.kind == "partition":
                out += [Outage(h, start, end, half(h)) for h in NAMES]
            elif f.victim is not None:
                out.append(Outage(f.victim, start, end))
        return out


def keep(dest: Path, base: Path, daemons: Mapping[str, Daemon]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if (base / "ledger.ndjson").exists():
        shutil.copy(base / "ledger.ndjson", dest / "ledger.ndjson")
    for name, d in daemons.items():
        if d.log_path.exists():
            shutil.copy(d.log_path, dest / f"{name}.log")


def half(name: str | None) -> str | None:
    return None if name is None else "A" if name in HALF_A else "B"


def build(base: Path, lab: Any, lease_timeout_s: float) -> dict[str, Daemon]:
    creds = make_pool(base / "pool", NAMES)
    daemons = {}
    for i, name in enumerate(NAMES):
        conf = NodeConf(
            name=name, base=base / name, credentials=creds[name], devices=[(GPU_TYPE, GPUS_PER_DAEMON)],
            listen="0.0.0.0:7470", web="127.0.0.1:7480", interfaces=["eth0"], mdns=False,
            peers=[f"{h.address}:7470" for j, h in enumerate(lab.hosts) if j != i],
            priority=10 if i == 0 else 0, heartbeat_s=0.5, peer_timeout_s=2.0,
            lease_timeout_s=lease_timeout_s,
        )
        daemons[name] = Daemon(conf, spawn=lambda argv, i=i, **kw: lab.popen(i, argv, **kw))
    return daemons


def meshed(daemons: Mapping[str, Daemon]) -> bool:
    sts = [call(d.conf.socket, "status", timeout=4) for d in daemons.values()]
    if any(s is None for s in sts):
        return False
    ids = {s["node"]["id"] for s in sts}
    coords = {(s.get("coordinator") or {}).get("id") for s in sts}
    alive = all({p["id"] for p in s["peers"] if p.get("alive")} >= ids for s in sts)
    return alive and len(coords) == 1 and None not in coords


def wait_meshed(daemons: Mapping[str, Daemon], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not meshed(daemons):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the daemons did not mesh within {limit_s:.0f} s")
        time.sleep(0.5)


def table(rows: Sequence[tuple[str, str]]) -> str:
    w = max(len(k) for k, _ in rows)
    lines = [f"| {'measure':<{w}} | value |", f"| {'-' * w} | --- |"]
    lines += [f"| {k:<{w}} | {v} |" for k, v in rows]
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    r, c = doc["results"], doc["config"]
    faults = ", ".join(f"{f['kind']}->{f['victim']}" if f["injected"]
                       else f"{f['kind']}: NOT injected ({f['note']})" for f in r["faults"])
    rows = [
        ("jobs (1-2 ranks; 4 daemons x 2 GPUs)",
         f"{r['jobs_planned']} planned, {r['jobs_submitted']} submitted"),
        ("jobs completed", f"{r['jobs_completed']}"),
        ("jobs lost (target 0)", f"{r['jobs_lost']}"),
        ("run concurrently twice (target 0)", f"{r['run_concurrently_twice']}"),
        ("rerun after success (target 0)", f"{r['rerun_after_success']}"),
        ("rerun after a success its host could not report yet",
         f"{r['rerun_after_unreportable_success']}"),
        ("results lost (target 0)", f"{r['results_lost']}"),
        ("attempts started / jobs restarted", f"{r['attempts_started']} / {r['restarted_jobs']}"),
        ("GPU-time lost to restarts (rank-s)",
         f"{r['gpu_time_lost_rank_s']:.1f} of {r['gpu_time_total_rank_s']:.1f}"),
        ("faults planned / injected",
         f"{r['faults_planned']} / {r['faults_injected']} ({r['sigkills']} SIGKILLs)"),
        ("faults", faults),
        ("daemons that exited on their own", f"{len(r['unexpected_daemon_exits'])}"),
        (f"wall time (s; seed {c['seed']}, lease_timeout_s {c['lease_timeout_s']})", f"{r['wall_s']:.0f}"),
    ]
    return table(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CI size: 6 jobs, one SIGKILL and one SIGSTOP")
    ap.add_argument("--jobs", type=int, default=None, help="jobs in the schedule (6 tiny, 32 full)")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--lease-timeout-s", type=float, default=6.0)
    ap.add_argument("--settle-s", type=float, default=None,
                    help="wait after every job ended before the last ledger read (3 tiny, 8 full)")
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="copy the ledger and every daemon's log here (evidence for a finding)")
    args = ap.parse_args()
    prov = provenance()
    n_jobs = args.jobs if args.jobs is not None else (6 if args.tiny else 32)
    if n_jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.settle_s is None:
        args.settle_s = 3.0 if args.tiny else 8.0
    kinds = TINY_FAULTS if args.tiny else FULL_FAULTS
    span_s = 35.0 if args.tiny else 130.0
    jobs, faults = make_schedule(args.seed, n_jobs, span_s, kinds, 3.0, 7.0 if args.tiny else 10.0)
    config = {"tiny": args.tiny, "seed": args.seed, "jobs": n_jobs, "daemons": len(NAMES),
              "gpus_per_daemon": GPUS_PER_DAEMON, "heartbeat_s": 0.5, "peer_timeout_s": 2.0,
              "lease_timeout_s": args.lease_timeout_s, "schedule_span_s": span_s,
              "fault_kinds": list(kinds)}

    from tests.netns import NetnsLab, skip_reason

    why = skip_reason()
    if why is not None:
        print(f"bench_chaos: skipped: {why} (run it as root with iproute2, as CI does)")
        if args.out:
            write_results(args.out, {"skipped": why, "config": config}, prov)
        return 0

    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="frenzy-chaos-") as tmp, contextlib.ExitStack() as stack:
        base = Path(tmp)
        lab = stack.enter_context(NetnsLab(len(NAMES)))
        namespaces = [h.ns for h in lab.hosts] + [lab.bridge_ns]
        stack.callback(kill_namespace_procs, namespaces)  # runs before the lab deletes its namespaces
        trunk = split_bridge(lab)
        (base / "hosts.json").write_text(json.dumps(
            {str(os.stat(f"/run/netns/{h.ns}").st_ino): NAMES[i] for i, h in enumerate(lab.hosts)}))
        (base / "job").mkdir()
        (base / "job" / "chaos_rank.py").write_text(RANK_SCRIPT)
        daemons = build(base, lab, args.lease_timeout_s)

        def stop_all() -> None:
            for d in daemons.values():
                d.kill(signal.SIGCONT)
            for d in daemons.values():
                d.stop(deadline_s=10)

        if args.keep is not None:
            stack.callback(keep, args.keep, base, daemons)  # runs after stop_all (LIFO): whole logs
        stack.callback(stop_all)
        try:
            for d in daemons.values():
                d.start()
            wait_meshed(daemons, 180.0)
            t_mesh = time.monotonic() - t_start
            print(f"bench_chaos: pool meshed in {t_mesh:.1f} s; running the schedule", file=sys.stderr)
            chaos = Chaos(args, base, lab, daemons, trunk, jobs, faults)
            chaos.run()
            results = chaos.report()
        except BaseException:
            for d in daemons.values():
                print(f"===== {d.conf.name} =====\n{d.log_tail(40)}", file=sys.stderr)
            raise
        results["setup_s"] = round(t_mesh, 1)
        results["wall_s"] = round(time.monotonic() - t_start, 1)
    doc = {"config": config, "schedule": [asdict(j) for j in jobs], "results": results}
    print(render(doc))
    if args.out:
        write_results(args.out, doc, prov)
        print(f"wrote {args.out}")

    return 0


if __name__ == "__main__":
    sys.exit(main())
