#!/usr/bin/env python3
"""The coordinator's scheduling pass at pool scale: many simulated members in one process (issue 18 (b)).

Each pass runs what ``CoordinatorRole.tick`` runs to place the queue: ``offers_from_reports`` over
every member's heartbeat report (the dict ``Orchestrator.report()`` produces, with the name and
address the heartbeat adds) and ``placement.schedule`` (MARP's plans through the plan cache, HAS's
``frenzy`` policy, the rank layout).  Nothing is mocked below those two calls.

Members: ``--members`` workstations of ``--gpus`` GPUs of one type each, the types drawn from a lab
mix (``GPU_MIX``); each GPU's free memory is its size less a desktop's use (0-1.5 GiB), moved by a
few MiB every pass, and 3 % of GPUs are withheld by owner protection.  Jobs: a seeded catalogue of
``--shapes`` experiment shapes (a MARP preset, seq_len, global batch, recompute, dtype, trainer or
script; a fifth declared ``--nproc``/``--mem-per-rank`` jobs) drawn Zipf-like, and with probability
``--novel`` a shape never seen before.  The pool starts busy (``--busy`` of GPUs leased to running
jobs).  After each pass the jobs it started take their GPUs (leased in their members' reports),
running jobs finish at random (their GPUs free again) and the queue is topped up: jobs leave it
(started, or withdrawn at random) until at least ``--churn`` of it changed, and as many new jobs
arrive.  The first pass runs on an empty plan cache and is reported apart (cold).

Plans off the pass (as ``CoordinatorRole`` runs them): every job that arrives is admitted first,
``placement.warm_plans`` over the last pass's offers (what the coordinator runs in a worker thread when
a job is submitted), timed apart from the pass; the pass runs with ``plan_inline=False`` and leaves a
job whose plans are not cached out (``Schedule.planning``, counted), to be warmed after it, as the
coordinator does.  Reported apart: the admission cost of each job whose shape was new (median, p95,
max), and the cold start: the first queue's admission on an empty plan cache, then the first pass (a
fresh coordinator process: nothing kept from the pool's filling).  In the daemon the admissions run in
a thread beside the event loop and the pass's thread, sharing one GIL: on one core their costs add.
``--inline-plans``: the pass enumerates a new shape's plans itself (the coordinator before this).

``--no-cache`` runs the same passes with the plan cache off (every call enumerates MARP's plans
afresh with ``plans.feasible_plans``; implies ``--inline-plans``): the coordinator before the cache.

Membership (``--part membership``): ``--swim-members`` members, each a real SWIM core
(``frenzyd.net.membership``) and its driver (``frenzyd.net.gossip``) exchanging real wire frames over
the in-memory transport (``frenzyd.net.memnet``: ``--delay-ms`` each way, ``--loss`` of frames lost,
on wall-clock time).  The pool starts formed; after ``--swim-steady-s`` of measured traffic one member
crashes.  Reported: messages and bytes each member sends per second, the harness's CPU per member,
when every other member holds the dead one dead, and false suspicions (any suspicion of a member that
was up).  A row measured while the machine was less than 30 % idle is marked contended.
Not measured here: real daemons in network namespaces (issue 18 (a)).

    python scripts/bench_scale.py --out bench-results/scale.json
    python scripts/bench_scale.py --tiny --out /tmp/scale_tiny.json
    python scripts/bench_scale.py --members 100 --queued 10,100 --no-cache --passes 3
    python scripts/bench_scale.py --part membership --swim-members 100,300,1000
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import inspect
import io
import math
import os
import pstats
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchmeta import provenance, write_results  # noqa: E402

from frenzyd.errors import FrenzyError  # noqa: E402
from frenzyd.gpu_types import GPU_TYPES  # noqa: E402
from frenzyd.jobs import placement  # noqa: E402
from frenzyd.jobs.model import JobSpec  # noqa: E402
from frenzyd.jobs.placement import QueuedJob, offers_from_reports, schedule  # noqa: E402

try:
    from frenzyd.marp import plan_cache
except ImportError:  # a checkout from before the plan cache: only --no-cache can run there
    plan_cache = None  # type: ignore[assignment]

GIB = 1 << 30
MIB = 1 << 20
PY, TORCH = "3.11.7", "2.13.0"

GPU_MIX: tuple[tuple[str, float], ...] = (
    ("RTX-3090", 0.25), ("RTX-4090", 0.20), ("RTX-A6000", 0.15), ("A100-80GB", 0.10),
    ("V100-32GB", 0.10), ("T4", 0.08), ("A10", 0.07), ("L40S", 0.05),
)
"""A lab's workstations: consumer and workstation cards most, a few data-centre cards."""

PRESETS: tuple[tuple[str, float, tuple[int, ...], tuple[int, ...]], ...] = (
    # preset, weight, seq_len choices, global batch choices
    ("gpt2", 0.15, (512, 1024), (16, 32, 64, 128)),
    ("gpt2-medium", 0.15, (512, 1024), (16, 32, 64, 128)),
    ("gpt2-large", 0.10, (1024,), (16, 32, 64)),
    ("gpt2-xl", 0.08, (1024,), (16, 32, 64)),
    ("llama-2-7b", 0.12, (2048, 4096), (32, 64, 128)),
    ("llama-3-8b", 0.12, (2048, 4096), (32, 64, 128)),
    ("mistral-7b", 0.10, (2048, 4096), (32, 64)),
    ("qwen2.5-7b", 0.10, (2048,), (32, 64)),
    ("llama-2-13b", 0.06, (2048,), (32, 64)),
    ("llama-2-70b", 0.02, (2048,), (64, 128)),
)
"""MARP's shipped presets (the tiny test models left out) with shapes their users train."""

DECLARED_SHARE = 0.2
"""Jobs that declare ``--nproc``/``--mem-per-rank`` instead of a model (scripts MARP cannot see into)."""


@dataclass(frozen=True, slots=True)
class Sizes:
    members: tuple[int, ...]
    queued: tuple[int, ...]
    passes: int


FULL = Sizes(members=(100, 300, 1000), queued=(10, 100, 500), passes=20)
TINY = Sizes(members=(20,), queued=(10, 40), passes=5)
SWIM_FULL, SWIM_TINY = (100, 300, 1000), (20,)


# --- the pool: members and their heartbeat reports ----------------------------------------------


def _pick(rng: random.Random, weighted: Sequence[tuple[Any, float]]) -> Any:
    return rng.choices([x for x, _ in weighted], weights=[w for _, w in weighted])[0]


@dataclass
class Member:
    """A simulated workstation: what its ``Orchestrator.report()`` holds, kept as that dict."""

    node_id: str
    report: dict[str, Any]
    used: list[int]
    """Bytes the desktop holds on each GPU (its free memory is ``memory - used``)."""


def make_members(n: int, gpus: int, rng: random.Random) -> list[Member]:
    members = []
    for i in range(n):
        gtype = _pick(rng, GPU_MIX)
        mem = GPU_TYPES[gtype].memory_bytes
        used = [rng.randrange(0, 3 * GIB // 2) for _ in range(gpus)]
        nid = f"{rng.getrandbits(128):032x}"
        report = {
            "python": PY, "torch": TORCH,
            "gpus": [{"uuid": f"GPU-{nid[:8]}-{j}", "index": j, "type": gtype, "memory_bytes": mem,
                      "free_bytes": mem - used[j], "utilization": 0, "simulated": False,
                      "offered": rng.random() >= 0.03, "foreign_processes": 0, "leased_to": None}
                     for j in range(gpus)],
            "leases": [], "outbox": [], "jobs": [],
            "name": f"ws-{i:04d}", "address": f"10.{i // 250}.{i % 250}.1:7470",
        }
        members.append(Member(nid, report, used))
    return members


def jitter(members: Sequence[Member], rng: random.Random) -> None:
    """Desktops' memory use moves by a few MiB between heartbeats."""
    for m in members:
        for j, g in enumerate(m.report["gpus"]):
            m.used[j] = max(0, m.used[j] + rng.randrange(-8 * MIB, 8 * MIB))
            g["free_bytes"] = g["memory_bytes"] - m.used[j] if g["leased_to"] is None else 0


# --- the jobs ------------------------------------------------------------------------------------


def random_shape(rng: random.Random) -> dict[str, Any]:
    """One experiment shape: a JobSpec's keyword arguments less the per-job ones."""
    if rng.random() < DECLARED_SHARE:
        return {"argv": ("train.py",), "nproc": rng.choice((1, 1, 2, 4, 4, 8)),
                "mem_per_rank": rng.choice((6, 10, 14, 20, 30)) * GIB}
    preset, seqs, batches = _pick(rng, [((p, s, b), w) for p, w, s, b in PRESETS])
    trainer = rng.random() < 0.4
    shape: dict[str, Any] = {"model": preset, "seq_len": rng.choice(seqs),
                             "global_batch": rng.choice(batches), "recompute": rng.choice(("none", "full")),
                             "dtype": rng.choice(("bf16-mixed", "bf16-mixed", "bf16"))}
    if trainer:
        shape |= {"argv": (), "trainer": True, "data_name": "data.jsonl"}
    else:
        shape |= {"argv": ("train.py",)}
    return shape


@dataclass
class Jobs:
    """The arrival process: a catalogue of shapes drawn Zipf-like, and now and then a novel one."""

    rng: random.Random
    catalogue: list[dict[str, Any]]
    novel: float
    made: int = 0
    shapes_seen: set[str] = field(default_factory=set)

    def new(self, now_s: float) -> QueuedJob:
        if self.rng.random() < self.novel:
            shape = random_shape(self.rng)
        else:
            weights = [1.0 / (k + 1) for k in range(len(self.catalogue))]
            shape = self.rng.choices(self.catalogue, weights=weights)[0]
        self.shapes_seen.add(repr(sorted(shape.items())))
        self.made += 1
        jid = f"job-{self.made:06d}"
        steps = self.rng.choice((None, 200, 1000, 5000)) if not shape.get("trainer") else 1000
        spec = JobSpec(payload_sha256="0" * 64, payload_size=1 << 20, python_version=PY, torch_version=TORCH,
                       name=jid, steps=steps, **shape)
        return QueuedJob(jid, spec, now_s)


# --- one cell: members x queued, P passes --------------------------------------------------------


def _policy_kwargs() -> dict[str, Any]:
    """One HAS policy object for the whole run, as the coordinator keeps one per term (where
    ``schedule`` takes it)."""
    if "policy" not in inspect.signature(schedule).parameters:
        return {}
    from frenzyd.has.frenzy import FrenzyPolicy

    return {"policy": FrenzyPolicy()}


LIVE_HAS = "running" in inspect.signature(schedule).parameters
"""The coordinator gives HAS its running checkpointable (trainer) jobs (issue 8's live scheduling):
the harness does too, where this checkout's ``schedule`` takes them."""


@dataclass
class Run:
    """A running job: its GPUs, the passes it still runs, and what the coordinator tells HAS of it."""

    uuids: list[str]
    left: int
    spec: JobSpec | None = None
    info: Any = None
    """Its ``RunningInfo`` when HAS may move it (a trainer job), else None."""


@dataclass
class World:
    """One cell's pool and queue, moved on after each pass as the coordinator's decisions and the
    members' jobs would move them."""

    members: list[Member]
    jobs: Jobs
    queue: list[QueuedJob]
    rng: random.Random
    now: float
    by_uuid: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[str, Run] = field(default_factory=dict)
    policy: dict[str, Any] = field(default_factory=dict)
    """``schedule``'s ``policy=`` (one HAS object for the run, as the coordinator keeps one per term)."""

    @classmethod
    def make(cls, members_n: int, queued_n: int, *, gpus: int, busy: float, shapes: int, novel: float,
             seed: int) -> World:
        """A pool whose GPUs are ``busy`` leased: to jobs the real pass placed where the checkout's
        coordinator gives HAS running jobs (so trainer jobs among them are HAS's to move), else to
        4-GPU script jobs."""
        rng = random.Random(seed * 1_000_003 + members_n * 1009 + queued_n)
        members = make_members(members_n, gpus, rng)
        jobs = Jobs(random.Random(rng.getrandbits(32)), [random_shape(rng) for _ in range(shapes)], novel)
        now = 1_000_000.0
        w = cls(members, jobs, [], rng, now, {g["uuid"]: g for m in members for g in m.report["gpus"]},
                policy=_policy_kwargs())
        offered = sum(1 for g in w.by_uuid.values() if g["offered"])
        if LIVE_HAS:
            w.fill(int(busy * offered))
        free = [u for u, g in w.by_uuid.items() if g["offered"] and g["leased_to"] is None]
        rng.shuffle(free)
        for k in range(max(0, int(busy * offered) - w.busy()) // 4):  # the rest: 4-GPU script jobs
            w.start(f"pre-{k}", free[4 * k: 4 * k + 4], None, None)
        jobs.shapes_seen.clear()  # the fill's jobs are not the queue's
        w.queue = [jobs.new(now - rng.uniform(0, 3600)) for _ in range(queued_n)]
        return w

    def fill(self, target: int) -> None:
        """Place batches of jobs with the real pass until ``target`` GPUs are leased (started at
        random in the last two hours, so some ran long enough for HAS to move them)."""
        idle = 0
        while self.busy() < target and idle < 3:
            batch = [self.jobs.new(self.now - self.rng.uniform(0, 7200)) for _ in range(64)]
            sched = schedule(batch, offers_from_reports(self.peers()), now_s=self.now, **self.policy)
            specs = {q.job_id: (q.spec, q.arrival_s) for q in batch}
            for job_id, pl in sched.start:
                if self.busy() + len(pl.ranks) > target:
                    continue  # the pool is as busy as asked: these arrived later
                spec, started = specs[job_id]
                self.start(job_id, [r.gpu for r in pl.ranks], spec, pl, started_s=started)
            idle = 0 if sched.start else idle + 1
            if sched.start and all(self.busy() + len(pl.ranks) > target for _, pl in sched.start):
                break

    def busy(self) -> int:
        return sum(1 for g in self.by_uuid.values() if g["leased_to"] is not None)

    def peers(self) -> dict[str, dict[str, Any]]:
        """What ``ClusterView.peers`` holds: node id -> its latest heartbeat report."""
        return {m.node_id: m.report for m in self.members}

    def movable(self) -> list[Any]:
        """``schedule``'s ``running=``: the running trainer jobs, as ``CoordinatorRole._running_info``."""
        return [r.info for r in self.running.values() if r.info is not None]

    def start(self, job_id: str, uuids: list[str], spec: JobSpec | None, pl: Any, *,
              started_s: float | None = None) -> None:
        for u in uuids:
            self.by_uuid[u] |= {"leased_to": job_id, "free_bytes": 0}
        info = None
        if LIVE_HAS and spec is not None and spec.trainer and pl is not None:
            from frenzyd.jobs.placement import RunningInfo

            info = RunningInfo(job_id, spec, pl.plan, tuple((r.peer, r.gpu_index) for r in pl.ranks),
                               self.now if started_s is None else started_s)
        self.running[job_id] = Run(uuids, self.rng.randint(1, 40), spec, info)

    def stop(self, job_id: str) -> Run | None:
        run = self.running.pop(job_id, None)
        for u in run.uuids if run is not None else ():
            g = self.by_uuid[u]
            if g["leased_to"] == job_id:
                g["leased_to"] = None
        return run

    def advance(self, sched: Any, churn: float) -> int:
        """The pass's decisions carried out (preempted jobs stop and are queued again, placements
        start, HAS's moves of running jobs included), running jobs finish, the queue turns over (at
        least ``churn`` of it replaced); returns how many queued jobs left."""
        specs = {q.job_id: q.spec for q in self.queue}
        requeued: dict[str, JobSpec] = {}
        for job_id, _ in getattr(sched, "preempt", ()):
            run = self.stop(job_id)
            if run is not None and run.spec is not None:
                requeued[job_id] = run.spec
        started: set[str] = set()
        for job_id, pl in (*sched.start, *getattr(sched, "pending", ())):
            spec = specs.get(job_id) or requeued.pop(job_id, None)
            if spec is None:
                continue  # a move of a job that did not stop: the coordinator would not make it either
            self.stop(job_id)
            self.start(job_id, [r.gpu for r in pl.ranks], spec, pl)
            started.add(job_id)
        for job_id, run in list(self.running.items()):
            if run.left <= 1:
                self.stop(job_id)
            else:
                run.left -= 1
        size = len(self.queue)
        self.queue = [q for q in self.queue if q.job_id not in started]
        need = max(1, math.ceil(churn * size)) - (size - len(self.queue))
        for _ in range(max(0, min(need, len(self.queue)))):  # withdrawn (cancelled, or given up)
            self.queue.pop(self.rng.randrange(len(self.queue)))
        left = size - len(self.queue)
        self.now += 5.0
        self.queue += [QueuedJob(j, spec, self.now) for j, spec in requeued.items()]
        self.queue += [self.jobs.new(self.now) for _ in range(max(0, size - len(self.queue)))]
        jitter(self.members, self.rng)
        return left


INLINE_OK = "plan_inline" in inspect.signature(schedule).parameters
"""This checkout's pass can leave a job whose plans are not cached out (plans warmed at admission)."""


def run_cell(members_n: int, queued_n: int, *, gpus: int, passes: int, churn: float, busy: float,
             shapes: int, novel: float, seed: int, cache: bool, profile: bool,
             inline: bool = False) -> dict[str, Any]:
    """``passes`` coordinator passes over one world, on a fresh plan cache (or none); the world is
    filled on a throwaway cache first."""
    inline = inline or not cache or not INLINE_OK  # without a cache nothing can be warmed ahead
    if plan_cache is None:  # the coordinator before the plan cache
        if cache:
            raise SystemExit("this checkout has no frenzyd.marp.plan_cache: run it with --no-cache")
        world = World.make(members_n, queued_n, gpus=gpus, busy=busy, shapes=shapes, novel=novel, seed=seed)
        return _run(world, queued_n, passes=passes, churn=churn, cache=cache, profile=profile, gpus=gpus,
                    inline=True)
    previous = plan_cache.set_default_cache(plan_cache.PlanCache())
    try:
        world = World.make(members_n, queued_n, gpus=gpus, busy=busy, shapes=shapes, novel=novel, seed=seed)
        plan_cache.set_default_cache(plan_cache.PlanCache() if cache else plan_cache.PlanCache(0))
        if hasattr(placement, "forget_jobs"):
            placement.forget_jobs()  # a fresh coordinator: nothing kept from the filling's passes
        return _run(world, queued_n, passes=passes, churn=churn, cache=cache, profile=profile, gpus=gpus,
                    inline=inline)
    finally:
        plan_cache.set_default_cache(previous)


@dataclass
class Admissions:
    """``placement.warm_plans`` calls, timed (wall and this thread's CPU), apart from the passes."""

    new_s: list[float] = field(default_factory=list)
    """Each call that computed plans (a job whose shape, over this pool, was new): wall seconds."""
    new_cpu_s: list[float] = field(default_factory=list)
    known_s: list[float] = field(default_factory=list)
    """Each call that found the plans cached already."""

    def admit(self, jobs: Sequence[QueuedJob], offers: Any) -> float:
        """Admit ``jobs`` over ``offers`` as the coordinator does; returns the wall seconds spent."""
        spent = 0.0
        for q in jobs:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                computed = placement.warm_plans(q.spec, offers)
            except FrenzyError:  # an impossible shape: the pass reports it
                computed = False
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            spent += dt
            (self.new_s if computed else self.known_s).append(dt)
            if computed:
                self.new_cpu_s.append(dc)
        return spent

    def summary(self) -> dict[str, Any]:
        new, cpu, known = sorted(self.new_s), sorted(self.new_cpu_s), sorted(self.known_s)
        return {"new_shapes": len(new), "known": len(known),
                "new_shape_median_s": statistics.median(new) if new else None,
                "new_shape_p95_s": _p95(new) if new else None, "new_shape_max_s": new[-1] if new else None,
                "new_shape_cpu_median_s": statistics.median(cpu) if cpu else None,
                "new_shape_cpu_p95_s": _p95(cpu) if cpu else None,
                "known_median_s": statistics.median(known) if known else None,
                "total_s": sum(new) + sum(known)}


def _run(world: World, queued_n: int, *, passes: int, churn: float, cache: bool, profile: bool,
         gpus: int, inline: bool = True) -> dict[str, Any]:
    members_n = len(world.members)
    kwargs = dict(world.policy)
    if not inline:
        kwargs["plan_inline"] = False
    times: list[float] = []
    cpu: list[float] = []
    started = changed = infeasible = preempted = 0
    movable: list[int] = []
    waited: list[int] = []
    busy = world.busy()
    prof = cProfile.Profile() if profile else None
    cold = Admissions()
    adm = Admissions()
    cold_admission_s = None
    offers = offers_from_reports(world.peers(), {}) if not inline else None
    if offers is not None:  # the first queue arrives before the first pass: admitted on an empty cache
        cold_admission_s = cold.admit(world.queue, offers)
    for i in range(passes):
        peers = world.peers()
        reserved: dict[str, str] = {}
        gc.collect()
        if prof is not None and i > 0:
            prof.enable()
        running = {"running": world.movable()} if LIVE_HAS else {}
        movable.append(len(running.get("running", ())))
        t0, c0 = time.perf_counter(), time.thread_time()
        offers = offers_from_reports(peers, reserved)
        sched = schedule(world.queue, offers, now_s=world.now, **kwargs, **running)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        if prof is not None:
            prof.disable()
        infeasible += len(sched.infeasible)
        started += len(sched.start)
        preempted += len(getattr(sched, "preempt", ()))
        left_out = getattr(sched, "planning", ())
        waited.append(len(left_out))
        before = {q.job_id for q in world.queue}
        if left_out:  # the coordinator warms them off the pass (the first pass: running jobs it never saw)
            specs = {q.job_id: q for q in world.queue} | {
                r.job_id: QueuedJob(r.job_id, r.spec, r.started_s) for r in running.get("running", ())}
            (cold if i == 0 else adm).admit([specs[j] for j in left_out if j in specs], offers)
        changed += world.advance(sched, churn)
        if not inline:  # the jobs that arrived since: admitted before the next pass
            adm.admit([q for q in world.queue if q.job_id not in before], offers)
    stats = plan_cache.default_cache().stats() if plan_cache is not None else None
    warm, warm_cpu = sorted(times[1:]), sorted(cpu[1:])
    out: dict[str, Any] = {
        "members": members_n, "gpus": members_n * gpus, "queued": queued_n, "passes": passes,
        "cache": cache, "plans": "inline" if inline else "admission",
        "cold_s": times[0], "cold_cpu_s": cpu[0],
        "cold_admission_s": cold_admission_s,
        "cold_admission": cold.summary() if not inline else None,
        "median_s": statistics.median(warm) if warm else None,
        "p95_s": _p95(warm) if warm else None,
        "max_s": warm[-1] if warm else None,
        "cpu_median_s": statistics.median(warm_cpu) if warm_cpu else None,
        "cpu_p95_s": _p95(warm_cpu) if warm_cpu else None,
        "pass_s": times,
        "pass_cpu_s": cpu,
        "admission": adm.summary() if not inline else None,
        "left_out_for_plans": waited,
        "started": started, "infeasible_reports": infeasible, "preempted": preempted,
        "running_given_to_has": {"min": min(movable), "max": max(movable)} if movable else None,
        "busy_gpus_at_start": busy,
        "queue_changed_per_pass": changed / passes / queued_n,
        "distinct_shapes": len(world.jobs.shapes_seen),
        "load_avg_1m": os.getloadavg()[0],  # wall times stretch on a loaded machine, CPU times much less
        "plan_cache": {"hits": stats.hits, "misses": stats.misses, "counts_computed": stats.counts_computed,
                       "job_shapes": stats.job_shapes} if cache and stats is not None else None,
    }
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        out["profile"] = buf.getvalue()
    return out


# --- membership at scale: SWIM members over the in-memory transport (issue 18 (b)) -----------------


@dataclass
class SwimMember:
    index: int
    entry: Any
    driver: Any
    up: bool = True


def _idle_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    idle, total = after[0] - before[0], after[1] - before[1]
    return None if total <= 0 else idle / total


def _cpu_times() -> tuple[int, int]:
    """(idle + iowait, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)


async def _lag_probe(stop: Any, lags: list[float], step_s: float = 0.05) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(step_s)
        lags.append(loop.time() - t - step_s)


async def _swim_cell(n: int, *, delay_s: float, loss: float, steady_s: float, detect_limit_s: float,
                     seed: int) -> dict[str, Any]:
    """``n`` members, each a real membership core and driver, exchanging real frames over the in-memory
    transport (``delay_s`` each way, ``loss``).  The pool starts formed (every member's entry merged into
    every core: not measured), runs ``steady_s`` to measure per-member traffic, then one member crashes;
    reported: when each other member first holds it dead, and every suspicion of a member that was up."""
    import asyncio

    from frenzyd.net.gossip import GossipDriver
    from frenzyd.net.membership import ALIVE, DEAD, SUSPECT, Membership, Params
    from frenzyd.net.memnet import MemoryNet
    from frenzyd.net.messages import MemberEntry

    rng = random.Random(seed)
    net = MemoryNet(delay_s=delay_s, loss=loss, rng=random.Random(seed + 1))
    params = Params()
    loop = asyncio.get_running_loop()
    members: list[SwimMember] = []
    false_episodes: set[tuple[str, int]] = set()
    dead_at: dict[int, float] = {}
    victim: list[str] = []
    up: dict[str, bool] = {}
    all_know = asyncio.Event()

    def watcher(i: int) -> Any:
        def on_changes(changes: list[Any]) -> None:
            for e in changes:
                if e.state == SUSPECT and up.get(e.node_id, False):
                    false_episodes.add((e.node_id, e.incarnation))
                elif e.state >= DEAD and victim and e.node_id == victim[0]:
                    dead_at.setdefault(i, loop.time())
                    if len(dead_at) >= n - 1:
                        all_know.set()
        return on_changes

    t_build = time.perf_counter()
    entries = [MemberEntry(f"{i:032x}", f"ws-{i:04d}", f"10.{i // 62500}.{i // 250 % 250}.{i % 250 + 1}:7470",
                           0, 1, ALIVE, 0, None)
               for i in range(n)]
    for i, me in enumerate(entries):
        core = Membership(me, params, rng=random.Random(seed * 100_003 + i))
        for other in entries:
            if other is not me:
                core.merge(other, 0.0, gossip=False)
        core.drain_changes()
        driver = GossipDriver(core, net.sender(me.node_id), on_changes=watcher(i), clock=loop.time)
        net.attach(me.address, me.node_id, driver.deliver_frame)
        members.append(SwimMember(i, me, driver))
        up[me.node_id] = True
    build_s = time.perf_counter() - t_build
    gc.collect()
    gc.freeze()  # n x n entries: keep the harness's own collections from stalling every member at once
    stop = asyncio.Event()
    lags: list[float] = []
    lag_task = asyncio.create_task(_lag_probe(stop, lags))
    for m in members:  # each core probes at its own random phase in the period
        m.driver.start()
    await asyncio.sleep(params.period_s + 2.0)  # warm-up

    frames0, bytes0 = sum(net.frames.values()), sum(net.bytes.values())
    cpu0, idle0, t0 = time.process_time(), _cpu_times(), loop.time()
    await asyncio.sleep(steady_s)
    wall = loop.time() - t0
    frames = sum(net.frames.values()) - frames0
    sent_bytes = sum(net.bytes.values()) - bytes0
    cpu = time.process_time() - cpu0
    idle = _idle_share(idle0, _cpu_times())
    steady_lag = sorted(lags)

    x = members[rng.randrange(n)]
    victim.append(x.entry.node_id)
    up[x.entry.node_id] = False
    x.driver.stop(leave=False)
    net.detach(x.entry.address)
    killed = loop.time()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(all_know.wait(), detect_limit_s)
    after = sorted(t - killed for i, t in dead_at.items() if i != x.index)
    for m in members:
        m.driver.stop(leave=False)
    stop.set()
    await lag_task
    gc.unfreeze()
    lag_sorted = sorted(lags)
    return {
        "members": n, "delay_ms": delay_s * 1e3, "loss": loss, "period_s": params.period_s,
        "ack_timeout_s": params.ack_timeout_s, "indirect_k": params.indirect_k,
        "suspicion_timeout_s": members[0].driver.core.suspicion_timeout(),
        "suspicion_max_s": members[0].driver.core.suspicion_timeout(0),
        "suspicion_k": params.suspicion_k,
        "confirmations": sum(m.driver.core.counters["confirmations"] for m in members),
        "build_s": round(build_s, 2), "steady_s": round(wall, 2),
        "msgs_per_member_s": frames / n / wall, "bytes_per_member_s": sent_bytes / n / wall,
        "harness_cpu_per_member_ms_s": cpu / n / wall * 1e3, "harness_cpu_share": cpu / wall,
        "machine_idle": idle, "contended": idle is not None and idle < 0.3,
        "loop_lag_p95_ms": _p95(steady_lag) * 1e3 if steady_lag else None,
        "loop_lag_max_ms": lag_sorted[-1] * 1e3 if lag_sorted else None,
        "dead_known_by": len(after), "of": n - 1,
        "dead_known_by_all_s": after[-1] if len(after) == n - 1 else None,
        "dead_known_median_s": statistics.median(after) if after else None,
        "false_suspicions": len(false_episodes),
        "lost_frames": dict(net.lost),
    }


def run_swim(sizes: Sequence[int], *, delay_s: float, loss: float, steady_s: float, detect_limit_s: float,
             seed: int) -> list[dict[str, Any]]:
    import asyncio

    print(f"{'members':>8}{'msgs/s':>8}{'B/s':>8}{'cpu ms/s':>9}{'dead all s':>11}{'median s':>9}"
          f"{'false':>6}{'lag p95':>8}{'idle':>6}")
    rows = []
    for n in sizes:
        row = asyncio.run(_swim_cell(n, delay_s=delay_s, loss=loss, steady_s=steady_s,
                                     detect_limit_s=detect_limit_s, seed=seed))
        rows.append(row)
        dead = row["dead_known_by_all_s"]
        idle = row["machine_idle"]
        print(f"{n:>8}{row['msgs_per_member_s']:>8.2f}{row['bytes_per_member_s']:>8.0f}"
              f"{row['harness_cpu_per_member_ms_s']:>9.3f}"
              f"{'-' if dead is None else f'{dead:.1f}':>11}{row['dead_known_median_s'] or 0:>9.1f}"
              f"{row['false_suspicions']:>6}{row['loop_lag_p95_ms'] or 0:>8.1f}"
              f"{'-' if idle is None else f'{idle:.0%}':>6}{' contended' if row['contended'] else ''}",
              flush=True)
    return rows


# --- real daemons in network namespaces (issue 18 (a)) ------------------------------------------


def _proc_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (from /proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_tx_bytes(pid: int, ifname: str = "eth0") -> int | None:
    """Bytes sent on ``ifname`` of process ``pid``'s network namespace (one daemon per namespace)."""
    try:
        with open(f"/proc/{pid}/net/dev") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name.strip() == ifname:
                    return int(rest.split()[8])
    except OSError:
        return None
    return None


def _proc_udp_errors(pid: int) -> tuple[int, int]:
    """UDP (InErrors, RcvbufErrors) of process ``pid``'s network namespace (mDNS datagrams dropped)."""
    try:
        with open(f"/proc/{pid}/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Udp:")]
    except OSError:
        return 0, 0
    if len(rows) < 2:
        return 0, 0
    got = dict(zip(rows[0][1:], rows[1][1:], strict=False))
    return int(got.get("InErrors", 0)), int(got.get("RcvbufErrors", 0))


async def _statuses(socks: Sequence[Path]) -> list[dict[str, Any] | None]:
    import asyncio

    from frenzy_client.daemon_client import DaemonClient
    from frenzyd.errors import FrenzyError

    async def one(sock: Path) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(10):
                async with DaemonClient(f"unix:{sock}") as c:
                    return dict(await c.status())
        except (FrenzyError, OSError, TimeoutError, ValueError):
            return None

    return list(await asyncio.gather(*(one(s) for s in socks)))


def _agreed(sts: Sequence[dict[str, Any] | None], n: int, dead: str | None = None) -> str | None:
    """The coordinator every daemon names when each sees ``n`` members alive (``dead`` among none)."""
    if any(s is None for s in sts):
        return None
    coords = set()
    for s in sts:
        assert s is not None
        alive = {p["id"] for p in s["peers"] if p.get("alive")}
        if len(alive) != n or (dead is not None and dead in alive):
            return None
        coords.add((s.get("coordinator") or {}).get("id"))
    return coords.pop() if len(coords) == 1 and None not in coords else None


def _conf_class(base: type[Any], mode: str) -> type[Any]:
    """``_pool.NodeConf`` whose config file sets ``[network] membership = MODE``."""

    class Conf(base):  # type: ignore[misc,valid-type]
        def write(self) -> Path:
            path: Path = super().write()
            text = path.read_text().replace("[network]\n", f'[network]\nmembership = "{mode}"\n', 1)
            path.write_text(text)
            return path

    return Conf


def _census(sts: Sequence[dict[str, Any] | None]) -> list[int | None]:
    """Per daemon: how many members its status lists alive (itself included), None without an answer."""
    return [None if s is None else sum(1 for p in s["peers"] if p.get("alive")) for s in sts]


def run_daemons(sizes: Sequence[int], modes: Sequence[str], *, window_s: float, limit_s: float,
                work: Path, settle_s: float = 0.0) -> list[dict[str, Any]]:
    """For each membership mode and pool size: ``n`` frenzyd in their own network namespaces on one
    bridge, mDNS on and no static peers, one simulated GPU each.  Measured: the time from the first
    start until every daemon lists all ``n`` alive under one coordinator; then, ``settle_s`` later (past
    the start's bursts and the first life of its connections), over ``window_s`` each
    daemon's CPU (/proc/PID/stat) and bytes sent (its namespace's eth0), the coordinator apart; then the
    coordinator is SIGKILLed: the time until the others agree on a new one (the dead one not alive), and
    until the new one's status shows every live member's GPUs (its view rebuilt from their reports)."""
    import asyncio
    import signal as _signal
    import subprocess

    from _pool import Daemon, NodeConf, env, make_pool  # noqa: F401

    from tests.netns import NetnsLab, skip_reason

    why = skip_reason()
    if why:
        raise SystemExit(f"--part daemons: {why}")
    names = [f"m{i:02d}" for i in range(max(sizes))]
    creds = make_pool(work / "pool", names)
    rows = []
    print(f"{'mode':>6}{'members':>8}{'full s':>8}{'cpu %':>8}{'cpu max %':>10}{'B/s':>9}{'coord cpu %':>12}"
          f"{'coord B/s':>10}{'failover s':>11}{'view s':>8}{'idle':>6}")
    for mode in modes:
        for n in sizes:
            run_dir = work / f"{mode}-{n}"
            conf = _conf_class(NodeConf, mode)
            with NetnsLab(n) as lab:
                daemons = [Daemon(conf(name=names[i], base=run_dir / names[i], credentials=creds[names[i]],
                                       devices=[("RTX-3090", 1)], interfaces=["eth0"], mdns=True,
                                       priority=10 if i == 0 else 0, heartbeat_s=1.0, peer_timeout_s=4.0),
                                  spawn=lambda argv, i=i, **kw: lab.popen(i, argv, **kw))
                           for i in range(n)]
                socks = [d.conf.socket for d in daemons]
                try:
                    t0 = time.monotonic()
                    for d in daemons:
                        d.start()
                    full_s = coord = None
                    timeline: list[dict[str, Any]] = []
                    answered_at: list[float | None] = [None] * n
                    full_at: list[float | None] = [None] * n
                    while time.monotonic() - t0 < limit_s:
                        sts = asyncio.run(_statuses(socks))
                        now = round(time.monotonic() - t0, 1)
                        census = _census(sts)
                        for i, c in enumerate(census):
                            if c is not None and answered_at[i] is None:
                                answered_at[i] = now
                            if c == n and full_at[i] is None:
                                full_at[i] = now
                        seen = [c for c in census if c is not None]
                        timeline.append({"t": now, "answering": len(seen),
                                         "alive_min": min(seen, default=None),
                                         "alive_median": statistics.median(seen) if seen else None,
                                         "full": sum(1 for c in seen if c == n)})
                        coord = _agreed(sts, n)
                        if coord is not None:
                            full_s = time.monotonic() - t0
                            break
                        time.sleep(0.5)
                    udp = [_proc_udp_errors(d.proc.pid) for d in daemons if d.proc is not None]
                    row: dict[str, Any] = {"mode": mode, "members": n, "full_membership_s": full_s,
                                           "first_answer_s": answered_at, "first_full_view_s": full_at,
                                           "udp_in_errors": sum(u[0] for u in udp),
                                           "udp_rcvbuf_errors": sum(u[1] for u in udp),
                                           "timeline": timeline[:: max(1, len(timeline) // 60)]}
                    if full_s is None:
                        last = timeline[-1] if timeline else {}
                        row["at_limit"] = last
                        rows.append(row)
                        print(f"{mode:>6}{n:>8}{'-':>8}  (no full membership within {limit_s:.0f}s)",
                              flush=True)
                        continue
                    time.sleep(settle_s)
                    sts = asyncio.run(_statuses(socks))
                    ids = [s["node"]["id"] if s else None for s in sts]
                    pids = [d.proc.pid for d in daemons if d.proc is not None]
                    cpu0 = [_proc_cpu_s(p) for p in pids]
                    tx0 = [_proc_tx_bytes(p) for p in pids]
                    idle0, w0 = _cpu_times(), time.monotonic()
                    time.sleep(window_s)
                    wall = time.monotonic() - w0
                    cpu = [None if a is None or b is None else (b - a) / wall
                           for a, b in zip(cpu0, (_proc_cpu_s(p) for p in pids), strict=True)]
                    tx = [None if a is None or b is None else (b - a) / wall
                          for a, b in zip(tx0, (_proc_tx_bytes(p) for p in pids), strict=True)]
                    idle = _idle_share(idle0, _cpu_times())
                    ci = ids.index(coord)
                    members_cpu = [c for i, c in enumerate(cpu) if i != ci and c is not None]
                    members_tx = [b for i, b in enumerate(tx) if i != ci and b is not None]
                    daemons[ci].kill(_signal.SIGKILL)
                    k0 = time.monotonic()
                    row["coordinator_killed_at"] = time.strftime("%H:%M:%S", time.localtime()) + \
                        f"{time.time() % 1:.3f}"[1:]  # to find the failover in the kept logs
                    rest = [s for i, s in enumerate(socks) if i != ci]
                    failover_s = rebuilt_s = None
                    new = None
                    while time.monotonic() - k0 < limit_s:
                        new = _agreed(asyncio.run(_statuses(rest)), n - 1, dead=coord)
                        if new is not None and new != coord:
                            failover_s = time.monotonic() - k0
                            break
                        time.sleep(0.5)
                    if failover_s is not None:  # the new coordinator holds every live member's GPUs again
                        new_sock = socks[ids.index(new)]
                        while time.monotonic() - k0 < limit_s:
                            (st,) = asyncio.run(_statuses([new_sock]))
                            live = [p for p in (st or {}).get("peers", []) if p.get("alive")]
                            if len(live) == n - 1 and all(p.get("gpus") for p in live):
                                rebuilt_s = time.monotonic() - k0
                                break
                            time.sleep(0.5)
                    row.update({
                        "settle_s": settle_s, "window_s": round(wall, 1),
                        "member_cpu_share_median": statistics.median(members_cpu) if members_cpu else None,
                        "member_cpu_share_max": max(members_cpu) if members_cpu else None,
                        "member_tx_bytes_s_median": statistics.median(members_tx) if members_tx else None,
                        "coordinator_cpu_share": cpu[ci], "coordinator_tx_bytes_s": tx[ci],
                        "failover_s": failover_s, "view_rebuilt_s": rebuilt_s, "machine_idle": idle,
                        "contended": idle is not None and idle < 0.3,
                    })
                    rows.append(row)

                    def pct(x: float | None) -> str:
                        return "-" if x is None else f"{100 * x:.2f}"

                    print(f"{mode:>6}{n:>8}{full_s:>8.1f}{pct(row['member_cpu_share_median']):>8}"
                          f"{pct(row['member_cpu_share_max']):>10}"
                          f"{row['member_tx_bytes_s_median'] or 0:>9.0f}"
                          f"{pct(cpu[ci]):>12}{tx[ci] or 0:>10.0f}"
                          f"{'-' if failover_s is None else f'{failover_s:.1f}':>11}"
                          f"{'-' if rebuilt_s is None else f'{rebuilt_s:.1f}':>8}"
                          f"{'-' if idle is None else f'{idle:.0%}':>6}"
                          f"{' contended' if row['contended'] else ''}", flush=True)
                finally:
                    for d in daemons:
                        d.kill(_signal.SIGKILL)
                    for d in daemons:
                        if d.proc is not None:
                            with contextlib.suppress(subprocess.TimeoutExpired):
                                d.proc.wait(10)
    return rows


def flatness(rows: Sequence[dict[str, Any]], within: float = 2.0) -> dict[str, Any]:
    """Per membership mode: a member's CPU and bytes sent per second at the largest pool over the
    smallest (issue 18's target: within 2x from 5 to 40 members).  Only rows with full membership and
    an uncontended machine count; ``met`` is None when fewer than two sizes do."""
    out: dict[str, Any] = {}
    for mode in sorted({r["mode"] for r in rows}):
        ok = sorted((r for r in rows if r["mode"] == mode and r.get("member_cpu_share_median") is not None
                     and r.get("member_tx_bytes_s_median") and not r.get("contended")),
                    key=lambda r: r["members"])
        if len(ok) < 2:
            out[mode] = {"within": within, "met": None,
                         "why": "fewer than two pool sizes reached full membership uncontended"}
            continue
        lo, hi = ok[0], ok[-1]
        cpu = hi["member_cpu_share_median"] / max(lo["member_cpu_share_median"], 1e-9)
        tx = hi["member_tx_bytes_s_median"] / lo["member_tx_bytes_s_median"]
        out[mode] = {"from": lo["members"], "to": hi["members"], "member_cpu_ratio": round(cpu, 2),
                     "member_bytes_ratio": round(tx, 2), "within": within,
                     "met": cpu <= within and tx <= within}
    return out


def _p95(xs: list[float]) -> float:
    """Nearest-rank 95th percentile of an ascending list."""
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CI size: 20 members, 10 and 40 queued, 5 passes")
    ap.add_argument("--out", "--json", dest="out", type=Path, help="write the JSON results here")
    ap.add_argument("--members", type=lambda t: tuple(int(x) for x in t.split(",")), default=None,
                    help="pool sizes (default 100,300,1000)")
    ap.add_argument("--queued", type=lambda t: tuple(int(x) for x in t.split(",")), default=None,
                    help="queue lengths (default 10,100,500)")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per member (default 4)")
    ap.add_argument("--passes", type=int, default=None, help="passes per cell, the cold one included "
                    "(default 20; tiny 5)")
    ap.add_argument("--churn", type=float, default=0.05, help="least share of the queue replaced per pass")
    ap.add_argument("--busy", type=float, default=0.8, help="share of GPUs running jobs at the start")
    ap.add_argument("--shapes", type=int, default=40, help="experiment shapes in the catalogue")
    ap.add_argument("--novel", type=float, default=0.05, help="chance a new job has a shape never seen")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cache", action="store_true", help="MARP's plan cache off: every call enumerates "
                    "plans afresh (the coordinator before the cache)")
    ap.add_argument("--inline-plans", action="store_true", help="the pass enumerates a new job shape's plans "
                    "itself, as the coordinator did before plans were computed at admission")
    ap.add_argument("--profile", action="store_true", help="cProfile the warm passes; print the top")
    ap.add_argument("--part", choices=("all", "pass", "membership", "daemons"), default="all",
                    help="the coordinator pass, membership (SWIM over the in-memory transport), both (all), "
                         "or real daemons in network namespaces (root; not part of all)")
    ap.add_argument("--daemons", type=lambda t: tuple(int(x) for x in t.split(",")), default=(5, 10, 20, 40),
                    help="--part daemons: pool sizes (default 5,10,20,40)")
    ap.add_argument("--modes", type=lambda t: tuple(t.split(",")), default=("mesh", "swim"),
                    help="--part daemons: [network] membership modes (default mesh,swim)")
    ap.add_argument("--window-s", type=float, default=30.0, help="--part daemons: CPU and bytes window")
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="--part daemons: wait this long after full membership before the window (steady "
                         "state: kept-alive connections live 90 s)")
    ap.add_argument("--limit-s", type=float, default=300.0,
                    help="--part daemons: give up on full membership or a failover after this")
    ap.add_argument("--keep", type=Path, default=None,
                    help="--part daemons: run in this directory and keep it (each daemon's log and config)")
    ap.add_argument("--swim-members", type=lambda t: tuple(int(x) for x in t.split(",")), default=None,
                    help="membership pool sizes (default 100,300,1000; tiny 20)")
    ap.add_argument("--swim-steady-s", type=float, default=None, help="seconds of steady traffic measured "
                    "before a member crashes (default 20; tiny 3)")
    ap.add_argument("--swim-detect-limit-s", type=float, default=60.0,
                    help="give up waiting for every member to know of the dead one after this")
    ap.add_argument("--delay-ms", type=float, default=5.0, help="in-memory transport delay, each way")
    ap.add_argument("--loss", type=float, default=0.01, help="share of frames the in-memory transport loses")
    args = ap.parse_args(argv)
    base = TINY if args.tiny else FULL
    sizes = Sizes(base.members if args.members is None else args.members,
                  base.queued if args.queued is None else args.queued,
                  base.passes if args.passes is None else args.passes)
    for name, v in (("--passes", sizes.passes), ("--gpus", args.gpus), ("--shapes", args.shapes)):
        if v < 1:
            ap.error(f"{name} must be at least 1")
    if not 0.0 <= args.churn <= 1.0 or not 0.0 <= args.busy < 1.0 or not 0.0 <= args.novel <= 1.0:
        ap.error("--churn and --novel must be in [0, 1], --busy in [0, 1)")
    if min(sizes.members) < 1 or min(sizes.queued) < 1:
        ap.error("--members and --queued must be positive")
    swim_sizes = args.swim_members or (SWIM_TINY if args.tiny else SWIM_FULL)
    swim_steady = args.swim_steady_s if args.swim_steady_s is not None else (3.0 if args.tiny else 20.0)
    if min(swim_sizes) < 2 or swim_steady <= 0 or not 0 <= args.loss < 1 or args.delay_ms < 0:
        ap.error("--swim-members >= 2, --swim-steady-s > 0, --loss in [0, 1), --delay-ms >= 0")
    prov = provenance()
    cells = []
    if args.part in ("membership", "daemons"):
        sizes = Sizes((), (), sizes.passes)
    if sizes.members:
        print(f"{'members':>8}{'GPUs':>7}{'queued':>8}{'cache':>7}{'plans':>10}{'cold adm s':>11}"
              f"{'cold ms':>9}{'median ms':>11}{'p95 ms':>9}{'max ms':>9}{'cpu med':>9}{'cpu p95':>9}"
              f"{'new shp':>8}{'adm med':>9}{'adm p95':>9}{'waited':>7}{'started':>9}{'shapes':>8}"
              f"{'counts':>9}")
    for m in sizes.members:
        for q in sizes.queued:
            cell = run_cell(m, q, gpus=args.gpus, passes=sizes.passes, churn=args.churn, busy=args.busy,
                            shapes=args.shapes, novel=args.novel, seed=args.seed, cache=not args.no_cache,
                            profile=args.profile, inline=args.inline_plans)
            cells.append(cell)
            pc = cell["plan_cache"]
            counts = pc["counts_computed"] if pc else "-"
            adm = cell["admission"] or {}
            cold_adm = "-" if cell["cold_admission_s"] is None else f"{cell['cold_admission_s']:.2f}"
            print(f"{m:>8}{cell['gpus']:>7}{q:>8}{'on' if cell['cache'] else 'off':>7}{cell['plans']:>10}"
                  f"{cold_adm:>11}{_ms(cell['cold_s']):>9}{_ms(cell['median_s']):>11}{_ms(cell['p95_s']):>9}"
                  f"{_ms(cell['max_s']):>9}{_ms(cell['cpu_median_s']):>9}{_ms(cell['cpu_p95_s']):>9}"
                  f"{adm.get('new_shapes', '-'):>8}{_ms(adm.get('new_shape_median_s')):>9}"
                  f"{_ms(adm.get('new_shape_p95_s')):>9}{sum(cell['left_out_for_plans'][1:]):>7}"
                  f"{cell['started']:>9}{cell['distinct_shapes']:>8}{counts:>9}",
                  flush=True)
            if args.profile:
                print(cell["profile"])
    swim = []
    if args.part in ("all", "membership"):
        print()
        swim = run_swim(swim_sizes, delay_s=args.delay_ms / 1e3, loss=args.loss, steady_s=swim_steady,
                        detect_limit_s=args.swim_detect_limit_s, seed=args.seed)
    daemons: list[dict[str, Any]] = []
    flat: dict[str, Any] = {}
    if args.part == "daemons":
        import tempfile

        if set(args.modes) - {"mesh", "swim"} or min(args.daemons) < 2:
            ap.error("--modes takes mesh and/or swim; --daemons sizes are at least 2")
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            daemons = run_daemons(args.daemons, args.modes, window_s=args.window_s, limit_s=args.limit_s,
                                  work=args.keep, settle_s=args.settle_s)
        else:
            with tempfile.TemporaryDirectory(prefix="frenzy-scale-") as tmp:
                daemons = run_daemons(args.daemons, args.modes, window_s=args.window_s, limit_s=args.limit_s,
                                      work=Path(tmp), settle_s=args.settle_s)
        flat = flatness(daemons)
        for mode, t in flat.items():
            if t["met"] is None:
                print(f"{mode}: flatness not measured ({t['why']})")
            else:
                print(f"{mode}: a member's CPU x{t['member_cpu_ratio']}, bytes x{t['member_bytes_ratio']} "
                      f"from {t['from']} to {t['to']} members (target within {t['within']}x: "
                      f"{'met' if t['met'] else 'missed'})")
    big = next((r for r in swim if r["members"] == 1000), None)
    target = next((c for c in cells if (c["members"], c["gpus"], c["queued"]) == (1000, 4000, 500)), None)
    doc = {
        "benchmark": "scale",
        "what": "coordinator pass (offers_from_reports + placement.schedule) over simulated members' reports",
        "settings": {"gpus_per_member": args.gpus, "passes": sizes.passes, "churn": args.churn,
                     "busy": args.busy, "shapes": args.shapes, "novel": args.novel, "seed": args.seed,
                     "plan_cache": not args.no_cache, "gpu_mix": dict(GPU_MIX),
                     "plans": "inline" if args.inline_plans or args.no_cache or not INLINE_OK else
                              "admission (placement.warm_plans per arriving job, timed apart; "
                              "the pass leaves a job without cached plans out)",
                     "presets": [p for p, *_ in PRESETS], "declared_share": DECLARED_SHARE,
                     "schedule_signature": str(inspect.signature(placement.schedule))},
        "not_measured": None if daemons else "real daemons in network namespaces (issue 18 (a)): "
                                             "--part daemons",
        "daemons": daemons,
        "daemons_target": flat,
        "membership": {"settings": {"delay_ms": args.delay_ms, "loss": args.loss, "steady_s": swim_steady,
                                    "start": "formed (every entry merged into every core, not measured)"},
                       "target": {"dead_known_by_all_s_below": 15.0, "false_suspicions": 0, "at": 1000,
                                  "met": None if big is None else (big["dead_known_by_all_s"] is not None
                                                                   and big["dead_known_by_all_s"] < 15.0
                                                                   and big["false_suspicions"] == 0)},
                       "rows": swim},
        "target": {"pass_p95_s_below": 0.1, "at": "1000 members x 4 GPUs x 500 queued",
                   "met": None if target is None or target["p95_s"] is None else target["p95_s"] < 0.1},
        "cells": [{k: v for k, v in c.items() if k != "profile"} for c in cells],
    }
    if args.out:
        write_results(args.out, doc, prov)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
