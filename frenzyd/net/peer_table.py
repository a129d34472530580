"""Who is in the pool: authenticated peers with heartbeat liveness, and the addresses to dial (pure).

Liveness comes from authenticated heartbeats (zeroconf never reports a crashed peer) and, in
``[network] membership = "swim"``, from the membership protocol: a member it holds alive or suspect
is live though it sends this node no heartbeat (:meth:`PeerTable.member`).  ``AddressBook``
holds every address learned from config, discovery or peers' reports, maps each to the node that
answered there, and backs off addresses that do not answer.  Both take the time as an argument;
nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from frenzyd.errors import AuthError
from frenzyd.net.messages import Heartbeat, HeartbeatReport

MAX_ADDRESSES = 1024
"""Cap on remembered addresses, so a flood of mDNS announcements cannot grow memory."""


@dataclass
class PeerRecord:
    """The last heartbeat of one authenticated peer."""

    node_id: str
    name: str
    address: str
    priority: int
    term: int
    coordinator: str | None
    report: HeartbeatReport
    first_seen: float
    last_seen: float
    member: bool = False
    """The membership protocol holds it alive (or suspect): live without heartbeats."""


class PeerTable:
    """Authenticated peers by node id, with liveness by last heartbeat."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._peers: dict[str, PeerRecord] = {}

    def heard(self, hb: Heartbeat, now: float) -> tuple[PeerRecord, bool]:
        """Record a heartbeat (already authenticated); return the record and whether it is new
        or came back from the dead.

        A node id is live at one address at a time: while a node is alive at one address, a
        heartbeat naming another raises ``AuthError("duplicate_node")`` (a second daemon started
        with the same credentials); the other address is accepted once the first falls silent.
        """
        node_id = hb.node_id
        old = self._peers.get(node_id)
        revived = old is None or not self.is_alive(node_id, now)
        if old is not None and not revived and old.address and hb.address != old.address:
            raise AuthError("duplicate_node", f"node {node_id[:12]} is live at {old.address}; refusing "
                            f"the same node id at {hb.address} (two daemons with one identity?)")
        rec = PeerRecord(
            node_id=node_id,
            name=hb.name,
            address=hb.address,
            priority=hb.priority,
            term=hb.term,
            coordinator=hb.coordinator,
            report=hb.report,
            first_seen=old.first_seen if old is not None and not revived else now,
            last_seen=now,
            member=old is not None and old.member,
        )
        self._peers[node_id] = rec
        return rec, revived

    def member(self, node_id: str, *, name: str, address: str, priority: int, term: int,
               coordinator: str | None, live: bool, now: float) -> tuple[PeerRecord, bool]:
        """What the membership protocol says of a peer: its identity, election view and whether it
        is live.  Its report stays the last one a heartbeat brought (empty if none did).  Returns
        the record and whether it is newly live.

        The address stays the one a heartbeat came from while that heartbeat is recent: two
        daemons with one identity each gossip their own address under one node id, and taking the
        protocol's word would flip the record between them: the impostor's heartbeats (its report
        without the real node's leases) would be accepted and orders would go to it.  The
        protocol's address is taken once the heartbeats at the old one stopped (a node restarted
        elsewhere)."""
        old = self._peers.get(node_id)
        was = old is not None and self.is_alive(node_id, now)
        if old is not None and old.address and self.heard_lately(old, now):
            address = old.address
        rec = PeerRecord(
            node_id=node_id, name=name, address=address, priority=priority, term=term,
            coordinator=coordinator, report=old.report if old is not None else HeartbeatReport(),
            first_seen=old.first_seen if old is not None and was else now,
            last_seen=old.last_seen if old is not None else -self.timeout_s, member=live,
        )
        self._peers[node_id] = rec
        return rec, live and not was

    def is_alive(self, node_id: str, now: float) -> bool:
        rec = self._peers.get(node_id)
        return rec is not None and (rec.member or self.heard_lately(rec, now))

    def heard_lately(self, rec: PeerRecord, now: float) -> bool:
        """Whether ``rec``'s report came by heartbeat within the timeout (under swim a member can be
        alive with an old report)."""
        return now - rec.last_seen < self.timeout_s

    def live(self, now: float) -> list[str]:
        """Node ids heard within the timeout."""
        return [p for p in self._peers if self.is_alive(p, now)]

    def get(self, node_id: str) -> PeerRecord | None:
        return self._peers.get(node_id)

    def records(self) -> list[PeerRecord]:
        return list(self._peers.values())

    def forget(self, node_id: str) -> None:
        self._peers.pop(node_id, None)


@dataclass
class _Addr:
    node_id: str | None = None
    failures: int = 0
    next_try: float = 0.0
    source: str = ""
    is_self: bool = False
    seen_by: set[str] = field(default_factory=set)
    """Every way this address was learned (``source`` is the first)."""


@dataclass
class AddressBook:
    """Addresses to dial, with exponential back-off (``base_s`` · 2^failures, at most ``max_s``)
    for addresses that fail."""

    base_s: float
    max_s: float
    _addrs: dict[str, _Addr] = field(default_factory=dict)

    def add(self, address: str, source: str, *, pinned: bool = False) -> bool:
        """Remember ``address``; return False if it was known or the book is full."""
        if address in self._addrs:
            self._addrs[address].seen_by.add(source)
            return False
        if len(self._addrs) >= MAX_ADDRESSES and not pinned:
            self._evict()
            if len(self._addrs) >= MAX_ADDRESSES:
                return False
        self._addrs[address] = _Addr(source=source, seen_by={source})
        return True

    def _evict(self) -> None:
        # Drop the never-answered address with the most failures (static peers are retried forever).
        victims = [a for a, s in self._addrs.items() if s.node_id is None and s.source != "static"]
        if victims:
            del self._addrs[max(victims, key=lambda a: self._addrs[a].failures)]

    def due(self, now: float) -> list[str]:
        """Addresses to dial now: one per known node that is not already live through another one,
        plus unknown addresses whose back-off has passed.  Never this node's own addresses."""
        out: list[str] = []
        for addr, st in self._addrs.items():
            if st.is_self or st.next_try > now:
                continue
            out.append(addr)
        # Several addresses of one node: dial only the most recently successful one.
        by_node: dict[str, list[str]] = {}
        for a in out:
            n = self._addrs[a].node_id
            if n is not None:
                by_node.setdefault(n, []).append(a)
        for addrs in by_node.values():
            if len(addrs) > 1:
                keep = min(addrs, key=lambda a: self._addrs[a].failures)
                out = [a for a in out if a not in addrs or a == keep]
        return out

    def succeeded(self, address: str, node_id: str, *, is_self: bool = False) -> None:
        st = self._addrs.setdefault(address, _Addr(source="reply", seen_by={"reply"}))
        st.node_id, st.failures, st.next_try, st.is_self = node_id, 0, 0.0, is_self

    def failed(self, address: str, now: float) -> None:
        st = self._addrs.get(address)
        if st is None:
            return
        st.failures += 1
        st.next_try = now + min(self.max_s, self.base_s * 2 ** min(st.failures - 1, 16))

    def sources(self, node_id: str) -> list[str]:
        """How this node learned the addresses where ``node_id`` answered (``static``, ``mdns``,
        ``reply``...), sorted: what ``frenzy-client doctor`` compares to find a multicast gap."""
        return sorted({src for s in self._addrs.values() if s.node_id == node_id for src in s.seen_by if src})

    def addresses(self) -> dict[str, str | None]:
        """address → node id that answered there (None if none yet)."""
        return {a: s.node_id for a, s in self._addrs.items()}
