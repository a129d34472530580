"""Prometheus metrics of one daemon: gauges read from the status JSON at scrape time, plus counters.

Each daemon owns its own :class:`MetricsRegistry` (a private ``CollectorRegistry``,
so several daemons can live in one test process).  Gauges (peers alive, GPUs
offered/leased by type, jobs by state, election term) are derived from the
status JSON of DESIGN.md §6 when ``/metrics`` is scraped, so they never drift
from what ``/api/v1/status`` shows.  Counters by reason (dropped messages, auth
refusals) are either incremented here or read from a component's own
counting dict through :meth:`MetricsRegistry.add_count_source`; both land in the
same family, so each counter has exactly one name.  Counter families are named
without ``_total``; the exposition adds it (Prometheus: counters end in ``_total``).
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
CONTENT_TYPE = CONTENT_TYPE_LATEST

StatusProvider = Callable[[], Mapping[str, Any]]
CountSource = Callable[[], Mapping[str, int]]

AUTH_REFUSALS: Final = "frenzy_auth_refusals"
"""Peers, connections and orders refused by authentication, by reason: ``frenzy_auth_refusals_total``."""
MESSAGES_DROPPED: Final = "frenzy_peer_messages_dropped"
"""Peer frames dropped, by reason: ``frenzy_peer_messages_dropped_total``."""


class _StatusCollector(Collector):
    def __init__(self, status: StatusProvider) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        try:
            st = self.status()
        except Exception:  # a broken provider must not break the scrape of the other metrics
            log.exception("status provider failed during a /metrics scrape")
            return
        yield from status_metrics(st)


class _CountCollector(Collector):
    """One counter family summed over its sources (each: label value -> monotonic count)."""

    def __init__(self, name: str, documentation: str, label: str) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.sources: list[CountSource] = []

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        counts: Tally[str] = Tally()
        for source in self.sources:
            try:
                counts.update({str(k): int(v) for k, v in source().items()})
            except Exception:  # a component's counting dict must not break the scrape
                log.exception("count source of %s failed", self.name)
        for key, value in sorted(counts.items()):
            fam.add_metric([key], float(value))
        yield fam


def status_metrics(st: Mapping[str, Any]) -> list[Metric]:
    """Gauges derived from one status JSON object (DESIGN.md §6)."""
    node = st.get("node") or {}
    coord = st.get("coordinator") or {}
    term = GaugeMetricFamily("frenzy_election_term", "Highest election term this node has seen")
    term.add_metric([], float(node.get("term") or 0))
    is_coord = GaugeMetricFamily("frenzy_is_coordinator", "1 when this node is the pool's coordinator")
    is_coord.add_metric([], 1.0 if node.get("role") == "coordinator" else 0.0)
    has_coord = GaugeMetricFamily("frenzy_coordinator_known", "1 when this node knows a coordinator")
    has_coord.add_metric([], 1.0 if coord else 0.0)

    peers = st.get("peers") or []
    alive = GaugeMetricFamily(
        "frenzy_peers_alive", "Authenticated peers with a recent heartbeat (self included)"
    )
    alive.add_metric([], float(sum(1 for p in peers if p.get("alive"))))
    known = GaugeMetricFamily("frenzy_peers_known", "Peers this node has heard of")
    known.add_metric([], float(len(peers)))

    gpus = GaugeMetricFamily(
        "frenzy_gpus", "GPUs of live peers by type and state", labels=["type", "simulated", "state"]
    )
    free = GaugeMetricFamily(
        "frenzy_gpu_free_bytes", "Free memory of live peers' GPUs by type", labels=["type"]
    )
    tally: Tally[tuple[str, str, str]] = Tally()
    free_by_type: Tally[str] = Tally()
    for p in peers:
        if not p.get("alive"):
            continue
        for g in p.get("gpus") or []:
            gtype = str(g.get("type"))
            if g.get("leased_to"):
                state = "leased"
            elif g.get("offered", True):
                state = "offered"
            else:
                state = "withheld"  # owner protection
            tally[(gtype, "true" if g.get("simulated") else "false", state)] += 1
            free_by_type[gtype] += int(g.get("free_bytes") or 0)
    for labels, n in sorted(tally.items()):
        gpus.add_metric(list(labels), float(n))
    for gtype, b in sorted(free_by_type.items()):
        free.add_metric([gtype], float(b))

    jobs = GaugeMetricFamily("frenzy_jobs", "Jobs this node knows by state", labels=["state"])
    by_state: Tally[str] = Tally(str(j.get("state")) for j in st.get("jobs") or [])
    for state in JOB_STATES:
        jobs.add_metric([state], float(by_state.get(state, 0)))
    return [term, is_coord, has_coord, alive, known, gpus, free, jobs, *_restart_metrics(st)]


def _restart_metrics(st: Mapping[str, Any]) -> list[Metric]:
    """What the coordinator tells HAS a re-placement costs (``scheduler`` in the status JSON): the
    running estimates and how many of this pool's own stops and starts they hold."""
    sched = st.get("scheduler")
    if not isinstance(sched, Mapping):
        return []
    cost = GaugeMetricFamily("frenzy_restart_cost_seconds", "Seconds HAS is told a re-placement of a running "
                             "job costs: its stop and its new start, as measured (a default until then)",
                             labels=["part"])
    seen = GaugeMetricFamily("frenzy_restart_cost_measurements", "Stops and starts measured into "
                             "frenzy_restart_cost_seconds", labels=["part"])
    for part in ("stop", "start"):
        value, n = sched.get(f"{part}_s"), sched.get(f"{part}s_measured")
        if isinstance(value, int | float) and isinstance(n, int):
            cost.add_metric([part], float(value))
            seen.add_metric([part], float(n))
    return [cost, seen]


class MetricsRegistry:
    """The metrics one daemon exposes on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.web_requests = Counter(
            "frenzy_web_requests", "Requests served by the status web server, by path", ["path"],
            registry=self.registry,
        )
        self._status: _StatusCollector | None = None
        self._counts: dict[str, _CountCollector] = {}
        self._dropped: Tally[str] = Tally()
        self._refused: Tally[str] = Tally()
        self.add_count_source(MESSAGES_DROPPED, "Peer frames dropped, by reason", "reason",
                              lambda: self._dropped)
        self.add_count_source(AUTH_REFUSALS, "Peers, connections and orders refused by authentication, "
                              "by reason", "reason", lambda: self._refused)

    def bind_status(self, status: StatusProvider) -> None:
        """Derive the gauges from ``status()`` at every scrape (once per registry)."""
        if self._status is not None:
            self._status.status = status
            return
        self._status = _StatusCollector(status)
        self.registry.register(self._status)

    def add_count_source(self, name: str, documentation: str, label: str, source: CountSource) -> None:
        """Expose ``source()`` (label value -> count, monotonic) in counter family ``name`` (exported as
        ``name_total``); several sources of one family are summed (e.g. :data:`AUTH_REFUSALS`)."""
        if name.endswith("_total"):
            raise ValueError(f"counter {name!r}: name it without _total (the exposition adds it)")
        fam = self._counts.get(name)
        if fam is None:
            fam = self._counts[name] = _CountCollector(name, documentation, label)
            self.registry.register(fam)
        elif fam.label != label:
            raise ValueError(f"counter {name!r} is labelled {fam.label!r}, not {label!r}")
        fam.sources.append(source)

    def drop(self, reason: str) -> None:
        """Count one dropped peer message (:data:`MESSAGES_DROPPED`)."""
        self._dropped[reason] += 1

    def refuse(self, reason: str) -> None:
        """Count one authentication refusal (:data:`AUTH_REFUSALS`)."""
        self._refused[reason] += 1

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (content type :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
