"""The pool as one daemon sees it, rendered as the status JSON of DESIGN.md §6 (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_GPU_KEYS = ("uuid", "type", "memory_bytes", "free_bytes", "simulated", "leased_to")
GPU_DETAIL_KEYS = ("reason", "foreign_processes", "ignored_processes", "ignored_bytes", "processes_known",
                   "compute_capability", "driver_version", "cuda_driver_version", "mig")
"""What a node's inventory adds per GPU (``frenzyd.node.inventory.GpuInfo.to_json`` and the daemon's
``offered``/``reason``), passed through when the report carries it."""


@dataclass(frozen=True, slots=True)
class PeerState:
    """One known peer (this node included): identity, liveness and its latest report."""

    id: str
    name: str
    address: str
    alive: bool
    report: Mapping[str, Any]
    seen_by: Sequence[str] = ()
    """How this node learned the peer's addresses (``static``, ``mdns``, ``report``, ``reply``)."""
    clock_offset_s: float | None = None
    """The peer's clock minus ours when its last heartbeat arrived (its ``time`` against our wall
    clock then; network delay included), None when it sends no ``time``."""


def _gpu(g: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: g.get(k) for k in _GPU_KEYS}
    out["simulated"] = bool(out["simulated"])
    for extra in ("index", "offered", "utilization", *GPU_DETAIL_KEYS):
        if extra in g:
            out[extra] = g[extra]
    return out


def merge_jobs(sources: Iterable[Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Job summaries from several views, the most recently updated version of each, oldest job first."""
    seen: dict[str, dict[str, Any]] = {}
    for src in sources:
        for s in src:
            if not isinstance(s.get("id"), str):
                continue
            old = seen.get(s["id"])
            if old is None or _num(s.get("updated_at")) > _num(old.get("updated_at")):
                seen[s["id"]] = dict(s)
    return sorted(seen.values(), key=lambda s: (_num(s.get("created_at")), s["id"]))


def _num(x: object) -> float:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0


def build_status(
    *,
    node_id: str,
    node_name: str,
    term: int,
    coordinator: tuple[str, str] | None,
    peers: Sequence[PeerState],
    jobs: Sequence[Mapping[str, Any]],
    other_versions: Mapping[str, int] | None = None,
    now: float | None = None,
    gpu_backend: Mapping[str, Any] | None = None,
    scheduler: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status JSON: ``node``, ``coordinator`` (id, name, term) or null, ``peers``, ``jobs``, and
    ``other_versions`` (members speaking another wire protocol version: upgrade them).

    A job's ``state`` keeps its five values; ``phase``, ``reason``, ``attempt`` and, for queued jobs,
    ``queue_position`` (1 = submitted first among the queued; HAS may start a later one first when
    it fits better) carry the detail.  ``node.time`` is this node's wall clock (``now``) and
    ``node.gpu_backend`` where its GPUs come from (``{"kind": "nvml"|"declared", "note"}``); each
    peer carries ``seen_by`` and ``clock_offset_s`` (see :class:`PeerState`).
    """
    role = "coordinator" if coordinator is not None and coordinator[0] == node_id else "peer"
    queued = [j["id"] for j in sorted((j for j in jobs if j.get("state") == "queued"),
                                      key=lambda j: (_num(j.get("created_at")), j["id"]))]
    position = {job_id: i + 1 for i, job_id in enumerate(queued)}
    return {
        "node": {"id": node_id, "name": node_name, "role": role, "term": term, "time": now,
                 "gpu_backend": dict(gpu_backend) if gpu_backend is not None else None},
        "coordinator": None if coordinator is None else
        {"id": coordinator[0], "name": coordinator[1], "term": term},
        "peers": [
            {
                "id": p.id,
                "name": p.name,
                "address": p.address,
                "alive": p.alive,
                "python": p.report.get("python"),
                "torch": p.report.get("torch"),
                # who its ranks run as (slot accounts, or the daemon's user and why) and what it accepts
                "launcher": dict(la) if isinstance(la := p.report.get("launcher"), Mapping) else None,
                "seen_by": list(p.seen_by),
                "clock_offset_s": None if p.clock_offset_s is None else round(p.clock_offset_s, 3),
                "gpus": [_gpu(g) for g in p.report.get("gpus") or () if isinstance(g, Mapping)],
            }
            for p in sorted(peers, key=lambda p: (p.id != node_id, p.name, p.id))
        ],
        "jobs": [
            {
                "id": j["id"],
                "name": j.get("name", ""),
                "state": j.get("state"),
                "submitter": j.get("submitter"),
                "submitter_name": j.get("submitter_name", ""),
                "plan": j.get("plan"),
                "ranks": list(j.get("ranks") or ()),
                "message": j.get("message", ""),
                "phase": j.get("phase"),
                "reason": j.get("reason", j.get("message", "")),
                "attempt": j.get("attempt"),
                "failed_rank": j.get("failed_rank"),
                "queue_position": position.get(j["id"]),
                **({k: j.get(k) for k in ("progress", "memory") if k in j}),
                "created_at": j.get("created_at"),
                "started_at": j.get("started_at"),
                "updated_at": j.get("updated_at"),
            }
            for j in jobs
        ],
        "other_versions": [{"id": nid, "protocol": v} for nid, v in sorted((other_versions or {}).items())],
        # what this node, as coordinator, tells HAS a re-placement costs (RestartCosts.to_dict)
        "scheduler": dict(scheduler) if scheduler is not None else None,
    }
