"""Election: table tests of the rules, and hypothesis-driven pools of joins, crashes and restarts."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import ElectionError
from frenzyd.net.election import ElectionState, PeerView, Role

GRACE = 3.0
TIMEOUT = 4.0
DISCOVERY = 2.0


def _node(node_id: str, priority: int = 0, now: float = 0.0, term: int = 0) -> ElectionState:
    return ElectionState(node_id, priority, started_at=now, grace_s=GRACE, term=term)


def test_lone_node_waits_for_the_grace_then_claims_term_one() -> None:
    a = _node("a")
    assert a.tick(1.0, []) is None
    assert a.role is Role.PEER
    ch = a.tick(GRACE, [])
    assert ch is not None
    assert (ch.after.role, ch.after.coordinator, ch.after.term) == (Role.COORDINATOR, "a", 1)


def test_total_order_priority_then_smallest_id() -> None:
    nodes = [_node("c", 1), _node("a", 0), _node("b", 1)]
    for n in nodes:
        for m in nodes:
            n.observe(m.view())
    for n in nodes:
        n.tick(GRACE, [m.node_id for m in nodes])
    assert [n.role for n in nodes] == [Role.PEER, Role.PEER, Role.COORDINATOR]  # b: priority 1, id b < c
    for n in nodes:
        for m in nodes:
            n.observe(m.view())
    for n in nodes:
        n.tick(GRACE + 1, [m.node_id for m in nodes])
    assert {(n.coordinator, n.term) for n in nodes} == {("b", 1)}


def test_better_joiner_follows_the_sitting_coordinator() -> None:
    a = _node("m", 0)
    a.tick(GRACE, [])
    assert a.role is Role.COORDINATOR
    j = _node("a", 9, now=10.0)  # better on both keys
    j.observe(a.view())
    assert j.tick(10.5, ["m"]) is not None
    assert (j.role, j.coordinator, j.term) == (Role.PEER, "m", 1)
    a.observe(j.view())
    assert a.tick(11.0, ["a"]) is None
    assert a.role is Role.COORDINATOR


def test_failover_claims_a_higher_term_and_others_follow() -> None:
    a, b, c = _node("a", 5), _node("b", 1), _node("c", 0)
    sim = [a, b, c]
    for t in (GRACE, GRACE + 1):
        for n in sim:
            for m in sim:
                n.observe(m.view())
        for n in sim:
            n.tick(t, [m.node_id for m in sim])
    assert {n.coordinator for n in sim} == {"a"}
    # a dies: b is best among the rest.
    ch = b.tick(10.0, ["c"])
    assert ch is not None
    assert (b.role, b.term) == (Role.COORDINATOR, 2)
    c.tick(10.0, ["b"])  # c has not heard b's claim yet: no coordinator, waits (not best)
    assert (c.role, c.coordinator) == (Role.PEER, None)
    c.observe(b.view())
    c.tick(11.0, ["b"])
    assert (c.coordinator, c.term) == ("b", 2)


def test_partition_heal_same_term_better_candidate_keeps_role() -> None:
    a, b = _node("a", 0), _node("b", 0)
    a.tick(GRACE, [])
    b.tick(GRACE, [])
    assert (a.term, b.term) == (1, 1)
    a.observe(b.view())
    b.observe(a.view())
    assert a.tick(GRACE + 1, ["b"]) is None
    ch = b.tick(GRACE + 1, ["a"])
    assert ch is not None
    assert ch.reason.startswith("stepping down")
    assert (b.role, b.coordinator, b.term) == (Role.PEER, "a", 1)


def test_restarted_coordinator_reclaims_with_a_fresh_term() -> None:
    c, p = _node("c"), _node("p")
    c.tick(GRACE, [])
    p.observe(c.view())
    p.tick(1.0, ["c"])
    assert p.coordinator == "c"
    c2 = _node("c", now=20.0)  # restarted: state lost; p still follows it
    c2.observe(p.view())
    ch = c2.tick(20.1, ["p"])
    assert ch is not None
    assert (c2.role, c2.term) == (Role.COORDINATOR, 2)
    p.observe(c2.view())
    p.tick(21.0, ["c"])
    assert (p.coordinator, p.term) == ("c", 2)


def test_orders_only_from_the_coordinator_of_the_highest_term() -> None:
    p = _node("p")
    p.observe(PeerView("c", 0, 3, "c"))
    p.tick(1.0, ["c"])
    assert (p.coordinator, p.term) == ("c", 3)
    assert p.check_order("c", 3) is None
    with pytest.raises(ElectionError, match="stale_term"):
        p.check_order("c", 2)
    with pytest.raises(ElectionError, match="not_coordinator"):
        p.check_order("x", 3)
    ch = p.check_order("x", 4)  # a newer term is a claim: follow it, then refuse the old one
    assert ch is not None
    assert (p.coordinator, p.term) == ("x", 4)
    with pytest.raises(ElectionError, match="stale_term"):
        p.check_order("c", 3)


def test_stale_report_does_not_regress_the_term() -> None:
    p = _node("p")
    p.observe(PeerView("c", 0, 5, "c"))
    p.tick(1.0, ["c", "old"])
    p.observe(PeerView("old", 0, 2, "old"))
    assert p.tick(2.0, ["c", "old"]) is None
    assert (p.coordinator, p.term) == ("c", 5)


def test_deposed_claimant_does_not_reclaim_because_a_lagging_peer_still_names_it() -> None:
    b = _node("b")
    b.observe(PeerView("a", 0, 1, "a"))
    b.observe(PeerView("p", 0, 1, "b"))  # p has not yet heard that b stepped down
    b.tick(GRACE + 1, ["a", "p"])
    assert (b.role, b.coordinator, b.term) == (Role.PEER, "a", 1)


# --- property tests: a synchronous, fully connected pool ---------------------------------------


@dataclass
class Pool:
    """Every live node hears every other live node each second, once both have been up for
    DISCOVERY seconds (mDNS and the first TLS exchange take time); death is noticed after TIMEOUT."""

    now: float = 0.0
    nodes: dict[str, ElectionState] = field(default_factory=dict)
    alive: set[str] = field(default_factory=set)
    heard: dict[tuple[str, str], float] = field(default_factory=dict)
    term_log: dict[str, list[int]] = field(default_factory=dict)
    joined: dict[str, float] = field(default_factory=dict)
    side: dict[str, int] = field(default_factory=dict)
    """Partition: nodes hear each other only when on the same side (default: all on side 0)."""

    def join(self, node_id: str, priority: int) -> None:
        self.nodes[node_id] = ElectionState(node_id, priority, started_at=self.now, grace_s=GRACE)
        self.joined[node_id] = self.now
        self.alive.add(node_id)
        self.term_log[node_id] = []

    def crash(self, node_id: str) -> None:
        self.alive.discard(node_id)

    def step(self) -> None:
        self.now += 1.0
        views = {i: self.nodes[i].view() for i in self.alive}
        for i in self.alive:
            for j, v in views.items():
                if (
                    i != j
                    and self.now - max(self.joined[i], self.joined[j]) >= DISCOVERY
                    and self.side.get(i, 0) == self.side.get(j, 0)
                ):
                    self.nodes[i].observe(v)
                    self.heard[i, j] = self.now
        for i in sorted(self.alive):
            live = [j for j in self.nodes if j != i and self.now - self.heard.get((i, j), -1e9) < TIMEOUT]
            self.nodes[i].tick(self.now, live)
            self.term_log[i].append(self.nodes[i].term)

    def coordinators(self) -> list[str]:
        return [i for i in self.alive if self.nodes[i].role is Role.COORDINATOR]


_ids = st.sampled_from([f"{c}{c}" for c in "abcdef"])
_events = st.lists(
    st.tuples(st.sampled_from(["join", "crash", "wait"]), _ids, st.integers(0, 2), st.integers(1, 6)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(_events)
def test_any_history_keeps_one_coordinator_monotone_terms_and_no_displacement(events: list) -> None:
    pool = Pool()
    for kind, node_id, priority, wait in events:
        if kind == "join" and node_id not in pool.alive:
            pool.join(node_id, priority)  # a crashed id joining again is a restart
        elif kind == "crash":
            pool.crash(node_id)
        for _ in range(wait):
            before = set(pool.coordinators())
            pool.step()
            coords = pool.coordinators()
            assert len(coords) <= 1, f"two live coordinators at t={pool.now}: {coords}"
            for c in before & pool.alive:
                assert pool.nodes[c].role is Role.COORDINATOR, f"{c} displaced at t={pool.now}"
            for i in pool.alive:
                log = pool.term_log[i]
                assert log == sorted(log), f"term of {i} went back: {log}"
    # Quiet period: everyone live agrees on one live coordinator and one term.
    if pool.alive:
        for _ in range(int(GRACE + TIMEOUT + DISCOVERY) + 3):
            pool.step()
        coords = pool.coordinators()
        assert len(coords) == 1
        views = {(pool.nodes[i].coordinator, pool.nodes[i].term) for i in pool.alive}
        assert views == {(coords[0], pool.nodes[coords[0]].term)}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(_ids, st.integers(0, 2)), min_size=2, max_size=6, unique_by=lambda t: t[0]))
def test_nodes_starting_together_elect_the_best_candidate(members: list[tuple[str, int]]) -> None:
    pool = Pool()
    for node_id, prio in members:
        pool.join(node_id, prio)
    for _ in range(int(GRACE + DISCOVERY) + 3):
        pool.step()
    best = min(members, key=lambda m: (-m[1], m[0]))[0]
    assert pool.coordinators() == [best]
    assert {pool.nodes[i].term for i in pool.alive} == {1}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(_ids, st.integers(0, 2)), min_size=2, max_size=6, unique_by=lambda t: t[0]),
    st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_partitions_heal_into_one_coordinator_with_monotone_terms(
    members: list[tuple[str, int]], split: list[bool]
) -> None:
    pool = Pool()
    for k, (node_id, prio) in enumerate(members):
        pool.join(node_id, prio)
        pool.side[node_id] = int(split[k])
    settle = int(GRACE + TIMEOUT + DISCOVERY) + 3
    for _ in range(settle):
        pool.step()
    for side in (0, 1):  # each side elected its own coordinator: split brain, made harmless elsewhere
        members_on_side = [i for i in pool.alive if pool.side[i] == side]
        if members_on_side:
            assert sum(pool.nodes[i].role is Role.COORDINATOR for i in members_on_side) == 1
    pool.side.clear()  # the network heals
    for _ in range(settle):
        pool.step()
    coords = pool.coordinators()
    assert len(coords) == 1
    assert {(pool.nodes[i].coordinator, pool.nodes[i].term) for i in pool.alive} == {
        (coords[0], pool.nodes[coords[0]].term)
    }
    for i in pool.alive:
        assert pool.term_log[i] == sorted(pool.term_log[i])
