"""The one scheduling-policy interface: frozen snapshot values in, a placement decision out.

Every policy (``frenzy``, ``sia``, ``gavel``, ``fifo`` and any outside
``module:attr`` object) implements :class:`Policy`: ``decide(snapshot, rng)``
gets the whole state of the pool at one moment as plain frozen values and
returns which queued (or running) jobs go where, and which running jobs stop.
A policy must be deterministic for a given snapshot and generator state; any
randomness comes from the seeded ``random.Random`` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from frenzyd.has.speed import JobSpeed
from frenzyd.marp.spec import Plan

Reason = Literal["arrival", "completion", "failure", "round"]


class Gpu(NamedTuple):
    """One concrete GPU: ``index`` is its local index on ``peer``.

    A named tuple, not a dataclass: policies and the simulator hash, compare
    and sort GPUs in their inner loops, and tuple's C-level ``__hash__``,
    ``__eq__`` and ordering (by peer, index, type) cost a fraction of
    generated Python methods.
    """

    peer: str
    index: int  # type: ignore[assignment]  # shadows tuple.index(), which nothing here calls
    gpu_type: str


@dataclass(frozen=True, slots=True)
class GpuTypeSpec:
    """A GPU type of the cluster: memory and relative training speed (V100 = 1.0)."""

    name: str
    memory_bytes: int
    speed: float


@dataclass(frozen=True, slots=True)
class Cluster:
    """The static pool: types and every GPU, sorted by (peer, index)."""

    types: tuple[GpuTypeSpec, ...]
    gpus: tuple[Gpu, ...]

    def type_spec(self, name: str) -> GpuTypeSpec:
        for t in self.types:
            if t.name == name:
                return t
        raise KeyError(name)

    def per_peer(self) -> dict[tuple[str, str], int]:
        """GPUs per (peer, type)."""
        out: dict[tuple[str, str], int] = {}
        for g in self.gpus:
            out[(g.peer, g.gpu_type)] = out.get((g.peer, g.gpu_type), 0) + 1
        return out

    def max_per_peer(self) -> dict[str, int]:
        """Largest number of GPUs of each type inside one peer."""
        out: dict[str, int] = {}
        for (_, t), n in self.per_peer().items():
            out[t] = max(out.get(t, 0), n)
        return out


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as every policy sees it.

    ``plans``: MARP's feasible plans, at most one per (GPU type, GPU count),
    each with ``step_time_s`` = the speed model's estimate when the job is
    packed on as few peers as the cluster allows.  ``speed`` evaluates any
    other placement (``speed.step_time_s(plan, gpu_speed, peers)``).
    ``requested_gpus`` is the GPU count the user (the trace) asked for, doubled
    after each out-of-memory failure.  ``service_s`` is the GPU-type seconds
    the job has run so far, per type.
    """

    job_id: str
    arrival_s: float
    requested_gpus: int
    plans: tuple[Plan, ...]
    speed: JobSpeed
    total_steps: float
    remaining_steps: float
    restarts: int = 0
    service_s: tuple[tuple[str, float], ...] = ()
    global_batch: int = 1
    """Sequences per optimizer step (the declared work is ``total_steps × global_batch``)."""
    stop_cost_s: float = 0.0
    """Seconds a stop of the running job adds to its restart: its checkpoint write (the pool's model;
    the simulator's ``sim.preemption``; 0 when unknown)."""

    @property
    def restart_cost_s(self) -> float:
        """Seconds a re-placement costs the job: start-up and checkpoint load, plus the stop's write."""
        return self.speed.restart_cost_s + self.stop_cost_s


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds GPUs now.

    ``step_time_s``: seconds per optimizer step on these GPUs as the pool
    knows it (the simulator: its speed model for this placement; a daemon: the
    measured step time), or None when unknown (policies then use
    ``job.speed.step_time_s(plan, gpu_speed, peers)``).
    """

    job: JobView
    plan: Plan
    gpus: tuple[Gpu, ...]
    started_s: float
    step_time_s: float | None = None
    ready_s: float | None = None
    """When its progress on these GPUs began or begins: a live pool's first step (``inf`` until it
    comes: process start, rendezvous, checkpoint load), the simulator's start done.  None: not
    known; policies count from ``started_s``."""

    def ran_s(self, now_s: float) -> float:
        """Seconds of progress on these GPUs by ``now_s``; negative while it is still starting."""
        return now_s - (self.started_s if self.ready_s is None else self.ready_s)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may know at one scheduling moment.

    ``free`` and the GPUs of ``running`` partition ``cluster.gpus``; ``queued``
    is in arrival order.
    """

    now_s: float
    reason: Reason
    cluster: Cluster
    free: tuple[Gpu, ...]
    queued: tuple[JobView, ...]
    running: tuple[RunningJob, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Start (or move) ``job_id`` with ``plan`` on exactly ``gpus`` (len == plan.gpus, one type)."""

    job_id: str
    plan: Plan
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer: preemptions happen first, then placements.

    A running job may be re-placed by preempting it and placing it in the same
    decision; the simulator charges its restart cost.  ``solver_timeouts``
    counts solver calls that hit their time limit while deciding.
    """

    placements: tuple[Placement, ...] = ()
    preemptions: tuple[str, ...] = ()
    solver_timeouts: int = 0
    notes: tuple[str, ...] = field(default=(), compare=False)


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy.  ``round_s``: period of extra scheduling rounds (None = events only)."""

    name: str
    round_s: float | None

    def decide(self, snapshot: Snapshot, rng: random.Random) -> Decision:
        """Return the placements and preemptions for ``snapshot``; must not mutate it."""
        ...


def peers_of(gpus: Sequence[Gpu]) -> int:
    """Number of distinct peers a set of GPUs spans."""
    return len({g.peer for g in gpus})


def packed_peers(plan: Plan, max_per_peer: int) -> int:
    """Fewest peers ``plan`` can span when packed on peers of ``max_per_peer`` GPUs of its type."""
    return max(1, -(-plan.gpus // max(1, max_per_peer)))


def tp_inside_peers(plan: Plan, gpus: Sequence[Gpu]) -> bool:
    """True when every tensor-parallel group (consecutive ``tp`` ranks) sits inside one peer."""
    if plan.tp <= 1:
        return True
    return all(len({g.peer for g in gpus[i : i + plan.tp]}) == 1 for i in range(0, len(gpus), plan.tp))


def pick_packed(free_by_peer: dict[str, list[Gpu]], n: int, tp: int = 1) -> list[Gpu] | None:
    """Choose ``n`` GPUs from ``free_by_peer`` on as few peers as possible, tp groups inside a peer.

    Best fit: one peer that holds all ``n`` with the fewest spare GPUs; else the
    fullest peers first.  Returns None when the GPUs (in whole tp groups) are
    not there.  Deterministic: ties broken by peer name.  O(P log P) for P peers.
    """
    return pick_one_peer(free_by_peer, n) or pick_fullest(free_by_peer, n, tp)


def pick_one_peer(free_by_peer: dict[str, list[Gpu]], n: int) -> list[Gpu] | None:
    """``n`` GPUs of the one peer holding them with the fewest spare (ties: peer name); None if none does."""
    best_peer: str | None = None
    best_len = 0
    for peer, gs in free_by_peer.items():
        k = len(gs)
        if k >= n and (best_peer is None or k < best_len or (k == best_len and peer < best_peer)):
            best_peer, best_len = peer, k
    if best_peer is None or n <= 0:
        return None
    return sorted(free_by_peer[best_peer])[:n]


def pick_fullest(free_by_peer: dict[str, list[Gpu]], n: int, tp: int = 1) -> list[Gpu] | None:
    """``n`` GPUs from the fullest peers first (ties: peer name), whole tp groups per peer; None if short."""
    order = sorted([(-len(gs), p) for p, gs in free_by_peer.items() if len(gs) >= tp])
    return take_in_order(free_by_peer, (p for _, p in order), n, tp)


def take_in_order(
    free_by_peer: dict[str, list[Gpu]], peers: Iterable[str], n: int, tp: int = 1
) -> list[Gpu] | None:
    """``n`` GPUs from ``peers`` in that order (lowest indices first), whole tp groups; None if short."""
    chosen: list[Gpu] = []
    for peer in peers:
        gs = sorted(free_by_peer[peer])
        take = min((len(gs) // tp) * tp, n - len(chosen))
        take = (take // tp) * tp
        chosen.extend(gs[:take])
        if len(chosen) == n:
            return chosen
    return None
