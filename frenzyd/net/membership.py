"""Membership and failure detection by SWIM: who is in the pool, with per-member work flat in its size (pure).

Each ``period_s`` a member probes one other member (a shuffled round-robin over the members it
knows): a ``swim.ping`` it must answer with a ``swim.ack`` within ``ack_timeout_s``; failing that,
``indirect_k`` other members are asked to probe it (``swim.ping_req``) and forward its ack.  A member
no one could reach by the end of the period is *suspect*; a suspect that does not refute it within
the suspicion timeout is declared *dead*.  Every member that hears a suspicion starts its own timer,
so the declaration does not wait for the suspecter's word to spread.

The timeout is Lifeguard's (Dadgar, Phillips, Currey 2018, section IV-B): it starts at
``max = suspicion_max_mult x min`` and shrinks towards ``min`` (``suspicion_mult`` x log10(n + 1) x
``period_s``, at least ``suspicion_min_s``) as independent confirmations arrive -- suspect entries
whose ``by`` names another member whose own probe failed -- reaching ``min`` at ``suspicion_k`` of
them: ``max - (max - min) x log(C + 1) / log(k + 1)``.  A member one slow prober suspects has the
long timeout to refute; one that many cannot reach is declared dead after ``min``.  A new
confirmation is gossiped on (at most ``k`` per suspicion), so the others' timers shrink too.

States are ordered by incarnation, then ``alive < suspect < dead``; only a member itself raises its
incarnation, to refute a suspicion (or an old death) about itself, or to say that its election view
(term, coordinator) changed.  Changes ride on the pings, ping-reqs and acks (at most
``max_piggyback`` per message), each sent ``retransmit_mult`` x ceil(log10(n + 1)) times: bounded
dissemination.  A member joins by a full-state ``swim.sync`` with a seed (a static peer or an
address mDNS found); the receiver answers with its own list.

A member that misses acks or must refute suspicions of itself is probably the slow one (a loaded
host, a starved process): Lifeguard's local health raises its own ack timeout and probe period by
``1 + health`` (``health`` at most ``max_health``, down by one per acked probe), so it suspects others
less while it is slow itself.

Nothing here reads a clock, draws unseeded randomness or does I/O: ``tick(now)`` and
``receive(sender, message, now)`` return the messages to send (:class:`Outgoing`), the driver
(``frenzyd.net.gossip``) moves them, and ``next_wake()`` says when to tick again.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final

from frenzyd.net.messages import (
    MAX_SYNC_ENTRIES,
    MemberEntry,
    SwimAck,
    SwimPing,
    SwimPingReq,
    SwimSync,
)

ALIVE: Final = 0
SUSPECT: Final = 1
DEAD: Final = 2
LEFT: Final = 3

SwimMessage = SwimPing | SwimPingReq | SwimAck | SwimSync


@dataclass(frozen=True, slots=True)
class Params:
    """The protocol's timing and bounds (the defaults detect a dead member among 1,000 within ~10 s)."""

    period_s: float = 0.5
    """One probe per member per period."""
    ack_timeout_s: float = 0.2
    """Wait this long for a direct ack before asking others to probe (must exceed a round trip)."""
    indirect_k: int = 3
    """Members asked to probe a target that did not answer."""
    suspicion_mult: float = 3.0
    suspicion_min_s: float = 2.0
    """The timeout's floor (Lifeguard's ``min``, reached at ``suspicion_k`` confirmations)."""
    suspicion_max_mult: float = 6.0
    """Lifeguard's ``max`` = this x ``min``: the timeout of a suspicion nobody else confirms."""
    suspicion_k: int = 3
    """Independent confirmations (suspecters other than the first) that bring the timeout to ``min``;
    at most half of those who could confirm (n - 2) in a small pool."""
    retransmit_mult: int = 4
    max_piggyback: int = 8
    """Membership changes carried by one message."""
    forget_dead_s: float = 300.0
    """A dead or departed member's entry is forgotten this long after it died (it may rejoin sooner
    with a higher incarnation)."""
    max_health: int = 8
    """Lifeguard's local health multiplier cap: timeouts grow up to (1 + this) x while unhealthy."""
    sync_seeds_s: float = 30.0
    """While a seed address is not a live member, a sync is sent to it this often (partitions heal)."""
    anti_entropy_s: float = 30.0
    """A full-state sync with one random live member this often, times max(1, log2(n / 32)) past 32
    members (memberlist's push-pull scaling): what gossip alone spreads slowly (many members joining
    at once) is reconciled, at a cost per member that grows only with log n x n / interval."""

    def __post_init__(self) -> None:
        if not 0 < self.ack_timeout_s < self.period_s:
            raise ValueError("membership: ack_timeout_s must be > 0 and below period_s")
        if self.indirect_k < 0 or self.max_piggyback < 1 or self.retransmit_mult < 1:
            raise ValueError("membership: indirect_k >= 0, max_piggyback >= 1, retransmit_mult >= 1")
        if self.suspicion_min_s <= 0 or self.suspicion_mult <= 0:
            raise ValueError("membership: suspicion_min_s and suspicion_mult must be > 0")
        if self.suspicion_max_mult < 1 or self.suspicion_k < 0:
            raise ValueError("membership: suspicion_max_mult must be >= 1 and suspicion_k >= 0")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A message for the driver to send to ``address`` (``node_id`` when the receiver is known)."""

    address: str
    node_id: str | None
    message: SwimMessage


@dataclass(slots=True)
class _Probe:
    target: str
    seq: int
    started: float
    indirect_at: float | None = None
    acked: bool = False


@dataclass(slots=True)
class _Suspicion:
    """One suspicion this node's timer runs (Lifeguard): when it started, its bounds, and who suspects."""

    incarnation: int
    started: float
    min_s: float
    max_s: float
    k: int
    suspecters: set[str]
    """The first suspecter and every independent confirmation since."""

    def timeout(self) -> float:
        c = len(self.suspecters) - 1  # confirmations: suspecters other than the first
        if self.k < 1 or c >= self.k:
            return self.min_s
        frac = math.log(c + 1) / math.log(self.k + 1)
        return max(self.min_s, self.max_s - (self.max_s - self.min_s) * frac)

    def deadline(self) -> float:
        return self.started + self.timeout()


def suspicion_bounds(params: Params, n: int) -> tuple[float, float, int]:
    """Lifeguard's ``(min, max, k)`` for a pool of ``n`` live members (this node and the suspect
    included).  ``k`` is at most half the members who could confirm (n - 2): confirmations travel by
    gossip, and waiting for every other member of a small pool would give it the long timeout."""
    lo = max(params.suspicion_min_s, params.suspicion_mult * math.log10(n + 1) * params.period_s)
    return lo, params.suspicion_max_mult * lo, max(0, min(params.suspicion_k, (n - 2) // 2))


@dataclass(slots=True)
class _Queued:
    entry: MemberEntry
    sent: int = 0


@dataclass(slots=True)
class _Forward:
    requester: str
    address: str
    seq: int
    target: str
    until: float


def _beats(new: MemberEntry, old: MemberEntry) -> bool:
    """Whether ``new`` supersedes ``old`` (the same member): a higher incarnation, or the same one in a
    worse state (``left`` counts as ``dead``)."""
    if new.incarnation != old.incarnation:
        return new.incarnation > old.incarnation
    return min(new.state, DEAD) > min(old.state, DEAD)


class Membership:
    """One member's view of the pool and its side of the protocol.

    ``counters``: ``suspected`` (members this node began suspecting on its own probe), ``suspicions``
    (suspect entries accepted, from own probes or gossip), ``deaths``, ``refuted`` (suspicions of this
    node it answered), ``dropped`` (messages refused, by reason).  ``changes`` lists entries whose state
    changed since the driver last called :meth:`drain_changes`.
    """

    def __init__(
        self,
        me: MemberEntry,
        params: Params | None = None,
        *,
        rng: random.Random,
        seeds: Sequence[str] = (),
    ) -> None:
        if me.state != ALIVE:
            raise ValueError("a member starts alive")
        self.params = params or Params()
        self._rng = rng
        self._me = me
        self._members: dict[str, MemberEntry] = {}
        self._live_count = 0
        self._dead_at: dict[str, float] = {}
        self._suspicions: dict[str, _Suspicion] = {}
        self._queue: dict[str, _Queued] = {}
        self._order: list[str] = []
        self._next_probe: float | None = None  # the first tick picks a random phase in the period
        self._probe: _Probe | None = None
        self._forwards: dict[int, _Forward] = {}
        self.health = 0
        """Lifeguard's local health: 0 when this member's probes are answered in time."""
        self._seq = 0
        self._seeds = list(dict.fromkeys(seeds))
        self._seed_sync_at: dict[str, float] = {}
        self._next_housekeeping = 0.0
        self._next_anti_entropy: float | None = None
        self._resync_at: float | None = None
        self._joined_via: list[str] = []
        self._resyncs_left = 0
        self.changes: list[MemberEntry] = []
        self.counters: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    # --- read side ---------------------------------------------------------------------------

    @property
    def me(self) -> MemberEntry:
        return self._me

    def get(self, node_id: str) -> MemberEntry | None:
        return self._me if node_id == self._me.node_id else self._members.get(node_id)

    def entries(self) -> list[MemberEntry]:
        """Every member known (dead ones until forgotten), this node excluded."""
        return list(self._members.values())

    def live(self) -> list[str]:
        """Node ids of the other members alive or suspect (a suspect is live until declared dead)."""
        return [n for n, e in self._members.items() if e.state <= SUSPECT]

    def is_live(self, node_id: str) -> bool:
        e = self._members.get(node_id)
        return e is not None and e.state <= SUSPECT

    def size(self) -> int:
        """Live members, this node included: the ``n`` the timeouts and retransmissions scale with."""
        return 1 + self._live_count

    def drain_changes(self) -> list[MemberEntry]:
        """The entries whose state, address or view changed since the last call (the driver feeds the
        peer table and the election from them)."""
        out, self.changes = self.changes, []
        return out

    def suspicion_timeout(self, confirmations: int | None = None) -> float:
        """The timeout of a suspicion starting now with ``confirmations`` independent confirmations
        (None: fully confirmed, Lifeguard's ``min``)."""
        lo, hi, k = suspicion_bounds(self.params, self.size())
        if confirmations is None:
            return lo
        return _Suspicion(0, 0.0, lo, hi, k, {str(i) for i in range(confirmations + 1)}).timeout()

    def suspecters(self, node_id: str) -> set[str]:
        """Who this node counts as suspecting ``node_id`` now (empty when it is not suspect)."""
        s = self._suspicions.get(node_id)
        return set() if s is None else set(s.suspecters)

    def suspicion_deadline(self, node_id: str) -> float | None:
        """When this node will declare ``node_id`` dead unless it refutes (None: not suspect)."""
        s = self._suspicions.get(node_id)
        return None if s is None else s.deadline()

    def _ack_timeout(self) -> float:
        return self.params.ack_timeout_s * (1 + self.health)

    def retransmits(self) -> int:
        return self.params.retransmit_mult * max(1, math.ceil(math.log10(self.size() + 1)))

    def next_wake(self) -> float:
        """When :meth:`tick` has something to do next (the earliest probe step, timer or sync)."""
        if self._next_probe is None:
            return 0.0
        times = [self._next_probe]
        if self._probe is not None and not self._probe.acked and self._probe.indirect_at is None:
            times.append(self._probe.started + self._ack_timeout())
        if self._suspicions:
            times.append(min(s.deadline() for s in self._suspicions.values()))
        return min(times)

    # --- this node's own entry ---------------------------------------------------------------

    def set_view(self, *, term: int, coordinator: str | None, priority: int | None = None,
                 address: str | None = None) -> bool:
        """Say this node's election view (and priority or address) changed: a new incarnation of its
        entry, gossiped.  Returns whether anything changed."""
        new = replace(self._me, term=term, coordinator=coordinator,
                      priority=self._me.priority if priority is None else priority,
                      address=self._me.address if address is None else address)
        if new == self._me:
            return False
        self._me = replace(new, incarnation=self._me.incarnation + 1)
        self._enqueue(self._me)
        return True

    def leave(self) -> list[Outgoing]:
        """A graceful departure: this node's ``left`` entry to ``indirect_k + 1`` live members (who
        gossip it on)."""
        self._me = replace(self._me, state=LEFT, incarnation=self._me.incarnation + 1)
        targets = self._rng.sample(self.live(), min(len(self.live()), self.params.indirect_k + 1))
        return [self._ping_to(t, updates=(self._me,)) for t in targets]

    # --- joining -----------------------------------------------------------------------------

    def join(self, addresses: Iterable[str], now: float) -> list[Outgoing]:
        """A full-state sync to each address (seeds at start, an address mDNS found later)."""
        self.counters["syncs_sent"] += 1
        full = self._full_state()
        out = [Outgoing(a, None, SwimSync(self._me, full, True)) for a in dict.fromkeys(addresses)
               if a and a != self._me.address]
        if out and self._resync_at is None:
            # A seed answers with what it knows now; members that join with it after that reach us by
            # gossip, slowly when many join at once: two more syncs with it soon after.
            self._resync_at = now + self._rng.uniform(2.0, 6.0) * self.params.period_s
            self._resyncs_left = 2
            self._joined_via = [o.address for o in out]
        return out

    def _full_state(self) -> tuple[MemberEntry, ...]:
        others = [e for e in self._members.values() if e.state <= SUSPECT]
        return (self._me, *others[: MAX_SYNC_ENTRIES - 1])

    # --- the protocol ------------------------------------------------------------------------

    def tick(self, now: float) -> list[Outgoing]:
        """Advance the probe, the suspicion timers and the seed syncs to ``now``."""
        out: list[Outgoing] = []
        p = self.params
        if self._next_probe is None:  # members started together must not probe in lockstep
            self._next_probe = now + self._rng.uniform(0.0, p.period_s)
            return out
        probe = self._probe
        if probe is not None and not probe.acked and probe.indirect_at is None \
                and now >= probe.started + self._ack_timeout():
            probe.indirect_at = now
            out.extend(self._ping_reqs(probe))
            # A driver that ticked late (a loaded machine) still gives the indirect probes their time.
            self._next_probe = max(self._next_probe, now + (p.period_s - p.ack_timeout_s) * (1 + self.health))
        if now >= self._next_probe:
            if probe is not None:
                self.health = max(0, self.health - 1) if probe.acked else min(p.max_health, self.health + 1)
            if probe is not None and not probe.acked:
                suspect = self._suspect(probe.target, now)
                if suspect is not None:  # tell it at once: a live but slow member refutes sooner
                    out.append(self._ping_to(probe.target, updates=(suspect,)))
            self._probe = None
            target = self._next_target()
            if target is not None:
                self._seq += 1
                self._probe = _Probe(target, self._seq, now)
                out.append(self._ping_to(target, seq=self._seq))
            self._next_probe = now + p.period_s * (1 + self.health)
            if self._resync_at is not None and now >= self._resync_at:
                self._resyncs_left -= 1
                self._resync_at = None
                if self._resyncs_left:
                    self._resync_at = now + self._rng.uniform(6.0, 12.0) * p.period_s
                via = self._rng.choice(self._joined_via)
                out.append(Outgoing(via, None, SwimSync(self._me, self._full_state(), True)))
            if now >= self._next_housekeeping:
                self._next_housekeeping = now + 10 * p.period_s
                self._expire(now)
                out.extend(self._seed_syncs(now))
                out.extend(self._anti_entropy(now))
        for node_id, s in list(self._suspicions.items()):
            if now >= s.deadline():
                self._declare_dead(node_id, now)
        return out

    def receive(self, sender: str, msg: SwimMessage, now: float) -> list[Outgoing]:
        """Take one message from the authenticated node ``sender``; return the replies.  A message
        whose ``src`` names another node than its sender is dropped (``identity_mismatch``)."""
        if msg.src.node_id != sender:
            self.dropped["identity_mismatch"] += 1
            return []
        if sender == self._me.node_id:
            self.dropped["from_self"] += 1
            return []
        self.merge(msg.src, now)  # news about the sender itself (a join, a new view) is gossiped on
        held = self._members.get(sender)
        if held is not None and held.state != ALIVE:
            self._enqueue(held)  # it speaks, yet we hold it suspect or dead: let it hear, and refute
        if isinstance(msg, SwimSync):
            for e in msg.entries:
                self.merge(e, now, gossip=False)
            if msg.reply:
                return [Outgoing(msg.src.address, sender, SwimSync(self._me, self._full_state(), False))]
            return []
        for e in msg.updates:
            self.merge(e, now)
        if isinstance(msg, SwimPing):
            return [Outgoing(msg.src.address, sender,
                             SwimAck(msg.seq, self._me, self._me.node_id, self._piggyback()))]
        if isinstance(msg, SwimPingReq):
            if msg.target == self._me.node_id:  # asked to probe ourselves: we are the answer
                return [Outgoing(msg.src.address, sender,
                                 SwimAck(msg.seq, self._me, self._me.node_id, self._piggyback()))]
            self._seq += 1
            self._forwards[self._seq] = _Forward(sender, msg.src.address, msg.seq, msg.target,
                                                 now + self.params.period_s)
            ping = SwimPing(self._seq, self._me, self._piggyback())
            return [Outgoing(msg.target_address, msg.target, ping)]
        # An ack: ours, or one to forward.
        probe = self._probe
        if probe is not None and msg.seq == probe.seq and msg.of == probe.target:
            probe.acked = True
            return []
        fwd = self._forwards.pop(msg.seq, None)
        if fwd is not None and fwd.target == sender:
            ack = SwimAck(fwd.seq, self._me, fwd.target, self._piggyback())
            return [Outgoing(fwd.address, fwd.requester, ack)]
        return []

    # --- merging what others say -------------------------------------------------------------

    def merge(self, entry: MemberEntry, now: float, *, gossip: bool = True) -> bool:
        """Take one entry from gossip or a sync; return whether it changed this node's view."""
        me = self._me
        if entry.node_id == me.node_id:
            if entry.incarnation >= me.incarnation and (entry.state != ALIVE or entry != me) \
                    and me.state == ALIVE:
                # Suspected, declared dead, or an older life of ours is still gossiped: refute.
                self._me = replace(me, incarnation=entry.incarnation + 1)
                self.counters["refuted"] += 1
                self.health = min(self.params.max_health, self.health + 1)
                self._enqueue(self._me)
                return True
            return False
        old = self._members.get(entry.node_id)
        if old is not None and old.state == SUSPECT and entry.state == SUSPECT \
                and entry.incarnation == old.incarnation:
            return self._confirm(entry, gossip=gossip)
        if old is not None and not _beats(entry, old):
            return False  # older news, or the same incarnation again (the first word stands)
        if old is None and entry.state >= DEAD:
            return False  # never knew it: nothing to forget
        self._members[entry.node_id] = entry
        self._live_count += (entry.state <= SUSPECT) - (old is not None and old.state <= SUSPECT)
        if entry.state >= DEAD:
            self._dead_at.setdefault(entry.node_id, now)
        else:
            self._dead_at.pop(entry.node_id, None)
        if old is None or replace(old, incarnation=entry.incarnation) != entry:
            self.changes.append(entry)
        if entry.state == SUSPECT:
            self.counters["suspicions"] += 1
            lo, hi, k = suspicion_bounds(self.params, self.size())
            self._suspicions[entry.node_id] = _Suspicion(entry.incarnation, now, lo, hi, k, {entry.by or ""})
        else:
            self._suspicions.pop(entry.node_id, None)
            if entry.state >= DEAD and (old is None or old.state <= SUSPECT):
                self.counters["deaths"] += 1
        if entry.state <= SUSPECT and entry.node_id not in self._order:
            # A new member goes at a random place in this round's order (SWIM's round-robin).
            self._order.insert(self._rng.randint(0, len(self._order)), entry.node_id)
        if gossip:
            self._enqueue(entry)
        return True

    def _confirm(self, entry: MemberEntry, *, gossip: bool) -> bool:
        """A suspect entry at the incarnation this node already suspects: a confirmation when its
        ``by`` is a suspecter not counted yet (and fewer than ``k`` are); gossiped on when new."""
        s = self._suspicions.get(entry.node_id)
        if s is None or entry.by is None or entry.by in s.suspecters or s.incarnation != entry.incarnation \
                or len(s.suspecters) - 1 >= s.k:
            return False
        s.suspecters.add(entry.by)
        self.counters["confirmations"] += 1
        if gossip:
            self._enqueue(entry)
        return True

    def _suspect(self, node_id: str, now: float) -> MemberEntry | None:
        """This node's own evidence that ``node_id`` does not answer: a new suspicion, or a confirmation
        of one it holds.  Returns the entry to tell the member (None when nothing changed)."""
        cur = self._members.get(node_id)
        if cur is None or cur.state > SUSPECT:
            return None
        entry = replace(cur, state=SUSPECT, by=self._me.node_id)
        if cur.state == SUSPECT:
            if not self._confirm(entry, gossip=True):
                return None
        else:
            self.merge(entry, now)
        self.counters["suspected"] += 1
        return entry

    def unreachable(self, node_id: str, now: float) -> list[Outgoing]:
        """The driver could not reach live member ``node_id`` by other means (the daemon's heartbeat to
        it failed): first-hand evidence, like a failed probe.  Suspects it or confirms the suspicion;
        returns the ping that tells the member (so a live one refutes at once)."""
        entry = self._suspect(node_id, now)
        return [] if entry is None else [self._ping_to(node_id, updates=(entry,))]

    def _declare_dead(self, node_id: str, now: float) -> None:
        self._suspicions.pop(node_id, None)
        cur = self._members.get(node_id)
        if cur is None or cur.state != SUSPECT:
            return
        self.merge(replace(cur, state=DEAD, by=None), now)

    def _expire(self, now: float) -> None:
        keep = self.params.forget_dead_s
        for node_id in [n for n, t in self._dead_at.items() if now - t >= keep]:
            del self._dead_at[node_id]
            self._members.pop(node_id, None)
        for seq in [s for s, f in self._forwards.items() if f.until <= now]:
            del self._forwards[seq]

    def _seed_syncs(self, now: float) -> list[Outgoing]:
        if not self._seeds:
            return []
        live_at = {e.address for e in self._members.values() if e.state <= SUSPECT}
        due = [s for s in self._seeds if s not in live_at and s != self._me.address
               and now >= self._seed_sync_at.get(s, 0.0)]
        for s in due:
            self._seed_sync_at[s] = now + self.params.sync_seeds_s
        return self.join(due, now) if due else []

    def _anti_entropy(self, now: float) -> list[Outgoing]:
        n = self.size()
        interval = self.params.anti_entropy_s * max(1.0, math.log2(max(n, 1) / 32))
        if self._next_anti_entropy is None:  # spread the pool's syncs over the interval
            self._next_anti_entropy = now + self._rng.uniform(0.5, 1.0) * interval
        if now < self._next_anti_entropy:
            return []
        self._next_anti_entropy = now + interval
        return self._sync_random()

    def _sync_random(self) -> list[Outgoing]:
        live = self.live()
        if not live:
            return []
        peer = self._members[self._rng.choice(live)]
        self.counters["syncs_sent"] += 1
        return [Outgoing(peer.address, peer.node_id, SwimSync(self._me, self._full_state(), True))]

    # --- sending -----------------------------------------------------------------------------

    def _next_target(self) -> str | None:
        while True:
            if not self._order:
                live = self.live()
                if not live:
                    return None
                self._rng.shuffle(live)
                self._order = live
            node_id = self._order.pop()
            if self.is_live(node_id):
                return node_id

    def _ping_to(self, node_id: str, *, seq: int = 0,
                 updates: tuple[MemberEntry, ...] | None = None) -> Outgoing:
        e = self._members[node_id]
        ping = SwimPing(seq, self._me, self._piggyback() if updates is None else updates)
        return Outgoing(e.address, node_id, ping)

    def _ping_reqs(self, probe: _Probe) -> list[Outgoing]:
        target = self._members.get(probe.target)
        if target is None:
            return []
        helpers = [n for n in self.live() if n != probe.target]
        chosen = self._rng.sample(helpers, min(len(helpers), self.params.indirect_k))
        out = []
        for h in chosen:
            e = self._members[h]
            out.append(Outgoing(e.address, h, SwimPingReq(probe.seq, self._me, probe.target, target.address,
                                                          self._piggyback())))
        return out

    def _enqueue(self, entry: MemberEntry) -> None:
        self._queue[entry.node_id] = _Queued(entry)

    def _piggyback(self) -> tuple[MemberEntry, ...]:
        """Up to ``max_piggyback`` queued changes, the least sent first; each is dropped from the queue
        once sent :meth:`retransmits` times."""
        if not self._queue:
            return ()
        limit = self.retransmits()
        k = self.params.max_piggyback
        items = list(self._queue.values())
        picked = items if len(items) <= k else heapq.nsmallest(k, items, key=lambda q: q.sent)
        for q in picked:
            q.sent += 1
            if q.sent >= limit:
                del self._queue[q.entry.node_id]
        return tuple(q.entry for q in picked)
