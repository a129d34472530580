"""A deterministic discrete-event pool for the membership core: virtual time, a fixed delay, seeded loss.

Every message goes through the real wire codec (encode, decode, parse) on its way, so the tests see
what a peer would receive.  Nothing here sleeps or reads a clock: ``run_until(t)`` moves virtual time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field

from frenzyd.net import wire
from frenzyd.net.membership import ALIVE, DEAD, SUSPECT, Membership, Outgoing, Params, SwimMessage
from frenzyd.net.messages import MemberEntry


def node_id(i: int) -> str:
    return f"{i:032x}"


def address(i: int) -> str:
    return f"10.{i // 250 // 250}.{i // 250 % 250}.{i % 250 + 1}:7470"


@dataclass
class SimNode:
    index: int
    core: Membership
    up: bool = True
    scheduled: float = math.inf
    sent: int = 0
    sent_bytes: int = 0
    max_updates: int = 0


@dataclass
class Sim:
    """``n`` members, each with ``seeds`` of the first members as its seeds (joined at :meth:`start`)."""

    n: int
    delay_s: float = 0.005
    loss: float = 0.0
    seed: int = 0
    params: Params = field(default_factory=Params)
    seeds: int = 1
    now: float = 0.0
    incarnation: int = 1

    def __post_init__(self) -> None:
        self._events: list[tuple[float, int, str, int, object]] = []
        self._tie = itertools.count()
        self._rng = random.Random(self.seed)
        self.by_address: dict[str, int] = {}
        self.nodes: list[SimNode] = []
        self.dropped: Counter[str] = Counter()
        self.false_episodes: set[tuple[str, int]] = set()
        self.deaf: set[int] = set()
        """Members that every frame to is lost (a starved or cut-off host that still sends)."""
        self.first_dead: dict[str, dict[int, float]] = {}
        """node id -> observer index -> when it first held that node dead."""
        for i in range(self.n):
            self.add(i)

    def add(self, i: int, *, incarnation: int | None = None) -> SimNode:
        inc = incarnation or self.incarnation
        me = MemberEntry(node_id(i), f"ws-{i:04d}", address(i), 0, inc, ALIVE, 0, None)
        seeds = [address(s) for s in range(min(self.seeds, self.n)) if s != i]
        rng = random.Random(self.seed * 100_003 + i)
        node = SimNode(i, Membership(me, self.params, rng=rng, seeds=seeds))
        if i < len(self.nodes):
            self.nodes[i] = node
        else:
            self.nodes.append(node)
        self.by_address[address(i)] = i
        return node

    def start(self, indexes: list[int] | None = None) -> None:
        for i in indexes if indexes is not None else range(self.n):
            node = self.nodes[i]
            self._send(node, node.core.join(node.core._seeds, self.now))
            self._reschedule(node)

    def kill(self, i: int) -> None:
        self.nodes[i].up = False

    # --- the event loop ------------------------------------------------------------------------

    def _push(self, t: float, kind: str, i: int, payload: object = None) -> None:
        heapq.heappush(self._events, (t, next(self._tie), kind, i, payload))

    def _reschedule(self, node: SimNode) -> None:
        nw = max(self.now, node.core.next_wake())
        if nw < node.scheduled:
            node.scheduled = nw
            self._push(nw, "wake", node.index)

    def _send(self, node: SimNode, out: list[Outgoing]) -> None:
        for o in out:
            frame = wire.encode_message(o.message)
            node.sent += 1
            node.sent_bytes += len(frame)
            updates = getattr(o.message, "updates", ())
            node.max_updates = max(node.max_updates, len(updates))
            if self._rng.random() < self.loss:
                self.dropped["loss"] += 1
                continue
            to = self.by_address.get(o.address)
            if to in self.deaf:
                self.dropped["deaf"] += 1
                continue
            if to is None:
                self.dropped["no_such_address"] += 1
                continue
            self._push(self.now + self.delay_s, "msg", to, (node.core.me.node_id, frame))

    def run_until(self, t: float) -> None:
        while self._events and self._events[0][0] <= t:
            when, _, kind, i, payload = heapq.heappop(self._events)
            self.now = when
            node = self.nodes[i]
            if not node.up:
                continue
            if kind == "wake":
                if when != node.scheduled:
                    continue
                node.scheduled = math.inf
                self._send(node, node.core.tick(self.now))
            else:
                assert isinstance(payload, tuple)
                sender, frame = payload
                msg = wire.parse(wire.decode(frame))
                assert not isinstance(msg, dict)
                typed: SwimMessage = msg  # type: ignore[assignment]
                self._send(node, node.core.receive(sender, typed, self.now))
            self._observe(node)
            self._reschedule(node)
        self.now = t

    def _observe(self, node: SimNode) -> None:
        for e in node.core.drain_changes():
            if e.state == SUSPECT and self.nodes[int(e.node_id, 16)].up:
                self.false_episodes.add((e.node_id, e.incarnation))
            elif e.state >= DEAD:
                self.first_dead.setdefault(e.node_id, {}).setdefault(node.index, self.now)

    # --- what the members know -----------------------------------------------------------------

    def knows_all_alive(self) -> bool:
        up = [x for x in self.nodes if x.up]
        ids = {x.core.me.node_id for x in up}
        return all(set(x.core.live()) | {x.core.me.node_id} >= ids for x in up)

    def all_know_dead(self, i: int) -> bool:
        target = node_id(i)
        for x in self.nodes:
            if not x.up or x.index == i:
                continue
            e = x.core.get(target)
            if e is not None and e.state < DEAD:
                return False
        return True

    def false_suspicions(self) -> int:
        """Episodes (member, incarnation) in which a member that was up was suspected by anyone."""
        return len(self.false_episodes)
