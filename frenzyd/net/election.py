"""Coordinator election: a state machine over authenticated peers' heartbeats and an injected clock (pure).

Rules (DESIGN.md §5):

* Candidates are totally ordered: higher ``priority`` first, then the smaller node id.
* Every claim of the role carries a **term**: a node claims with ``max(term seen) + 1``.
  Between two claims of the same term (two partitions, or a race in start-up), the
  better candidate wins; otherwise the higher term wins.
* A **sitting coordinator keeps the role** while it is live: a better candidate that
  joins learns the sitting coordinator from heartbeats during its start-up grace
  (``grace_s``) and follows it, so the role does not flap.
* When the coordinator is no longer live, the best live candidate claims a new term;
  the others wait for its claim (they adopt it from heartbeats).  A node that live
  peers still name as coordinator but that does not hold the role (it restarted)
  claims a fresh term at once.
* Orders are accepted only from the coordinator of the highest term seen
  (:meth:`ElectionState.check_order`); an order from a higher term is itself a claim.

* Terms are bounded (:meth:`ElectionState.check_term`): a term above ``MAX_TERM`` is refused, and
  so is one more than ``max_term_jump`` above the highest term seen -- except the first term heard
  after start, which is how a new or long-stopped node learns the pool's term.  A refused term is
  never observed, adopted or persisted, so one member cannot wedge the pool with term 2^64-1.

Liveness is the caller's: ``tick(now, live_peers)`` is given the peers whose
heartbeats arrived within the timeout.  Nothing here reads a clock or does I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from frenzyd.errors import ElectionError

MAX_TERM: Final = 2**53 - 1
"""The largest term a node accepts or stores (exact in JSON and every msgpack reader)."""
DEFAULT_MAX_TERM_JUMP: Final = 1000
"""``[election] max_term_jump``'s default."""


def valid_stored_term(value: object) -> int | None:
    """A term read back from disk if it is one (an int in ``0..MAX_TERM``), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TERM:
        return value
    return None


class Role(StrEnum):
    COORDINATOR = "coordinator"
    PEER = "peer"


@dataclass(frozen=True)
class PeerView:
    """What one node reports about itself in a heartbeat."""

    node_id: str
    priority: int
    term: int
    coordinator: str | None


@dataclass(frozen=True)
class Status:
    """This node's view: its role, the coordinator it follows (None while electing) and the term."""

    role: Role
    coordinator: str | None
    term: int


@dataclass(frozen=True)
class Change:
    """A transition, for logging and metrics."""

    before: Status
    after: Status
    reason: str


def candidate_key(priority: int, node_id: str) -> tuple[int, str]:
    """Sort key of the total order: the smallest key is the best candidate."""
    return (-priority, node_id)


class ElectionState:
    """One node's election state; feed it heartbeats (``observe``) and ``tick`` it each heartbeat."""

    def __init__(
        self,
        node_id: str,
        priority: int,
        *,
        started_at: float,
        grace_s: float,
        term: int = 0,
        max_term_jump: int = DEFAULT_MAX_TERM_JUMP,
    ) -> None:
        """``term``: the highest term this node saw before a restart (0 if unknown).
        ``max_term_jump``: how far above the highest term seen a peer's term may be."""
        if not 0 <= term <= MAX_TERM:
            raise ValueError(f"term must be in 0..{MAX_TERM}")
        if max_term_jump < 1:
            raise ValueError("max_term_jump must be >= 1")
        self.max_term_jump = max_term_jump
        self._heard_term = False
        self.node_id = node_id
        self.priority = priority
        self._started_at = started_at
        self._grace_s = grace_s
        self._term = term
        self._max_seen = term
        self._coordinator: str | None = None
        self._views: dict[str, PeerView] = {}
        self.transitions = 0

    # --- read side ------------------------------------------------------------------------

    @property
    def term(self) -> int:
        return self._term

    @property
    def coordinator(self) -> str | None:
        return self._coordinator

    @property
    def role(self) -> Role:
        return Role.COORDINATOR if self._coordinator == self.node_id else Role.PEER

    @property
    def status(self) -> Status:
        return Status(self.role, self._coordinator, self._term)

    def view(self) -> PeerView:
        """This node's own report, to put in its heartbeats."""
        return PeerView(self.node_id, self.priority, self._term, self._coordinator)

    # --- inputs --------------------------------------------------------------------------

    def check_term(self, term: int) -> None:
        """Raise ElectionError unless ``term`` may be believed: ``term_out_of_range`` (negative or over
        ``MAX_TERM``) or ``term_jump`` (more than ``max_term_jump`` above the highest term seen, once
        a first term was heard).  Callers check a heartbeat's or order's term before using it."""
        if not 0 <= term <= MAX_TERM:
            raise ElectionError(f"term_out_of_range: term {term} is not in 0..{MAX_TERM}")
        if self._heard_term and term > self._max_seen + self.max_term_jump:
            raise ElectionError(
                f"term_jump: term {term} is more than {self.max_term_jump} above the highest term seen "
                f"({self._max_seen}); raise [election] max_term_jump if the pool really moved that far"
            )

    def observe(self, view: PeerView) -> None:
        """Record an authenticated peer's heartbeat report (its term checked by :meth:`check_term`:
        ElectionError, and nothing recorded, when it is refused).  Decisions happen in :meth:`tick`."""
        if view.node_id == self.node_id:
            return
        self.check_term(view.term)
        self._heard_term = True
        self._views[view.node_id] = view
        self._max_seen = max(self._max_seen, view.term)

    def forget(self, node_id: str) -> None:
        """Drop what a peer reported (e.g. it left the pool).  Liveness itself comes via ``tick``."""
        self._views.pop(node_id, None)

    def _prio(self, node_id: str) -> int:
        if node_id == self.node_id:
            return self.priority
        v = self._views.get(node_id)
        return v.priority if v is not None else 0

    def _claim_key(self, term: int, coord: str) -> tuple[int, int, str]:
        # Smallest is best: highest term, then the best candidate.
        return (-term, -self._prio(coord), coord)

    def _set(self, coordinator: str | None, term: int, reason: str) -> Change | None:
        before = self.status
        self._coordinator = coordinator
        self._term = term
        self._max_seen = max(self._max_seen, term)
        after = self.status
        if after == before:
            return None
        self.transitions += 1
        return Change(before, after, reason)

    def tick(self, now: float, live_peers: Collection[str]) -> Change | None:
        """Re-decide with the peers whose heartbeats are current; return the change, if any."""
        live = {p for p in live_peers if p in self._views and p != self.node_id}
        alive = live | {self.node_id}

        # 1. The best live claim, ours included (a claim is live when its coordinator is).
        claims: list[tuple[int, str]] = []
        if self._coordinator is not None and self._coordinator in alive:
            claims.append((self._term, self._coordinator))
        named_me = -1  # highest term at which a live peer names this node coordinator
        for p in live:
            v = self._views[p]
            if v.coordinator is None:
                continue
            if v.coordinator == self.node_id:
                named_me = max(named_me, v.term)
            elif v.coordinator in alive:
                claims.append((v.term, v.coordinator))
        holds = self.role is Role.COORDINATOR and self._term >= named_me
        if named_me >= 0 and not holds and not any(t >= named_me for t, _ in claims):
            # Peers still follow us at a term we do not hold (we restarted): they will not
            # elect anyone while we are live, so take the role back under a fresh term.
            return self._set(self.node_id, self._max_seen + 1, "peers follow this node: re-claiming")
        claims = [c for c in claims if c[0] >= self._term]  # older terms are stale reports
        if claims:
            term, coord = min(claims, key=lambda c: self._claim_key(*c))
            if (term, coord) != (self._term, self._coordinator):
                why = "stepping down for" if self.role is Role.COORDINATOR else "following"
                return self._set(coord, term, f"{why} {coord[:12]} (term {term})")
            return None

        # 2. No live coordinator.
        change = None
        if self._coordinator is not None:
            change = self._set(None, self._term, f"coordinator {self._coordinator[:12]} is not live")
        if now - self._started_at < self._grace_s:
            return change  # still learning whether someone already coordinates
        best = min(alive, key=lambda n: candidate_key(self._prio(n), n))
        if best == self.node_id:
            claim = self._set(self.node_id, self._max_seen + 1, "best live candidate: claiming")
            return (
                claim if change is None or claim is None else Change(change.before, claim.after, claim.reason)
            )
        return change

    def check_order(self, sender_id: str, term: int) -> Change | None:
        """Accept an order from ``sender_id`` at ``term``, or raise ElectionError.

        Refused: a term below the highest seen (``stale_term``), or the current term
        from a node that is not its coordinator (``not_coordinator``).  A higher term
        is a claim by the sender: this node follows it and returns that change.  A term
        :meth:`check_term` refuses is refused first (``term_out_of_range``, ``term_jump``).
        """
        self.check_term(term)
        if term < self._max_seen or term < self._term:
            raise ElectionError(f"stale_term: order of term {term} but term {self._max_seen} was seen")
        if term == self._term:
            if sender_id != self._coordinator:
                raise ElectionError(
                    f"not_coordinator: {sender_id[:12]} is not the coordinator of term {term}"
                )
            return None
        self._heard_term = True
        return self._set(sender_id, term, f"order from {sender_id[:12]} with a new term {term}")
