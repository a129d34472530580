"""Where queued jobs run: MARP's feasible plans, HAS's ``frenzy`` policy, then a concrete rank layout.

Pure (values in, values out).  The coordinator hands in what peers offer (free, unleased,
owner-protected GPUs per peer, with each peer's Python/torch versions) and the queue.
``schedule`` builds a HAS snapshot (every job's candidate plans: MARP's feasible plans for
``--model`` jobs, one plan per GPU type that holds ``--mem-per-rank`` for declared jobs) and
lets the HAS ``frenzy`` policy order the queue and choose plan, type and GPUs.  A declared
job that no single GPU type can hold right now but a mix of types can (heterogeneous data
parallelism, as a 20 GiB rank on an A100 and another on an A6000) is then placed by the
packing rule of ``place``.  ``place`` alone decides one job: ``None`` = wait,
``InfeasibleError`` = it can never fit the matching peers.

Layout rule: ranks are packed onto as few peers as possible, fastest GPU type first; a
tensor-parallel group never spans peers (DESIGN.md §3); ranks are numbered peer by peer in
the order of the chosen GPUs so each tp group is contiguous.

Each job's work for HAS's shortest-remaining-time order is its declared ``--steps`` (see
``_declared_work`` for jobs that declare none), less the steps it has done (``RunningInfo``:
the built-in trainer reports its progress; a script's is unknown).

Running jobs: the checkpointable ones (the built-in trainer: it checkpoints on SIGTERM and
resumes on any plan) are given to HAS with their GPUs and progress, so HAS may preempt,
shrink, grow or move them (DESIGN.md §8).  ``Schedule.preempt`` lists the running jobs to stop
(the coordinator stops them with a preemption order: checkpoint, stop, requeue), and
``Schedule.pending`` the placements that use GPUs those stops free (or a stopped job's own new,
smaller or bigger, plan): the coordinator keeps those GPUs for them and starts them once the
GPUs are free.  Other running jobs are scripts that cannot be resized or resumed: their GPUs
are simply not free.

What a move costs: the coordinator measures its own restarts (``RestartCosts``: a placement to the
first step, a stop order to the last exit) and HAS is told their running means, seeded with
conservative defaults, instead of ``has.speed``'s 30 s plus a checkpoint read (a loaded loopback pool
paid about 90 s per preemption, not 30).

What a step costs: MARP predicts it; the pool measures it (``RunningInfo.step_s``, the trainer's mean
step) and the measurement corrects every plan of the job, and of new jobs of its model, the same way
(``step_fit``), so HAS compares a job's time here with its time elsewhere on one footing.

At pool scale (issue 18): the coordinator's pass asks ``schedule(plan_inline=False)``, so a model job
whose MARP plans are not in the plan cache waits for a later pass (``Schedule.planning``) while
``warm_plans`` computes them in a worker thread (at admission, or when a pass finds them missing);
what a pass derives per job is kept by job id and reused while its inputs are the same (``_Derived``,
``_view_of``), and an unchanged GPU's report gives the last pass's offer back (``offers_from_reports``).
The values are the same as computed afresh: HAS's decisions do not change.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import random
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from frenzyd.errors import FrenzyError, InfeasibleError
from frenzyd.gpu_types import DEFAULT_UNKNOWN_SPEED, is_mig_type, known_type
from frenzyd.has.speed import JobSpeed
from frenzyd.jobs.model import JobPlan, JobSpec, RankAssignment
from frenzyd.jobs.step_fit import StepFit
from frenzyd.marp.spec import Plan

MIN_STAND_IN_STEP_S = 0.5
"""A stand-in's step (``JobSpec.stand_in`` on simulated GPUs) takes at least this long, so a pool of
simulated GPUs runs at a human pace; HAS is told the same paced time (``frenzyd.jobs.rank_host``)."""

DEFAULT_HEADROOM = 0.10
"""Fraction of a GPU's memory kept free on top of MARP's prediction (plan fits when
``bytes_per_gpu * (1 + headroom) <= free``)."""


@dataclass(frozen=True, slots=True)
class OfferedGpu:
    """One GPU as its peer reports it."""

    uuid: str
    index: int
    type: str
    memory_bytes: int
    free_bytes: int
    simulated: bool
    available: bool
    """Offered by the owner protection and not leased to a job."""


@dataclass(frozen=True, slots=True)
class PeerOffer:
    """A live, authenticated peer and its GPUs."""

    node_id: str
    name: str
    address: str
    python_version: str
    torch_version: str
    gpus: tuple[OfferedGpu, ...]
    trainer_only: bool = False
    """``[launcher] accept = "trainer-only"``: the peer runs no script job, only the built-in trainer."""
    only_jobs_of: str | None = None
    """The peer cannot switch users (no slot accounts), so it runs only this user's jobs (its
    report's ``launcher.only_jobs_of``); None: anyone's."""


@dataclass(frozen=True, slots=True)
class Placement:
    """A plan (status JSON ``plan``, its ``backend`` set) and the ranks that realise it."""

    plan: JobPlan
    ranks: tuple[RankAssignment, ...]

    @property
    def backend(self) -> str:
        return self.plan.backend or "gloo"


def offers_from_reports(
    peers: Mapping[str, Mapping[str, Any]], reserved: Container[str] = ()
) -> list[PeerOffer]:
    """The live peers' heartbeat reports as offers; GPUs in ``reserved`` (placements in flight) and
    malformed entries are not available.

    A GPU (and a peer) whose reported fields are what they were on the last call gets the same
    ``OfferedGpu`` (``PeerOffer``) object back instead of a new one (``_OFFERED``, ``_OFFERS``): in a
    busy pool most GPUs are leased and report the same figures heartbeat after heartbeat."""
    offers = []
    for nid, rep in sorted(peers.items()):
        gpus = []
        for g in rep.get("gpus") or ():
            try:
                gpus.append(_offered_gpu(g, reserved))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
        la = rep.get("launcher")
        only = trainer_only = None
        if la is not None and isinstance(la, Mapping):  # (most reports: no launcher section)
            if _slots_full(la):  # every slot account busy: a launch there would be refused
                gpus = [replace(g, available=False) for g in gpus]
            only, trainer_only = la.get("only_jobs_of"), la.get("accept") == "trainer-only"
        fields = (nid, str(rep.get("name", nid[:12])), str(rep.get("address", "")),
                  str(rep.get("python", "")), str(rep.get("torch", "")), tuple(gpus), bool(trainer_only),
                  only if isinstance(only, str) and only else None)
        kept = _OFFERS.get(nid)
        if kept is not None and kept[0] == fields:  # GPUs compared by identity first: cheap
            offers.append(kept[1])
            continue
        offer = PeerOffer(*fields[:6], trainer_only=fields[6], only_jobs_of=fields[7])
        if len(_OFFERS) >= OFFERS_KEPT:
            _OFFERS.clear()
        _OFFERS[nid] = (fields, offer)
        offers.append(offer)
    return offers


OFFERS_KEPT = 16384
"""Peers (``_OFFERS``) and 4x as many GPUs (``_OFFERED``) whose last offer is kept for reuse."""
_OFFERS: dict[str, tuple[tuple[Any, ...], PeerOffer]] = {}
_OFFERED: dict[str, tuple[tuple[Any, ...], OfferedGpu]] = {}


def _offered_gpu(g: Mapping[str, Any], reserved: Container[str]) -> OfferedGpu:
    """One reported GPU as an offer (the last call's object when every field is the same);
    ``KeyError``/``TypeError``/``ValueError``/``AttributeError`` for a malformed entry."""
    uuid, index, gtype, mem, free = g["uuid"], g["index"], g["type"], g["memory_bytes"], g["free_bytes"]
    simulated, offered, leased = g.get("simulated"), g.get("offered"), g.get("leased_to")
    exact = type(uuid) is str and type(index) is int and type(gtype) is str and type(mem) is int \
        and type(free) is int  # equal values of other types may convert differently: not kept
    if exact:
        available = bool(offered) and leased is None and uuid not in reserved
        raw = (index, gtype, mem, free, bool(simulated), available)
        kept = _OFFERED.get(uuid)
        if kept is not None and kept[0] == raw:
            return kept[1]
        og = OfferedGpu(uuid, index, gtype, mem, free, raw[4], available)
        if len(_OFFERED) >= 4 * OFFERS_KEPT:
            _OFFERED.clear()
        _OFFERED[uuid] = (raw, og)
        return og
    return OfferedGpu(
        uuid=str(uuid), index=int(index), type=str(gtype), memory_bytes=int(mem), free_bytes=int(free),
        simulated=bool(simulated),
        available=bool(offered) and leased is None and str(uuid) not in reserved,
    )


def _slots_full(launcher: Any) -> bool:
    """A report's ``launcher`` says it runs ranks as slot accounts and every one is busy."""
    if not isinstance(launcher, Mapping) or launcher.get("runs_as") != "slots":
        return False
    total, busy = launcher.get("slots"), launcher.get("slots_busy")
    return isinstance(total, int) and isinstance(busy, int) and busy >= total


@dataclass
class SeenInventory:
    """The most GPUs of each kind this node has seen in the pool at once, remembered across restarts:
    what the submitter asks "could this job ever be placed here?" against (a job whose fitting peers
    are rebooting must wait, not fail)."""

    kinds: dict[tuple[str, str, str], tuple[int, int, int]] = field(default_factory=dict)
    """(GPU type, python major.minor, torch) -> (memory bytes, most on one peer, most in the pool)."""

    def observe(self, offers: Sequence[PeerOffer]) -> bool:
        """Fold in the pool as it is now; True when something grew."""
        per_peer: dict[tuple[str, str, str], tuple[int, int]] = {}
        total: dict[tuple[str, str, str], int] = {}
        for p in offers:
            counts: dict[tuple[str, str, str], tuple[int, int]] = {}
            for g in p.gpus:
                k = (g.type, _py_minor(p.python_version), p.torch_version)
                mem, n = counts.get(k, (0, 0))
                counts[k] = (max(mem, g.memory_bytes), n + 1)
            for k, (mem, n) in counts.items():
                old_mem, old_n = per_peer.get(k, (0, 0))
                per_peer[k] = (max(mem, old_mem), max(n, old_n))
                total[k] = total.get(k, 0) + n
        changed = False
        for k, (mem, n) in per_peer.items():
            old = self.kinds.get(k, (0, 0, 0))
            new = (max(old[0], mem), max(old[1], n), max(old[2], total[k]))
            if new != old:
                self.kinds[k] = new
                changed = True
        return changed

    def offers(self) -> list[PeerOffer]:
        """A pool holding everything ever seen at once, every GPU free."""
        out = []
        for (gtype, py, torch), (mem, per_peer, total) in sorted(self.kinds.items()):
            left, i = total, 0
            while left > 0:
                n = min(per_peer, left)
                gpus = tuple(OfferedGpu(f"seen-{gtype}-{i}-{j}", j, gtype, mem, mem, simulated=True,
                                        available=True) for j in range(n))
                out.append(PeerOffer(f"seen-{gtype}-{py}-{torch}-{i}", f"seen-{i}", "", py, torch, gpus))
                left -= n
                i += 1
        return out

    def describe(self) -> str:
        return ", ".join(f"{t} x{total} (python {py}, torch {torch})"
                         for (t, py, torch), (_, _, total) in sorted(self.kinds.items())) or "no GPUs"

    def to_dict(self) -> dict[str, Any]:
        return {"kinds": [[t, py, torch, mem, pp, tot]
                          for (t, py, torch), (mem, pp, tot) in sorted(self.kinds.items())]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SeenInventory:
        kinds = {}
        for row in d.get("kinds") or ():
            t, py, torch, mem, pp, tot = row
            kinds[(str(t), str(py), str(torch))] = (int(mem), int(pp), int(tot))
        return cls(kinds)


def versions_match(spec: JobSpec, peer: PeerOffer) -> bool:
    """Ranks run in the peer's Python environment: same Python major.minor and same torch; and a
    script job never goes to a peer that runs only the built-in trainer (``trainer_only``)."""
    return _py_minor(spec.python_version) == _py_minor(peer.python_version) and (
        spec.torch_version == peer.torch_version
    ) and (spec.trainer or not peer.trainer_only)


@functools.lru_cache(maxsize=256)
def _py_minor(v: str) -> str:
    return ".".join(v.split(".")[:2])


_is_mig = functools.lru_cache(maxsize=256)(is_mig_type)
"""``is_mig_type`` (a regular expression) remembered per type name: asked per GPU per placement."""


def _speed(gpu_type: str) -> float:
    info = known_type(gpu_type)
    return info.speed if info is not None else DEFAULT_UNKNOWN_SPEED


def place(
    spec: JobSpec, offers: Sequence[PeerOffer], *, headroom: float = DEFAULT_HEADROOM
) -> Placement | None:
    """Place ``spec`` on the available GPUs of version-matching peers.

    Returns ``None`` when it would fit the matching peers' GPUs but not the ones free now;
    raises ``InfeasibleError`` (with what to change) when it can never fit.
    """
    matching = [p for p in offers if versions_match(spec, p)]
    if not matching:
        seen = sorted({f"python {_py_minor(p.python_version)}/torch {p.torch_version}" for p in offers})
        raise InfeasibleError(
            f"no peer matches this job's python {_py_minor(spec.python_version)} / torch "
            f"{spec.torch_version} (peers offer: {', '.join(seen) or 'nothing'}); "
            "submit from a peer with the pool's Python environment"
            + ("; peers that accept only built-in trainer jobs run no script" if not spec.trainer
               and any(p.trainer_only for p in offers) else "")
        )
    try:
        if spec.model is not None or spec.model_config is not None:
            return _place_model(spec, matching, headroom)
        return _place_ranks(spec, matching)
    except InfeasibleError as exc:
        skipped = [p for p in offers if p.gpus and not versions_match(spec, p)]
        if not skipped:
            raise
        seen = sorted({f"python {_py_minor(p.python_version)}/torch {p.torch_version}" for p in skipped})
        raise InfeasibleError(
            f"{exc} ({len(skipped)} peer(s) with GPUs were skipped because they run {', '.join(seen)}, "
            f"not this job's python {_py_minor(spec.python_version)}/torch {spec.torch_version})"
        ) from None


def _place_ranks(spec: JobSpec, offers: Sequence[PeerOffer]) -> Placement | None:
    assert spec.nproc is not None
    assert spec.mem_per_rank is not None
    need, mem = spec.nproc, spec.mem_per_rank

    def fits(g: OfferedGpu) -> bool:  # MIG instances only for one-rank jobs (see _pools_of)
        return g.memory_bytes >= mem and (need == 1 or not _is_mig(g.type))

    ever = sum(1 for p in offers for g in p.gpus if fits(g))
    if ever < need:
        mig = sum(1 for p in offers for g in p.gpus if g.memory_bytes >= mem and _is_mig(g.type))
        also = (f" ({mig} MIG instance(s) are left out: a MIG instance runs one-rank jobs only)"
                if mig and need > 1 else "")
        raise InfeasibleError(
            f"the job needs {need} GPUs with {mem / 2**30:.2f} GiB each; matching peers have only "
            f"{ever} such GPUs in total{also}: lower --nproc or --mem-per-rank"
        )
    groups = {p.node_id: [g for g in p.gpus if g.available and g.free_bytes >= mem and fits(g)]
              for p in offers}
    chosen = _pack(offers, groups, need, group=1)
    if chosen is None:
        return None
    ranks = _number(chosen)
    gpus = [g for _, gs in chosen for g in gs]
    types = sorted({g.type for g in gpus})
    plan = JobPlan(gpu_type=types[0] if len(types) == 1 else "+".join(types), gpus=need, dp=need, tp=1,
                   pp=1, zero=0, bytes_per_gpu=mem, source="declared", peers=len(chosen),
                   backend=_backend(gpus))
    return Placement(plan, ranks)


def _place_model(spec: JobSpec, offers: Sequence[PeerOffer], headroom: float) -> Placement | None:
    plans_all = marp_plans(spec, offers, headroom=headroom, only_available=False)
    if not plans_all:
        if spec.trainer:
            raise InfeasibleError(
                "MARP finds no plan the built-in trainer runs for this model and batch shape that fits "
                "the matching peers' GPUs, even when idle: use a smaller --seq-len, --recompute full, "
                "--dtype bf16, a global batch with more divisors, or add GPUs to the pool"
            )
        raise InfeasibleError(
            "MARP finds no plan of this model and batch shape that fits the matching peers' GPUs, "
            "even when idle: use a smaller --micro-batch or --seq-len, --recompute full, or --zero 3"
        )
    for plan in marp_plans(spec, offers, headroom=headroom, only_available=True):
        per = int(plan.bytes_per_gpu * (1 + headroom))
        groups = {
            p.node_id: [
                g for g in p.gpus if g.available and g.type == plan.gpu_type and g.free_bytes >= per
            ]
            for p in offers
        }
        chosen = _pack(offers, groups, plan.gpus, group=plan.tp)
        if chosen is None:
            continue
        gpus = [g for _, gs in chosen for g in gs]
        return Placement(replace(plan, peers=len(chosen), backend=_backend(gpus)), _number(chosen))
    return None


def marp_plans(
    spec: JobSpec, offers: Sequence[PeerOffer], *, headroom: float, only_available: bool
) -> Sequence[JobPlan]:
    """MARP's feasible plans (best first, ``source="marp"``) over the offered GPU types; for a
    built-in trainer job only the plans the trainer runs (``frenzyd.marp.combos``).  The same tuple
    object for the same answer (its conversion is kept by the answer's identity: cached answers
    are shared objects)."""
    answer = _marp_answer(spec, offers, headroom=headroom, only_available=only_available, compute=True)
    assert answer is not None
    return answer


def _marp_answer(
    spec: JobSpec, offers: Sequence[PeerOffer], *, headroom: float, only_available: bool, compute: bool,
    pools: list[Any] | None = None,
) -> tuple[JobPlan, ...] | None:
    """:func:`marp_plans`; with ``compute=False``, None when the plan cache cannot answer without
    enumerating plans (``PlanCache.plans``' ``compute``).  ``pools``: ``offers``' pools, known."""
    from frenzyd.marp.plan_cache import default_cache

    model = job_model(spec)
    if pools is None:
        pools = _pools_of(offers, only_available)
    if not pools:
        return ()
    answer = default_cache().plans(model, _marp_setup(spec), pools, headroom=headroom,
                                   trainer_only=spec.trainer, compute=compute)
    if answer is None:
        return None
    hit = _CONVERTED.get(id(answer))
    if hit is not None and hit[0] is answer:
        return hit[1]
    out = tuple(
        JobPlan(gpu_type=pl.gpu_type, gpus=pl.gpus, dp=pl.dp, tp=pl.tp, pp=pl.pp, zero=pl.zero,
                micro_batch=pl.micro_batch, grad_accum=pl.grad_accum, bytes_per_gpu=pl.bytes_per_gpu,
                gpu_memory_bytes=pl.gpu_memory_bytes, step_time_s=pl.step_time_s, source="marp")
        for pl in answer
    )
    _CONVERTED[id(answer)] = (answer, out)
    while len(_CONVERTED) > 4096:
        del _CONVERTED[next(iter(_CONVERTED))]
    return out


def warm_plans(spec: JobSpec, offers: Sequence[PeerOffer], *, headroom: float = DEFAULT_HEADROOM) -> bool:
    """Enumerate (into the process's plan cache) the MARP plans a pass will ask for ``spec`` over
    ``offers``: what the coordinator runs off its event loop and off the pass when it admits a job,
    so a pass finds them cached (``schedule``'s ``plan_inline=False``).  True when something was
    computed; False when it was cached already, or the job has no model (nothing to plan).
    ``FrenzyError`` for a job MARP cannot plan (an unknown model, an impossible shape): the pass
    reports it as it does now.  Touches only the plan cache (safe beside a pass in another thread).
    ``offers`` is read as a value that does not change (a pass's list: its pools are kept by identity
    for the next admission over the same list).

    Each type's plans are computed for ``warm_slack`` more GPUs than the pool has now: the plan of n
    GPUs does not depend on how many more there are, so when members join (a larger count of a type)
    the cache still answers the pass without computing, and a queued job does not wait a pass for its
    plans each time the pool grows by a few workstations (``frenzyd.marp.plan_cache``)."""
    from frenzyd.marp.plan_cache import default_cache

    if not _is_model(spec):
        return False
    vk = (_py_minor(spec.python_version), spec.torch_version, spec.trainer)
    last = _WARM_POOLS.get(vk)
    if last is not None and last[0] is offers:  # the same offers as the last admission: their pools
        pools = last[1]
    else:
        pools = _compute_pools([p for p in offers if versions_match(spec, p)], only_available=False)
        _WARM_POOLS[vk] = (offers, pools)  # one atomic store (holds ``offers``: its id is not reused)
    if not pools:
        return False
    cache, model, setup = default_cache(), job_model(spec), _marp_setup(spec)
    if cache.plans(model, setup, pools, headroom=headroom, trainer_only=spec.trainer,
                   compute=False) is not None:
        return False
    roomy = [p if _is_mig(p.gpu_type) else replace(p, count=p.count + warm_slack(p.count))
             for p in pools]  # (a MIG type is planned for one GPU only, however many there are)
    cache.plans(model, setup, roomy, headroom=headroom, trainer_only=spec.trainer)
    # The answer for the pool as it is, assembled from those entries here, not in the next pass.
    cache.plans(model, setup, pools, headroom=headroom, trainer_only=spec.trainer, compute=False)
    return True


def warm_slack(count: int) -> int:
    """GPUs past a type's count that ``warm_plans`` plans for: an eighth more, at least 8."""
    return max(8, count // 8)


_WARM_POOLS: dict[tuple[str, str, bool], tuple[Sequence[PeerOffer], list[Any]]] = {}
"""Per version group: the last offers ``warm_plans`` planned over and their pools (admissions between
two passes plan over the same offers)."""


def _marp_setup(spec: JobSpec) -> Any:
    from frenzyd.marp.spec import TrainingSetup

    assert spec.seq_len is not None
    return TrainingSetup(
        seq_len=spec.seq_len, micro_batch=spec.micro_batch, dtype=spec.dtype,  # type: ignore[arg-type]
        global_batch=spec.global_batch, optimizer=spec.optimizer,  # type: ignore[arg-type]
        recompute=spec.recompute, zero=spec.zero,  # type: ignore[arg-type]
    )


_CONVERTED: dict[int, tuple[Any, tuple[JobPlan, ...]]] = {}
_HAS_PLANS: dict[int, tuple[Any, tuple[Plan, ...]]] = {}
_POOLS: dict[bool, tuple[Sequence[PeerOffer], list[Any]]] = {}


def _pools_of(offers: Sequence[PeerOffer], only_available: bool) -> list[Any]:
    """Per GPU type: count, smallest memory, most on one peer (kept for the last offers list seen)."""
    hit = _POOLS.get(only_available)
    if hit is not None and hit[0] is offers:
        return hit[1]
    pools = _compute_pools(offers, only_available=only_available)
    _POOLS[only_available] = (offers, pools)
    return pools


def _compute_pools(offers: Sequence[PeerOffer], *, only_available: bool) -> list[Any]:
    from frenzyd.marp.spec import GpuPool

    by_type: dict[str, list[tuple[int, int]]] = {}
    for p in offers:
        counts: dict[str, list[int]] = {}
        for g in p.gpus:
            if only_available and not g.available:
                continue
            counts.setdefault(g.type, []).append(g.free_bytes if only_available else g.memory_bytes)
        for t, mems in counts.items():
            by_type.setdefault(t, []).append((len(mems), min(mems)))
    # A MIG instance runs one rank alone (a process sees one instance; NCCL cannot join instances
    # of one GPU), so MARP plans a MIG type for one-GPU jobs only.
    return [
        GpuPool(gpu_type=t, count=1 if is_mig_type(t) else sum(c for c, _ in rows),
                memory_bytes=min(m for _, m in rows), speed=_speed(t),
                gpus_per_node=1 if is_mig_type(t) else max(c for c, _ in rows))
        for t, rows in sorted(by_type.items())
    ]


def _pack(
    offers: Sequence[PeerOffer], groups: dict[str, list[OfferedGpu]], need: int, *, group: int
) -> list[tuple[PeerOffer, list[OfferedGpu]]] | None:
    """Take ``need`` GPUs in whole groups of ``group`` from as few peers as possible, fastest first."""
    def key(p: PeerOffer) -> tuple[int, float, str]:
        gs = groups[p.node_id]
        usable = len(gs) - len(gs) % group
        speed = max((_speed(g.type) for g in gs), default=0.0)
        return (-min(usable, need), -speed, p.node_id)

    chosen: list[tuple[PeerOffer, list[OfferedGpu]]] = []
    left = need
    usable = [p for p in offers if len(groups[p.node_id]) >= group]  # the others take nothing
    for p in sorted(usable, key=key):
        gs = sorted(groups[p.node_id], key=lambda g: (-_speed(g.type), g.index))
        take = min(left, len(gs) - len(gs) % group)
        if take <= 0:
            continue
        chosen.append((p, sorted(gs[:take], key=lambda g: g.index)))
        left -= take
        if left == 0:
            return chosen
    return None


def _number(chosen: list[tuple[PeerOffer, list[OfferedGpu]]]) -> tuple[RankAssignment, ...]:
    ranks: list[RankAssignment] = []
    for peer, gpus in chosen:
        for local, g in enumerate(gpus):
            ranks.append(RankAssignment(len(ranks), peer.node_id, peer.name, g.uuid, g.index, local))
    return tuple(ranks)


def _is_model(spec: JobSpec) -> bool:
    return spec.model is not None or spec.model_config is not None


def _backend(gpus: Sequence[OfferedGpu]) -> str:
    """nccl needs real CUDA devices on every rank; any simulated GPU means gloo on CPU."""
    return "gloo" if any(g.simulated for g in gpus) else "nccl"


# --- the HAS policy over the whole queue ------------------------------------------------------

ASSUMED_SEQ_TOKENS = 2048
"""Declared jobs say nothing about their work: their speed model assumes one 2048-token sample
per rank per step and ``mem_per_rank / 16`` parameters (AdamW in fp32), only to rank GPU types."""


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A queued job as the scheduler sees it."""

    job_id: str
    spec: JobSpec
    arrival_s: float
    done_steps: int = 0
    """Steps its checkpoint keeps (a preempted trainer job), from its submitter's progress."""
    owner: str | None = None
    """The submitting user (``JobRecord.owner``): a peer that runs only its own user's jobs takes
    no one else's."""
    fit: StepFit | None = None
    """How the pool's measurements correct MARP's step times for it (``step_fit``): its own, from an
    earlier attempt; None: its model's (``schedule``'s ``model_fits``), else MARP's figures."""


@dataclass(frozen=True, slots=True)
class RunningInfo:
    """A running checkpointable job as the scheduler sees it: its plan, its GPUs in rank order as
    (peer, GPU index), when its attempt started (the caller's clock), the steps it has done and when
    its first step came (``ready_s``: inf while it still starts, None when not known; see
    ``has.interface.RunningJob.ready_s``), and the seconds a step takes there as measured
    (``step_s``: the trainer's mean over its last steps of this attempt; None until known), which
    corrects MARP's step times of all its plans (``step_fit``)."""

    job_id: str
    spec: JobSpec
    plan: JobPlan
    gpus: tuple[tuple[str, int], ...]
    started_s: float
    done_steps: int = 0
    owner: str | None = None
    ready_s: float | None = None
    step_s: float | None = None
    fit: StepFit | None = None
    """Its own fit from an earlier attempt (else its model's), until this attempt's ``step_s`` is known."""


DEFAULT_START_S = 60.0
"""Seconds from a placement to the first step of the new attempt, until the pool has measured its own:
a loopback pool of stand-ins on a machine loaded by other work took 27.7 s to start and 29.7 s more to
fetch and load a checkpoint (2026-12-01; the same pool quiet: 5.8 s and nothing,
``sim.preemption.LOOPBACK_STAND_IN``).  High on purpose: a pool that has measured nothing moves jobs
less, not more."""
DEFAULT_STOP_S = 36.0
"""Seconds from a stop order until every rank of the attempt has exited, until measured (the same run's
35.7 s handover: checkpoint write, its copy to the submitter, the exit report)."""
RESTART_WEIGHT = 0.3
"""Weight of each new measurement in the running estimates (an exponentially weighted mean seeded with
the defaults: about five measurements replace the default)."""


@dataclass
class RestartCosts:
    """What re-placing a running job costs in this pool, from the coordinator's own measurements:
    ``start_s`` (a placement to the new attempt's first step: lease, launch, payload and checkpoint
    fetch, process start, rendezvous, checkpoint load) and ``stop_s`` (a stop order to the last rank's
    exit report: the step in flight, the checkpoint write and its copy to the submitter).  Each is an
    exponentially weighted mean (``weight`` per measurement) seeded with a conservative default.
    HAS is told ``start_s + stop_s`` as every job's restart cost (``PoolSpeed``).  A value, no clock:
    the caller measures.

    A measurement names the job's model (``restart_key``) as well: ``models`` keeps one estimate per
    model, seeded with the pool's, and ``for_model`` gives a model's own figure for each part it has
    measured (a 7 B checkpoint is written and loaded far slower than gpt2's), the pool's otherwise."""

    start_s: float = DEFAULT_START_S
    stop_s: float = DEFAULT_STOP_S
    weight: float = RESTART_WEIGHT
    starts: int = 0
    """Starts measured so far."""
    stops: int = 0
    """Stops measured so far."""
    models: dict[str, RestartCosts] = field(default_factory=dict)
    """``restart_key`` -> that model's own estimates (never nested further)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError("weight must be within [0, 1] (0: keep the defaults)")
        times = (self.start_s, self.stop_s)
        if not all(math.isfinite(t) and t >= 0 for t in times):
            raise ValueError("start_s and stop_s must be finite, non-negative seconds")

    @property
    def restart_s(self) -> float:
        """Seconds HAS charges a re-placement of a running job: its stop and the new start."""
        return self.start_s + self.stop_s

    def _model(self, model: str | None) -> RestartCosts | None:
        if model is None:
            return None
        own = self.models.get(model)
        if own is None:
            while len(self.models) >= MAX_RESTART_MODELS:  # the oldest model's figures go first
                del self.models[next(iter(self.models))]
            own = self.models[model] = RestartCosts(self.start_s, self.stop_s, self.weight)
        return own

    def for_model(self, model: str | None) -> tuple[float, float]:
        """(start_s, stop_s) HAS is told for a job of ``model``: its own where measured."""
        own = self.models.get(model) if model is not None else None
        if own is None:
            return self.start_s, self.stop_s
        return (own.start_s if own.starts else self.start_s), (own.stop_s if own.stops else self.stop_s)

    def observe_start(self, seconds: float, model: str | None = None) -> bool:
        """Fold in one measured start (of a job of ``model``); False (ignored) when it is not a
        finite, non-negative time."""
        if not math.isfinite(seconds) or seconds < 0:
            return False
        if (own := self._model(model)) is not None:
            own.observe_start(seconds)
        self.start_s += self.weight * (seconds - self.start_s)
        self.starts += 1
        return True

    def observe_stop(self, seconds: float, model: str | None = None) -> bool:
        """Fold in one measured stop (of a job of ``model``); False (ignored) when it is not a
        finite, non-negative time."""
        if not math.isfinite(seconds) or seconds < 0:
            return False
        if (own := self._model(model)) is not None:
            own.observe_stop(seconds)
        self.stop_s += self.weight * (seconds - self.stop_s)
        self.stops += 1
        return True

    def to_dict(self) -> dict[str, Any]:
        """The status/metrics view: the estimates and how many measurements they hold."""
        out: dict[str, Any] = {
            "restart_s": round(self.restart_s, 3), "start_s": round(self.start_s, 3),
            "stop_s": round(self.stop_s, 3), "starts_measured": self.starts, "stops_measured": self.stops}
        if self.models:
            out["models"] = {m: {k: v for k, v in own.to_dict().items() if k != "models"}
                             for m, own in sorted(self.models.items())}
        return out


MAX_RESTART_MODELS = 64
"""Models whose restart costs a coordinator keeps apart (the rest use the pool's)."""


def restart_key(spec: JobSpec) -> str | None:
    """What a job's restart cost is kept under: its model (preset name, or the config's hash), a
    stand-in apart from the real model; None for a job without a model (HAS never moves it)."""
    if spec.model is not None:
        key = str(spec.model)
    elif spec.model_config is not None:
        blob = json.dumps(spec.model_config, sort_keys=True, default=str).encode()
        key = f"config:{hashlib.sha256(blob).hexdigest()[:12]}"
    else:
        return None
    return f"{key} (stand-in)" if spec.stand_in else key


@dataclass(frozen=True, slots=True)
class PoolSpeed(JobSpeed):
    """A job's speed model as the live pool gives it to HAS.  A plan's step time is the plan's own
    (MARP's prediction, paced for a stand-in), times ``has.speed``'s cost of spreading it over more
    peers: HAS re-costs a placement (grow, upgrade, a move, a shrink) on the figures its plans carry.
    ``has.speed`` alone put a gpt2-medium step on two T4s at 1.54 s where MARP says 0.82 s and the
    running job takes 1.44 s on one, so a pool never grew it.  A restart costs ``restart_s``: what
    the pool measured (``RestartCosts.start_s``), or ``has.speed``'s when it measures nothing."""

    restart_s: float = 0.0

    @property
    def restart_cost_s(self) -> float:
        return self.restart_s

    def step_time_s(self, plan: Plan, gpu_speed: float, peers: int) -> float:
        own = plan.step_time_s
        if own <= 0:  # a declared job's plan: the model's figure
            return JobSpeed.step_time_s(self, plan, gpu_speed, peers)
        if peers <= 1:
            return own
        return own * JobSpeed.step_time_s(self, plan, gpu_speed, peers) / JobSpeed.step_time_s(
            self, plan, gpu_speed, 1)


@dataclass(frozen=True, slots=True)
class Schedule:
    """One scheduling pass: jobs to start now, jobs that can never run (with the reason), running
    jobs to preempt (with the reason) and placements waiting for the GPUs those stops free."""

    start: tuple[tuple[str, Placement], ...]
    infeasible: tuple[tuple[str, str], ...]
    policy: str
    preempt: tuple[tuple[str, str], ...] = ()
    pending: tuple[tuple[str, Placement], ...] = ()
    planning: tuple[str, ...] = ()
    """Jobs left out of this pass because MARP's plans for them are not cached yet (``schedule``'s
    ``plan_inline=False``): the caller computes them off the pass (``warm_plans``) and the jobs
    are placed on a later pass."""
    fits: tuple[tuple[str, StepFit], ...] = ()
    """Running jobs whose measured step this pass turned into a fit of their plans (``step_fit``):
    the caller keeps them for the jobs' next attempts and for new jobs of their models."""


_TYPE_MEM: dict[int, tuple[Sequence[PeerOffer], dict[str, int]]] = {}


def _declared_plans(spec: JobSpec, offers: Sequence[PeerOffer]) -> list[JobPlan]:
    assert spec.nproc is not None
    assert spec.mem_per_rank is not None
    hit = _TYPE_MEM.get(0)
    if hit is not None and hit[0] is offers:
        mem = hit[1]
    else:
        mem = {}
        for p in offers:
            for g in p.gpus:
                mem[g.type] = max(mem.get(g.type, 0), g.memory_bytes)
        _TYPE_MEM[0] = (offers, mem)
    return [
        JobPlan(gpu_type=t, gpus=spec.nproc, dp=spec.nproc, tp=1, pp=1, zero=0, micro_batch=1, grad_accum=1,
                bytes_per_gpu=spec.mem_per_rank, gpu_memory_bytes=m, source="declared")
        for t, m in sorted(mem.items())
        if m >= spec.mem_per_rank and (spec.nproc == 1 or not is_mig_type(t))  # MIG: one rank only
    ]


def _has_plan(p: JobPlan) -> Plan:
    """The HAS plan of a candidate (declared plans carry no step time: 0.0 until the speed model's)."""
    return Plan(gpu_type=p.gpu_type, gpus=p.gpus, dp=p.dp, tp=p.tp, pp=p.pp, zero=p.zero,
                micro_batch=p.micro_batch or 1, grad_accum=p.grad_accum or 1, bytes_per_gpu=p.bytes_per_gpu,
                gpu_memory_bytes=p.gpu_memory_bytes or 0, step_time_s=p.step_time_s or 0.0)


def _without(p: PeerOffer, taken: set[str]) -> PeerOffer:
    """``p`` with the GPUs in ``taken`` marked unavailable (``p`` itself when it has none of them)."""
    if not any(g.uuid in taken for g in p.gpus):
        return p
    gpus = tuple(g if g.uuid not in taken else replace(g, available=False) for g in p.gpus)
    return replace(p, gpus=gpus)


def _declared_work(
    jobs: Sequence[tuple[str, _Derived]], queued: int, steps: Mapping[str, int | None],
    done: Mapping[str, int],
) -> list[tuple[float, float]]:
    """Each job's work for HAS, (total steps, remaining steps): its declared ``--steps`` less the
    ``done`` steps a checkpoint keeps (at least one step is left); a job that declares none counts as
    no shorter than the longest declared job in the queue (the first ``queued`` of ``jobs``, on its
    fastest plan), so declaring work never makes a job wait longer, and jobs that declare none keep
    their arrival order (HAS's aging)."""
    known = [float(k) * d.fastest for j, d in jobs[:queued] if (k := steps.get(j)) and d.fastest > 0]
    longest = max(known, default=1.0)
    out = []
    for j, d in jobs:
        declared = steps.get(j)
        n = float(declared) if declared else (longest / d.fastest if d.fastest > 0 else 1.0)
        out.append((n, max(1.0, n - done.get(j, 0)) if declared else n))
    return out


def _running_step_s(r: RunningInfo) -> float | None:
    """MARP's step of a running job's plan (paced for a stand-in); None for a declared job."""
    step = r.plan.step_time_s
    if not step:
        return None
    return max(MIN_STAND_IN_STEP_S, step) if r.spec.stand_in and r.plan.backend == "gloo" else step


def _fit_for(own: StepFit | None, d: _Derived, model_fits: Mapping[str, StepFit] | None) -> StepFit | None:
    """A job's step fit: its own, else its model's (``schedule``'s ``model_fits``), else None."""
    if own is not None or not model_fits or d.restart_key is None:
        return own
    return model_fits.get(d.restart_key)


def _fitted_step(r: RunningInfo, fit: StepFit | None) -> float | None:
    """A running job's step as HAS is told it before this attempt is measured: MARP's (paced for a
    stand-in), corrected by the job's earlier fit."""
    step = _running_step_s(r)
    return step if step is None or fit is None else fit.step_s(step)


KNOWN_JOBS = 16384
"""Jobs whose derived candidates and HAS view are kept between passes (``_KNOWN``, ``_VIEWS``)."""


@dataclass(frozen=True, slots=True)
class _Derived:
    """What a pass derives for one job from its spec and its version group's GPUs: HAS's candidate
    plans, the candidates as JobPlans, the speed model's inputs.  Kept per job id between passes
    (``_KNOWN``) and reused while the spec, the group's key (``_group_key``: everything of the
    group's GPUs this depends on) and the headroom are the same, so an unchanged job costs a pass a
    lookup, not a plan-cache query and a conversion."""

    spec: JobSpec
    group: object
    headroom: float
    plans: tuple[Plan, ...]
    cands: tuple[JobPlan, ...]
    params: int
    flops: float
    restart_key: str | None
    fastest: float
    """The fastest packed step time of ``plans`` (0.0: none)."""
    default_restart_s: float
    """``has.speed``'s restart cost of the job (when the pool has measured none)."""


_KNOWN: dict[str, _Derived] = {}
_VIEWS: dict[str, tuple[tuple[Any, ...], Any]] = {}
_GROUPS: dict[tuple[str, str], tuple[Any, ...]] = {}


class _NotPlanned(Exception):  # a signal inside the pass, never raised out of it
    """A model job's MARP plans are not cached and the pass may not compute them."""


def forget_jobs() -> None:
    """Drop what passes kept per job (``_Derived`` and HAS views): the state of a fresh coordinator
    process (benchmarks measure a cold pass with it; never needed for correctness)."""
    _KNOWN.clear()
    _VIEWS.clear()
    _GROUPS.clear()


def _keep(cache: dict[str, Any], key: str, value: Any) -> None:
    """``cache[key] = value``, the oldest entries dropped past ``KNOWN_JOBS`` (a race with another
    thread's pass costs a recomputation, never a wrong answer: every entry carries its inputs)."""
    cache[key] = value
    while len(cache) > KNOWN_JOBS:
        try:
            del cache[next(iter(cache))]
        except (KeyError, RuntimeError, StopIteration):
            break


def _group_key(vk: tuple[str, str], matching: Sequence[PeerOffer]) -> tuple[Any, ...]:
    """What a job's candidates depend on in its version group's GPUs: per type, the count, the
    smallest and largest memory, the most on one peer, whether any is simulated.  The same object
    as the last pass's when equal to it, so a job's kept ``_Derived`` is checked by identity."""
    per: dict[str, list[Any]] = {}
    for p in matching:
        gs = p.gpus
        if not gs:
            continue
        t = gs[0].type
        if all(g.type == t for g in gs):  # a workstation of one GPU type: the common case, in builtins
            mem = [g.memory_bytes for g in gs]
            lo, hi, n, sim = min(mem), max(mem), len(gs), any(g.simulated for g in gs)
            row = per.get(t)
            if row is None:
                per[t] = [n, lo, hi, n, sim]
            else:
                row[:] = [row[0] + n, min(row[1], lo), max(row[2], hi), max(row[3], n), row[4] or sim]
            continue
        mine: dict[str, int] = {}
        for g in gs:
            row = per.get(g.type)
            if row is None:
                per[g.type] = [1, g.memory_bytes, g.memory_bytes, 0, g.simulated]
            else:
                row[0] += 1
                if g.memory_bytes < row[1]:
                    row[1] = g.memory_bytes
                elif g.memory_bytes > row[2]:
                    row[2] = g.memory_bytes
                if g.simulated:
                    row[4] = True
            mine[g.type] = mine.get(g.type, 0) + 1
        for t, n in mine.items():
            per[t][3] = max(per[t][3], n)
    key = tuple((t, *row) for t, row in sorted(per.items()))
    old = _GROUPS.get(vk)
    if old is not None and old == key:
        return old
    _GROUPS[vk] = key
    return key


_GROUP_POOLS: dict[int, tuple[object, list[Any]]] = {}


def _group_pools(group: Any) -> list[Any]:
    """``_pools_of(matching, False)`` of the group whose ``_group_key`` is ``group``, from the key
    alone (per type: count, smallest memory, most on one peer; a MIG type one GPU)."""
    from frenzyd.marp.spec import GpuPool

    hit = _GROUP_POOLS.get(id(group))
    if hit is not None and hit[0] is group:
        return hit[1]
    pools = [GpuPool(gpu_type=t, count=1 if _is_mig(t) else n, memory_bytes=lo, speed=_speed(t),
                     gpus_per_node=1 if _is_mig(t) else per_peer)
             for t, n, lo, _, per_peer, _ in group]
    if len(_GROUP_POOLS) > 64:
        _GROUP_POOLS.clear()
    _GROUP_POOLS[id(group)] = (group, pools)
    return pools


def _derive(spec: JobSpec, matching: Sequence[PeerOffer], *, headroom: float, job_id: str | None = None,
            group: object = None, compute: bool = True) -> _Derived:
    """A job's ``_Derived`` (kept under ``job_id`` when ``group`` is given); ``FrenzyError`` when it
    cannot be planned, ``_NotPlanned`` (``compute=False``) when its MARP plans are not cached."""
    from frenzyd.has.speed import flops_per_step
    from frenzyd.marp.model import param_count

    if job_id is not None and group is not None:
        known = _KNOWN.get(job_id)
        if known is not None and known.group is group and known.headroom == headroom \
                and (known.spec is spec or known.spec == spec):
            return known
    if _is_model(spec):
        answer = _marp_answer(spec, matching, headroom=headroom, only_available=False, compute=compute,
                              pools=None if group is None else _group_pools(group))
        if answer is None:
            raise _NotPlanned
        cands: Sequence[JobPlan] = answer
        model = job_model(spec)
        params = param_count(model)  # the simulator's speed model of the same job (frenzyd.sim.jobs)
        flops = flops_per_step(params, model.layers, model.hidden, spec.seq_len or 1, spec.global_batch or 1,
                               recompute=spec.recompute == "full")
    else:
        cands = _declared_plans(spec, matching)
        params = max(1, (spec.mem_per_rank or 0) // 16)
        flops = 6.0 * params * ASSUMED_SEQ_TOKENS * (spec.nproc or 1)
    speed = PoolSpeed(params=params, flops_per_step=max(flops, 1.0))  # step times: the restart cost aside
    memo = isinstance(cands, tuple) and not spec.stand_in  # a stand-in's times depend on the GPUs
    hit = _HAS_PLANS.get(id(cands)) if memo else None
    if hit is not None and hit[0] is cands:
        has_plans = hit[1]
    else:
        # only a stand-in needs the simulated types (O(GPUs) per job)
        simulated = {g.type for p in matching for g in p.gpus if g.simulated} if spec.stand_in else set()
        plans = []
        for c in cands:
            base = _has_plan(c)
            if not base.step_time_s:
                base = replace(base, step_time_s=speed.step_time_s(base, _speed(base.gpu_type), 1))
            elif spec.stand_in and base.gpu_type in simulated:  # what the stand-in will take there
                base = replace(base, step_time_s=max(MIN_STAND_IN_STEP_S, base.step_time_s))
            plans.append(base)
        has_plans = tuple(plans)
        if memo:
            _HAS_PLANS[id(cands)] = (cands, has_plans)
            while len(_HAS_PLANS) > 4096:
                del _HAS_PLANS[next(iter(_HAS_PLANS))]
    derived = _Derived(spec, group, headroom, has_plans, tuple(cands), params, max(flops, 1.0),
                       restart_key(spec), min((p.step_time_s for p in has_plans), default=0.0),
                       JobSpeed(params=params, flops_per_step=max(flops, 1.0)).restart_cost_s)
    if job_id is not None and group is not None:
        _keep(_KNOWN, job_id, derived)
    return derived


def _view_of(job_id: str, arrival_s: float, d: _Derived, restart: RestartCosts | None,
             work: tuple[float, float], *, keep: bool = True, fit: StepFit | None = None) -> Any:
    """HAS's view of a job (the last pass's object when every input is the same); ``fit`` corrects
    its plans' step times by what the pool measured (``step_fit``)."""
    from frenzyd.has.interface import JobView

    start_s, stop_s = (d.default_restart_s, 0.0) if restart is None else restart.for_model(d.restart_key)
    key = (d, arrival_s, start_s, stop_s, work, fit)
    hit = _VIEWS.get(job_id) if keep else None
    if hit is not None and hit[0] == key:
        return hit[1]
    plans = d.plans if fit is None else fit.plans(d.plans)
    view = JobView(job_id=job_id, arrival_s=arrival_s, requested_gpus=d.spec.nproc or 1, plans=plans,
                   speed=PoolSpeed(params=d.params, flops_per_step=d.flops, restart_s=start_s),
                   total_steps=work[0], remaining_steps=work[1], stop_cost_s=stop_s)
    if keep:
        _keep(_VIEWS, job_id, (key, view))
    return view


def _job_view(spec: JobSpec, job_id: str, arrival_s: float, matching: Sequence[PeerOffer], *,
              headroom: float, restart: RestartCosts | None = None) -> tuple[Any, list[JobPlan]]:
    """HAS's view of one job (its candidate plans, speed model; with ``restart``, the restart cost
    the pool measured; one step of work) and the candidates as JobPlans; ``FrenzyError`` when it
    cannot be planned."""
    d = _derive(spec, matching, headroom=headroom)
    return _view_of(job_id, arrival_s, d, restart, (1.0, 1.0), keep=False), list(d.cands)


def schedule(
    queue: Sequence[QueuedJob], offers: Sequence[PeerOffer], *, now_s: float,
    headroom: float = DEFAULT_HEADROOM, running: Sequence[RunningInfo] = (), policy: Any = None,
    restart: RestartCosts | None = None, refused: Mapping[str, Container[str]] | None = None,
    plan_inline: bool = True, model_fits: Mapping[str, StepFit] | None = None,
) -> Schedule:
    """Decide which queued jobs start now and where, and which running checkpointable jobs HAS
    stops, shrinks, grows or moves (HAS ``frenzy`` policy, or ``policy``; see module docstring).

    ``policy`` is the coordinator's one instance for its term, so its caches live across passes.
    ``restart``: what a re-placement costs in this pool (the coordinator's measurements), told to
    the policy as every job's restart cost (start) and stop cost; None: ``has.speed``'s model.
    ``refused``: job id -> peers that refused its launch lately: no placement of the job uses them,
    nor a peer that runs only another user's jobs (``PeerOffer.only_jobs_of``).  HAS does not know
    those bars, so a job it places on a barred peer gets MARP's best plan on the GPUs left instead.
    ``plan_inline=False``: a model job whose MARP plans are not in the plan cache is left out of the
    pass (``Schedule.planning``) instead of enumerating them here; the caller warms them
    (``warm_plans``) off the pass.
    ``model_fits``: ``restart_key`` -> that model's latest step fit, for a job without its own
    (``QueuedJob.fit``, ``RunningInfo.fit``; ``step_fit``).

    What a pass derived for a job (its candidates, HAS's view) is kept by job id and reused on the
    next pass while its inputs are the same (``_Derived``): the same values, not recomputed."""
    from frenzyd.has.frenzy import FrenzyPolicy
    from frenzyd.has.interface import Cluster, Gpu, GpuTypeSpec, RunningJob, Snapshot

    infeasible: list[tuple[str, str]] = []
    planning: list[str] = []
    derived: list[tuple[str, _Derived]] = []
    arrivals: list[float] = []
    candidates: dict[str, Sequence[JobPlan]] = {}
    fits: list[StepFit | None] = []
    measured: list[tuple[str, StepFit]] = []
    by_versions: dict[tuple[str, str], tuple[list[PeerOffer], list[int], object]] = {}

    def matching_of(spec: JobSpec) -> tuple[list[PeerOffer], list[int], object]:
        """The offers whose versions match ``spec``, their GPUs' memory, sorted, and the group's
        ``_group_key`` (once per pass)."""
        vk = (_py_minor(spec.python_version), spec.torch_version)
        group = by_versions.get(vk)
        if group is None:
            ms = [p for p in offers if versions_match(spec, p)]
            group = by_versions[vk] = (ms, sorted(g.memory_bytes for p in ms for g in p.gpus),
                                       _group_key(vk, ms))
        return group

    for q in queue:
        matching, mems, gkey = matching_of(q.spec)
        try:
            d = _derive(q.spec, matching, headroom=headroom, job_id=q.job_id, group=gkey, compute=plan_inline)
            model = _is_model(q.spec)
            if not matching or not d.cands or (not model and len(mems) - bisect.bisect_left(
                    mems, q.spec.mem_per_rank or 0) < (q.spec.nproc or 1)):
                place(q.spec, offers, headroom=headroom)  # raises when it can never fit (with why)
        except _NotPlanned:
            planning.append(q.job_id)
            continue
        except FrenzyError as exc:  # infeasible, unknown model, MARP unavailable
            infeasible.append((q.job_id, str(exc)))
            continue
        candidates[q.job_id] = d.cands
        derived.append((q.job_id, d))
        arrivals.append(q.arrival_s)
        fits.append(_fit_for(q.fit, d, model_fits))
    queued_n = len(derived)
    declared = {q.job_id: q.spec.steps for q in queue}
    by_key: dict[tuple[str, int], OfferedGpu] = {}
    peer_of: dict[str, PeerOffer] = {}
    all_gpus: list[Any] = []
    free: list[Any] = []
    type_mem: dict[str, int] = {}
    for p in offers:
        peer_of[p.node_id] = p
        for og in p.gpus:
            hg = Gpu(p.node_id, og.index, og.type)
            by_key[(p.node_id, og.index)] = og
            all_gpus.append(hg)
            if og.available:
                free.append(hg)
            type_mem[og.type] = max(type_mem.get(og.type, 0), og.memory_bytes)
    runs: list[tuple[RunningInfo, Any]] = []
    for r in running:
        gpus = [by_key.get(g) for g in r.gpus]
        if not _is_model(r.spec) or any(g is None or g.available for g in gpus) or not r.gpus:
            continue  # not HAS's to move (a script), or its peer's report does not show it running
        matching, _, gkey = matching_of(r.spec)
        try:
            d = _derive(r.spec, matching, headroom=headroom, job_id=r.job_id, group=gkey, compute=plan_inline)
        except _NotPlanned:
            planning.append(r.job_id)  # not HAS's to move this pass
            continue
        except FrenzyError:
            continue
        candidates[r.job_id] = d.cands
        declared[r.job_id] = r.spec.steps
        derived.append((r.job_id, d))
        arrivals.append(r.started_s)
        runs.append((r, [Gpu(peer, idx, by_key[(peer, idx)].type) for peer, idx in r.gpus]))
        fit = _fit_for(r.fit, d, model_fits)
        if r.step_s is not None and (predicted := _running_step_s(r)):  # MARP's step on its GPUs
            peers = len({peer for peer, _ in r.gpus})
            speed = PoolSpeed(params=d.params, flops_per_step=d.flops)
            on_gpus = speed.step_time_s(replace(_has_plan(r.plan), step_time_s=predicted),
                                        _speed(r.plan.gpu_type), peers)
            if (fresh := StepFit.of(r.step_s, on_gpus)) is not None:
                fit = fresh
                measured.append((r.job_id, fresh))
        fits.append(fit)
    done = {q.job_id: q.done_steps for q in queue} | {r.job_id: r.done_steps for r in running}
    work = _declared_work(derived, queued_n, declared, done)
    all_views = [_view_of(j, a, d, restart, w, fit=f)
                 for (j, d), a, w, f in zip(derived, arrivals, work, fits, strict=True)]
    fit_of = {j: f for (j, _), f in zip(derived, fits, strict=True) if f is not None}
    views, run_views = all_views[:queued_n], all_views[queued_n:]
    running_jobs = tuple(
        # step time: the measured one, else MARP's (paced for a stand-in); the plan and every other
        # plan of the job corrected by its fit, so HAS weighs its time here and elsewhere alike
        RunningJob(job=v, plan=_has_plan(r.plan) if f is None else f.plan(_has_plan(r.plan)), gpus=tuple(g),
                   started_s=r.started_s, step_time_s=r.step_s or _fitted_step(r, f), ready_s=r.ready_s)
        for v, (r, g), f in zip(run_views, runs, fits[queued_n:], strict=True)
    )
    types = tuple(GpuTypeSpec(t, m, _speed(t)) for t, m in sorted(type_mem.items()))
    snapshot = Snapshot(now_s=now_s, reason="arrival", cluster=Cluster(types, tuple(sorted(all_gpus))),
                        free=tuple(sorted(free)), queued=tuple(views), running=running_jobs)
    policy = policy or FrenzyPolicy()
    decision = policy.decide(snapshot, random.Random(0))
    running_ids = {r.job.job_id for r in running_jobs}
    preempted = [j for j in decision.preemptions if j in running_ids]
    # A running job HAS places elsewhere (shrink, grow, move, upgrade) is stopped first, as well.
    preempted += [pl.job_id for pl in decision.placements
                  if pl.job_id in running_ids and pl.job_id not in preempted]
    held_by = {g: r.job.job_id for r in running_jobs for g in r.gpus}
    start: list[tuple[str, Placement]] = []
    pending: list[tuple[str, Placement]] = []
    why: dict[str, str] = {}
    taken: set[str] = set()
    specs = {q.job_id: q.spec for q in queue} | {r.job_id: r.spec for r in running}
    owners = {q.job_id: q.owner for q in queue} | {r.job_id: r.owner for r in running}
    barred_from: dict[str, set[str]] = {}
    exclusive = [(p.node_id, p.only_jobs_of) for p in offers if p.only_jobs_of is not None]

    def barred(job_id: str) -> set[str]:
        """Peers the job must not go to: they refused it lately, or run only another user's jobs."""
        out = barred_from.get(job_id)
        if out is None:
            owner = owners.get(job_id)
            lately = (refused or {}).get(job_id)
            out = set() if lately is None else {p.node_id for p in offers if p.node_id in lately}
            if owner is not None:
                out.update(nid for nid, only in exclusive if only != owner)
            barred_from[job_id] = out
        return out

    rerouted: list[str] = []
    for pl in decision.placements:
        spec = specs.get(pl.job_id)
        chosen = [by_key.get((hg.peer, hg.index)) for hg in pl.gpus]
        if spec is None or any(c is None or c.uuid in taken for c in chosen) \
                or not all(versions_match(spec, peer_of[hg.peer]) for hg in pl.gpus):
            continue
        if any(hg.peer in barred(pl.job_id) for hg in pl.gpus):
            rerouted.append(pl.job_id)
            continue
        # GPUs a preempted job holds (its own included) are free once it has stopped.
        waits = [hg for hg in pl.gpus if held_by.get(hg) in preempted]
        need = int(pl.plan.bytes_per_gpu * (1 + headroom)) if _is_model(spec) else 0
        ready = all(c is not None and c.available and c.free_bytes >= need
                    for c, hg in zip(chosen, pl.gpus, strict=True) if hg not in waits)
        if not ready or (pl.job_id in running_ids and pl.job_id not in preempted):
            continue  # HAS proposed a move the daemon does not make (see module docstring)
        shape = (pl.plan.gpu_type, pl.plan.gpus, pl.plan.tp, pl.plan.pp, pl.plan.zero)
        cands = candidates[pl.job_id]
        match = next((c for c in cands if (c.gpu_type, c.gpus, c.tp, c.pp, c.zero) == shape), None)
        exact = match is not None
        if match is None:  # a policy's own plan (fifo's user plan): MARP's best of that type and size
            match = next((c for c in cands if (c.gpu_type, c.gpus) == shape[:2]), None)
        if match is None:
            continue  # nothing the job's ranks can run on those GPUs
        groups: dict[str, list[OfferedGpu]] = {}
        for hg in pl.gpus:
            groups.setdefault(hg.peer, []).append(by_key[(hg.peer, hg.index)])
        ordered = [(peer_of[n], gs) for n, gs in groups.items()]
        taken.update(og.uuid for _, gs in ordered for og in gs)
        # A declared job's step time is the speed model's assumption, not a prediction: not shown.
        step = (pl.plan.step_time_s if exact else match.step_time_s) if match.source == "marp" else None
        if step and exact and (fit := fit_of.get(pl.job_id)) is not None:
            step = fit.predicted_s(step)  # the plan keeps MARP's figure; the fit is the pool's own
        plan = replace(match, step_time_s=step, policy=policy.name, peers=len(ordered),
                       backend=_backend([og for _, gs in ordered for og in gs]))
        placement = Placement(plan, _number(ordered))
        if waits or pl.job_id in running_ids:
            pending.append((pl.job_id, placement))
            for hg in waits:
                donor = held_by[hg]
                if donor != pl.job_id:
                    why.setdefault(donor, f"making room for job {pl.job_id}")
        else:
            start.append((pl.job_id, placement))
    for j in preempted:
        why.setdefault(j, "moved to a new plan by the scheduler")
    # Declared jobs HAS could not place on one type: a mix of types may hold them now.
    placed = {j for j, _ in start} | {j for j, _ in pending} | {j for j, _ in infeasible}
    rest: list[PeerOffer] | None = None
    free_now: list[int] = []
    at: dict[str, int] = {}
    for q in queue:
        if q.job_id in placed or _is_model(q.spec):
            continue
        if rest is None:
            rest = [_without(p, taken) for p in offers]
            at = {p.node_id: i for i, p in enumerate(rest)}
            # every version's GPUs: an upper bound of what place() may take, so a skip is safe
            free_now = sorted(g.free_bytes for p in rest for g in p.gpus if g.available)
        if len(free_now) - bisect.bisect_left(free_now, q.spec.mem_per_rank or 0) < (q.spec.nproc or 1):
            continue
        bar = barred(q.job_id)
        mixed = place(q.spec, [p for p in rest if p.node_id not in bar], headroom=headroom)
        if mixed is not None:
            mixed = replace(mixed, plan=replace(mixed.plan, policy="packing (mixed GPU types)"))
            taken.update(r.gpu for r in mixed.ranks)
            start.append((q.job_id, mixed))
            for nid in {r.peer for r in mixed.ranks}:  # those peers' GPUs it took are not free now
                for g in rest[at[nid]].gpus:
                    if g.uuid in taken and g.available:
                        del free_now[bisect.bisect_left(free_now, g.free_bytes)]
                rest[at[nid]] = _without(rest[at[nid]], taken)
    # Model jobs HAS put on a barred peer: MARP's best plan on the free GPUs of the others.
    placed = {j for j, _ in start} | {j for j, _ in pending}
    for job_id in dict.fromkeys(rerouted):
        spec = specs[job_id]
        if job_id in placed or job_id in running_ids or not _is_model(spec):
            continue
        bar = barred(job_id)
        try:
            alt = place(spec, [_without(p, taken) for p in offers if p.node_id not in bar], headroom=headroom)
        except FrenzyError:
            continue
        if alt is not None:
            taken.update(r.gpu for r in alt.ranks)
            start.append((job_id, replace(alt, plan=replace(alt.plan, policy=f"{policy.name} (rerouted)"))))
    return Schedule(tuple(start), tuple(infeasible), policy.name, tuple((j, why[j]) for j in preempted),
                    tuple(pending), tuple(planning), tuple(measured))


def job_model(spec: JobSpec) -> Any:
    """MARP's ``ModelSpec`` of a job: its config, or a shipped preset.  A path is never read on a
    peer's behalf (a submitter sends the config itself); ``ModelConfigError`` otherwise."""
    from frenzyd.errors import ModelConfigError
    from frenzyd.marp.model import list_presets, load_model, spec_from_config

    if spec.model_config is not None:
        return spec_from_config(spec.model_config, name=spec.name or "model")
    if spec.model in list_presets():
        return load_model(str(spec.model))
    raise ModelConfigError(f"unknown model preset {spec.model!r}: use one of {', '.join(list_presets())} "
                           "or pass the path of a config.json to --model")


def predicted_rank_peaks(spec: JobSpec, plan: JobPlan) -> list[int] | None:
    """MARP's tensor peak of each rank of ``plan``, on the kernels of the device the ranks ran on
    (gloo ranks: cpu; nccl: cuda).  None for a job without a model or a plan MARP cannot score."""
    from frenzyd.marp.analytic import predict
    from frenzyd.marp.spec import TrainingSetup

    if (spec.model is None and spec.model_config is None) or spec.seq_len is None:
        return None
    try:
        setup = TrainingSetup(
            seq_len=spec.seq_len, micro_batch=plan.micro_batch or spec.micro_batch or 1,
            dtype=spec.dtype, global_batch=spec.global_batch,  # type: ignore[arg-type]
            optimizer=spec.optimizer, recompute=spec.recompute,  # type: ignore[arg-type]
            zero=plan.zero, dp=plan.dp, tp=plan.tp, pp=plan.pp,
        )
        pred = predict(job_model(spec), setup, device="cpu" if plan.backend == "gloo" else "cuda",
                       per_rank=True)
    except (FrenzyError, TypeError, ValueError):
        return None
    return list(pred.rank_peaks) if pred.rank_peaks else [pred.peak_bytes]
