"""The peer layer's own typed message: the heartbeat, and the report it carries (pure).

A heartbeat says who a node is (id, name, address), where it stands in the election
(priority, term, the coordinator it follows) and, in its ``report``, what it has: the
versions it runs, its GPUs, its leases and its jobs.  The peer layer fills ``python``; the
rest comes from the report provider (the job layer, ``Orchestrator.report``) and is opaque
here: each GPU, lease and job is a map the job layer reads.

Both classes are checked once, at the edge: a heartbeat whose report does not have this shape
is dropped with reason ``schema``.  ``to_body``/``to_dict`` write the keys in the order the
daemons have always sent them (the golden-frame test pins the bytes); a report key this
version does not know is kept and sent after the known ones, so a newer peer's additions pass
through; a report key that was absent stays absent (``None`` here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Self

from frenzyd.net.wire import KINDS, Body, FrameRejected, message

REPORT_VERSIONS: Final = ("python", "torch")
"""The report's version strings, in wire order."""
REPORT_LISTS: Final = ("gpus", "leases", "jobs")
"""The report's lists of maps (one per GPU, lease, job), in wire order after the versions."""


def _wrong(key: str, value: object) -> FrameRejected:
    return FrameRejected("schema", f"heartbeat.report.{key}: wrong type {type(value).__name__}")


def _maps(key: str, value: object) -> tuple[Mapping[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(isinstance(item, Mapping) for item in value):
        raise _wrong(key, value)
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
