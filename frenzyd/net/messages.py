"""The peer layer's own typed message: the heartbeat, and the report it carries (pure).

A heartbeat says who a node is (id, name, address), where it stands in the election
(priority, term, the coordinator it follows) and, in its ``report``, what it has: the
versions it runs, its GPUs, its leases and its jobs.  The peer layer fills ``python``; the
rest comes from the report provider (the job layer, ``Orchestrator.report``) and is opaque
here: each GPU, lease and job is a map the job layer reads.

Both classes are checked once, at the edge: a heartbeat whose report does not have this shape
is dropped with reason ``schema``, and so is one whose GPU, lease or job entries carry a known
field of the wrong type or out of range (``free_bytes`` that is not a byte count, say): what the
status page, the metrics and the coordinator read from a report is valid by construction.
``to_body``/``to_dict`` write the keys in the order the daemons have always sent them (the
golden-frame test pins the bytes); a report key this version does not know is kept and sent after
the known ones, so a newer peer's additions pass through; a report key that was absent stays
absent (``None`` here).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Self

from frenzyd.net.wire import KINDS, Body, FrameRejected, message, packed_size

REPORT_VERSIONS: Final = ("python", "torch")
"""The report's version strings, in wire order."""
REPORT_LISTS: Final = ("gpus", "leases", "jobs")
"""The report's lists of maps (one per GPU, lease, job), in wire order after the versions."""


MAX_BYTES_FIELD: Final = 1 << 60
"""Largest byte count a report may carry (1 EiB): larger is a bug or a lie."""
MAX_COUNT_FIELD: Final = 1 << 31
MAX_ENTRIES: Final = 4096
"""Most GPUs, leases or jobs one report may list."""


def _wrong(key: str, value: object) -> FrameRejected:
    return FrameRejected("schema", f"heartbeat.report.{key}: wrong type {type(value).__name__}")


def _is_int(value: object, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _is_text(value: object) -> bool:
    # No length limit of its own (the frame cap bounds it): a long job name must not make its
    # submitter's heartbeats, and so the node, disappear from the pool.
    return isinstance(value, str)


def _is_opt_text(value: object) -> bool:
    return value is None or _is_text(value)


def _is_share(value: object) -> bool:
    # A fraction (0..1) today; a percentage is tolerated.  NaN and infinities are not.
    return isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 100.0




def _is_time(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                             and 0.0 <= value < 1e11)


_FIELDS: Final[Mapping[str, Mapping[str, Callable[[object], bool]]]] = {
    "gpus": {
        "uuid": _is_text,
        "type": _is_text,
        "index": lambda v: _is_int(v, 0, 1 << 16),
        "memory_bytes": lambda v: _is_int(v, 0, MAX_BYTES_FIELD),
        "free_bytes": lambda v: _is_int(v, 0, MAX_BYTES_FIELD),
        "utilization": _is_share,
        "simulated": lambda v: isinstance(v, bool),
        "offered": lambda v: isinstance(v, bool),
        "foreign_processes": lambda v: _is_int(v, 0, MAX_COUNT_FIELD),
        "leased_to": _is_opt_text,
        "reason": _is_opt_text,
    },
    "leases": {
        "job_id": _is_text,
        "attempt": lambda v: _is_int(v, 0, MAX_COUNT_FIELD),
        "term": lambda v: _is_int(v, 0, 1 << 62),
        "gpus": lambda v: isinstance(v, list) and all(_is_text(g) for g in v),
    },
    "jobs": {
        "id": _is_text,
        "name": _is_opt_text,
        "state": _is_text,
        "attempt": lambda v: v is None or _is_int(v, 0, MAX_COUNT_FIELD),
        "created_at": _is_time,
        "started_at": _is_time,
        "finished_at": _is_time,
        "updated_at": _is_time,
        "ranks": lambda v: isinstance(v, list) and all(isinstance(r, Mapping) for r in v),
    },
}
"""Per list, the fields the job layer, the status page and the metrics read, and what each must be
when present (a field not named here passes as it is)."""


def _maps(key: str, value: object) -> tuple[Mapping[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(item, Mapping) for item in value):
        raise _wrong(key, value)
    if len(value) > MAX_ENTRIES:
        raise FrameRejected("schema", f"heartbeat.report.{key}: {len(value)} entries > {MAX_ENTRIES}")
    checks = _FIELDS.get(key, {})
    for i, item in enumerate(value):
        for field_name, ok in checks.items():
            if field_name in item and not ok(item[field_name]):
                shown = str(item[field_name])[:40]
                where = f"heartbeat.report.{key}[{i}].{field_name}"
                raise FrameRejected("schema", f"{where}: invalid value {shown!r}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class HeartbeatReport:
    """What a node says of itself in every heartbeat (the heartbeat's ``report`` map)."""

    python: str | None = None
    """This node's Python version, ``"3.11.7"``."""
    torch: str | None = None
    """Its torch version (``"none"`` when torch is not installed)."""
    gpus: tuple[Mapping[str, Any], ...] | None = None
    """Its GPUs as the job layer describes them (``uuid``, ``type``, ``free_bytes``, ``leased_to``...)."""
    leases: tuple[Mapping[str, Any], ...] | None = None
    """The GPU leases it holds for jobs."""
    jobs: tuple[Mapping[str, Any], ...] | None = None
    """Summaries of the jobs it submitted."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Keys this version does not know, as sent."""

    def to_dict(self) -> dict[str, Any]:
        """The report map: the known keys that are present, in wire order, then ``extra``."""
        out: dict[str, Any] = {}
        for key in REPORT_VERSIONS:
            text = getattr(self, key)
            if text is not None:
                out[key] = text
        for key in REPORT_LISTS:
            items = getattr(self, key)
            if items is not None:
                out[key] = list(items)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Check and take a report map; raise :class:`FrameRejected` (``schema``) for a known key of
        the wrong type (a version that is not a string, a list that is not a list of maps)."""
        versions: dict[str, str | None] = {}
        for key in REPORT_VERSIONS:
            text = data.get(key)
            if text is not None and not isinstance(text, str):
                raise _wrong(key, text)
            versions[key] = text
        known = (*REPORT_VERSIONS, *REPORT_LISTS)
        return cls(
            python=versions["python"],
            torch=versions["torch"],
            gpus=_maps("gpus", data.get("gpus")),
            leases=_maps("leases", data.get("leases")),
            jobs=_maps("jobs", data.get("jobs")),
            extra={k: v for k, v in data.items() if k not in known},
        )


@message("heartbeat", KINDS["heartbeat"])
@dataclass(frozen=True, slots=True)
class Heartbeat(Body):
    """Sent to every known address every ``timing.heartbeat_s`` and answered with the receiver's own.

    The kind and its schema are registered by the wire layer; this is its typed form."""

    node_id: str
    name: str
    address: str
    priority: int
    term: int
    coordinator: str | None = None
    report: HeartbeatReport = field(default_factory=HeartbeatReport)

    def to_body(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "name": self.name,
            "address": self.address,
            "priority": self.priority,
            "term": self.term,
            "coordinator": self.coordinator,
            "report": self.report.to_dict(),
        }

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        """Take a schema-checked heartbeat body; raise :class:`FrameRejected` (``schema``) for a
        report of the wrong shape."""
        return cls(
            node_id=body["node_id"],
            name=body["name"],
            address=body["address"],
            priority=body["priority"],
            term=body["term"],
            coordinator=body.get("coordinator"),
            report=HeartbeatReport.from_dict(body.get("report") or {}),
        )


# --- membership (SWIM): who is in the pool, spread by gossip with bounded fan-out ----------------

MEMBER_STATES: Final = ("alive", "suspect", "dead", "left")
"""A member's state in gossip, by its code on the wire (the index)."""
MAX_UPDATES: Final = 64
"""Most membership entries one ping, ping-req or ack may carry."""
MAX_SYNC_ENTRIES: Final = 8192
"""Most entries one full-state sync may carry (a pool of this many members)."""
MAX_ENTRY_TEXT: Final = 256
"""Longest node id, name or address an entry may carry."""
SYNC_MAX_BYTES: Final = 2 * 1024 * 1024
MAX_SEQ: Final = 1 << 62


def _text(key: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_ENTRY_TEXT:
        raise FrameRejected("schema", f"member.{key}: not a string of at most {MAX_ENTRY_TEXT} characters")
    return value


def _opt_text(key: str, value: object) -> str | None:
    return None if value is None else _text(key, value)


def _int(key: str, value: object, hi: int, lo: int = 0) -> int:
    if not _is_int(value, lo, hi):
        raise FrameRejected("schema", f"member.{key}: not an integer in range")
    assert isinstance(value, int)
    return value


@dataclass(frozen=True, slots=True)
class MemberEntry:
    """What gossip says about one member: who it is, where, its election view, and its state at an
    incarnation (only the member itself raises its incarnation: to refute a suspicion or to say its
    view changed).  On the wire a list ``[node_id, name, address, priority, incarnation, state,
    term, coordinator]``, ``state`` a code of :data:`MEMBER_STATES`; a suspect entry adds a ninth,
    ``by``, the member whose own probe failed (Lifeguard counts independent suspecters).  ``by`` is
    left out of equality: it says who noticed, not what the member's state is.  A decoder that
    knows eight fields ignores the ninth."""

    node_id: str
    name: str
    address: str
    priority: int
    incarnation: int
    state: int
    term: int
    coordinator: str | None = None
    by: str | None = field(default=None, compare=False)

    @property
    def state_name(self) -> str:
        return MEMBER_STATES[self.state]

    def to_wire(self) -> list[Any]:
        out = [self.node_id, self.name, self.address, self.priority, self.incarnation, self.state,
               self.term, self.coordinator]
        return out if self.by is None else [*out, self.by]

    @classmethod
    def from_wire(cls, value: object) -> Self:
        """Check and take an entry from the wire; raise :class:`FrameRejected` (``schema``)."""
        if not isinstance(value, list | tuple) or len(value) < 8:
            raise FrameRejected("schema", "member: not a list of 8 fields")
        node_id, name, address, priority, incarnation, state, term, coordinator = value[:8]
        nid = _text("node_id", node_id)
        if not nid:
            raise FrameRejected("schema", "member.node_id: empty")
        return cls(
            node_id=nid,
            name=_text("name", name),
            address=_text("address", address),
            priority=_int("priority", priority, 1 << 31, -(1 << 31)),
            incarnation=_int("incarnation", incarnation, MAX_SEQ),
            state=_int("state", state, len(MEMBER_STATES) - 1),
            term=_int("term", term, MAX_SEQ),
            coordinator=_opt_text("coordinator", coordinator),
            by=_opt_text("by", value[8]) if len(value) > 8 else None,
        )


def _entries(value: object, cap: int) -> tuple[MemberEntry, ...]:
    if not isinstance(value, list | tuple):
        raise FrameRejected("schema", "membership updates: not a list")
    if len(value) > cap:
        raise FrameRejected("schema", f"membership updates: {len(value)} entries > {cap}")
    return tuple(MemberEntry.from_wire(v) for v in value)


def _seq(value: object) -> int:
    if not _is_int(value, 0, MAX_SEQ):
        raise FrameRejected("schema", "seq: not an integer in range")
    assert isinstance(value, int)
    return value


@message("swim.ping", {"seq": int, "src": list, "updates": list})
@dataclass(frozen=True, slots=True)
class SwimPing(Body):
    """A probe: the receiver answers ``swim.ack`` with the same ``seq``.  ``src`` is the sender's own
    entry; ``updates`` the membership changes it piggybacks."""

    seq: int
    src: MemberEntry
    updates: tuple[MemberEntry, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"seq": self.seq, "src": self.src.to_wire(), "updates": [u.to_wire() for u in self.updates]}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_seq(body["seq"]), MemberEntry.from_wire(body["src"]),
                   _entries(body["updates"], MAX_UPDATES))


@message("swim.ping_req", {"seq": int, "src": list, "target": str, "target_address": str, "updates": list})
@dataclass(frozen=True, slots=True)
class SwimPingReq(Body):
    """Ask the receiver to probe ``target`` (at ``target_address``) and forward its ack with ``seq``."""

    seq: int
    src: MemberEntry
    target: str
    target_address: str
    updates: tuple[MemberEntry, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"seq": self.seq, "src": self.src.to_wire(), "target": self.target,
                "target_address": self.target_address, "updates": [u.to_wire() for u in self.updates]}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_seq(body["seq"]), MemberEntry.from_wire(body["src"]), _text("target", body["target"]),
                   _text("target_address", body["target_address"]),
                   _entries(body["updates"], MAX_UPDATES))


@message("swim.ack", {"seq": int, "src": list, "of": str, "updates": list})
@dataclass(frozen=True, slots=True)
class SwimAck(Body):
    """The answer to a ping (``of`` = the node probed: the sender itself, or the target of a ping-req
    whose ack the sender forwards)."""

    seq: int
    src: MemberEntry
    of: str
    updates: tuple[MemberEntry, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"seq": self.seq, "src": self.src.to_wire(), "of": self.of,
                "updates": [u.to_wire() for u in self.updates]}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_seq(body["seq"]), MemberEntry.from_wire(body["src"]), _text("of", body["of"]),
                   _entries(body["updates"], MAX_UPDATES))


@message("swim.sync", {"src": list, "entries": list, "reply": bool}, max_bytes=SYNC_MAX_BYTES)
@dataclass(frozen=True, slots=True)
class SwimSync(Body):
    """Full-state exchange (a join through a seed or an mDNS-found address, or a partition healing):
    the sender's whole member list; ``reply`` asks the receiver to answer with its own."""

    src: MemberEntry
    entries: tuple[MemberEntry, ...]
    reply: bool

    def to_body(self) -> dict[str, Any]:
        return {"src": self.src.to_wire(), "entries": [e.to_wire() for e in self.entries],
                "reply": self.reply}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(MemberEntry.from_wire(body["src"]), _entries(body["entries"], MAX_SYNC_ENTRIES),
                   bool(body["reply"]))


REVOCATIONS_MAX: Final = 256 * 1024 + 4096
"""Cap on a ``revocations`` frame: a list document of at most 256 KiB, its signature, the keys."""


@message("revocations", {"version": int}, max_bytes=REVOCATIONS_MAX)
@dataclass(frozen=True, slots=True)
class Revocations(Body):
    """The pool CA's revocation list (``frenzyd.net.revocation``), sent to a peer when it becomes live
    and to every live peer when a newer list is adopted; answered with ``ok``, or with the receiver's
    own list when that one is newer.  ``version`` alone (no ``list``): "this is the version I have"."""

    version: int
    list: bytes | None = None
    """The list document's exact bytes, signed by the pool CA."""
    sig: bytes | None = None
    """The CA's Ed25519 signature over ``list``."""

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"version": self.version}
        if self.list is not None and self.sig is not None:
            body["list"], body["sig"] = self.list, self.sig
        return body

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        raw, sig, version = body.get("list"), body.get("sig"), body["version"]
        if (raw is None) != (sig is None) or not all(v is None or isinstance(v, bytes) for v in (raw, sig)):
            raise FrameRejected("schema", "revocations: 'list' and 'sig' are bytes, sent together")
        if not 0 <= version < 1 << 53:
            raise FrameRejected("schema", f"revocations: version {version} out of range")
        return cls(version=version, list=raw, sig=sig)


# --- the coordinator's view, for a member's status page (swim) ----------------------------------

POOL_PEERS_MAX: Final = 1024 * 1024
"""Cap on one ``pool.peers`` page."""
POOL_PAGE_BYTES: Final = 512 * 1024
"""A page holds peers until their encoded reports pass this many bytes (and at least one peer)."""
STATUS_REPORT_KEYS: Final = ("python", "torch", "gpus", "jobs", "launcher", "time")
"""What the status JSON reads from another member's report (``frenzyd.jobs.status``; ``jobs``: the
jobs it submitted)."""


@dataclass(frozen=True, slots=True)
class PeerSummary:
    """One member as the coordinator last heard it: identity, liveness and the part of its report the
    status page shows.  On the wire ``[node_id, name, address, alive, report]``."""

    node_id: str
    name: str
    address: str
    alive: bool
    report: HeartbeatReport

    @classmethod
    def of(cls, node_id: str, name: str, address: str, alive: bool, report: Mapping[str, Any]) -> Self:
        """A summary carrying only :data:`STATUS_REPORT_KEYS` of ``report``."""
        return cls(node_id, name, address, alive,
                   HeartbeatReport.from_dict({k: report[k] for k in STATUS_REPORT_KEYS if k in report}))

    def to_wire(self) -> list[Any]:
        return [self.node_id, self.name, self.address, self.alive, self.report.to_dict()]

    @classmethod
    def from_wire(cls, value: object) -> Self:
        """Check and take a summary; raise :class:`FrameRejected` (``schema``)."""
        if not isinstance(value, list | tuple) or len(value) != 5:
            raise FrameRejected("schema", "pool.peers: a peer is not a list of 5 fields")
        node_id, name, address, alive, report = value
        if not isinstance(alive, bool) or not isinstance(report, Mapping):
            raise FrameRejected("schema", "pool.peers: 'alive' is not a bool or the report not a map")
        nid = _text("node_id", node_id)
        if not nid:
            raise FrameRejected("schema", "pool.peers: empty node id")
        return cls(nid, _text("name", name), _text("address", address), alive,
                   HeartbeatReport.from_dict(report))


@message("pool.view", {"offset": int})
@dataclass(frozen=True, slots=True)
class PoolView(Body):
    """A member -> the coordinator: the page of the coordinator's members from ``offset`` (in node id
    order), answered with ``pool.peers``.  Under ``swim`` a member holds full reports only from the
    coordinator and its jobs' peers; its status page asks for the rest when someone looks."""

    offset: int = 0

    def to_body(self) -> dict[str, Any]:
        return {"offset": self.offset}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        return cls(_int("offset", body["offset"], MAX_SYNC_ENTRIES))


@message("pool.peers", {"offset": int, "total": int, "peers": list}, max_bytes=POOL_PEERS_MAX)
@dataclass(frozen=True, slots=True)
class PoolPeers(Body):
    """The answer to ``pool.view``: ``peers`` from ``offset`` of the ``total`` the sender has reports of."""

    offset: int
    total: int
    peers: tuple[PeerSummary, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"offset": self.offset, "total": self.total, "peers": [p.to_wire() for p in self.peers]}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        peers = body["peers"]
        if len(peers) > MAX_SYNC_ENTRIES:
            raise FrameRejected("schema", f"pool.peers: {len(peers)} peers > {MAX_SYNC_ENTRIES}")
        return cls(_int("offset", body["offset"], MAX_SYNC_ENTRIES),
                   _int("total", body["total"], MAX_SYNC_ENTRIES),
                   tuple(PeerSummary.from_wire(p) for p in peers))


def pool_page(peers: Sequence[PeerSummary], offset: int, budget: int = POOL_PAGE_BYTES) -> PoolPeers:
    """The ``pool.peers`` page of ``peers`` from ``offset``: peers while their encoded size stays within
    ``budget`` (at least one).  A peer larger than the budget alone goes without its jobs (and, if still
    too large, without its GPUs)."""
    out: list[PeerSummary] = []
    size = 0
    for peer in peers[offset:]:
        p, n = peer, packed_size(peer.to_wire())
        full = peer.report.to_dict() if n > budget else {}
        for keys in (("python", "torch", "gpus"), ("python", "torch")):  # too large: without jobs, GPUs
            if n <= budget:
                break
            p = PeerSummary.of(peer.node_id, peer.name, peer.address, peer.alive,
                               {k: full[k] for k in keys if k in full})
            n = packed_size(p.to_wire())
        if out and size + n > budget:
            break
        out.append(p)
        size += n
    return PoolPeers(offset, len(peers), tuple(out))
