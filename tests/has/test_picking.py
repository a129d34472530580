"""GPU picking: pick_packed against a spelled-out rule; Frenzy's sorted peer index (and its peer counts)
against pick_packed; the index kept between rounds against one built afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.has.free_gpus import FreeGpus, FreeTracker
from frenzyd.has.free_gpus import fullest_first as _fullest_first
from frenzyd.has.free_gpus import pick_ordered as _pick_ordered
from frenzyd.has.free_gpus import take_chunks as _take
from frenzyd.has.interface import Gpu, pick_packed
from frenzyd.marp.spec import Plan

# Free GPUs of one type: per peer (names that sort in a different order than they are drawn), 0-8 each.
free_maps = st.dictionaries(
    st.sampled_from(["p-b", "p-a", "p-d", "p-c", "q", "p-e", "z-1", "a-9"]),
    st.lists(st.integers(0, 7), unique=True, max_size=8),
    max_size=8,
)


def _by_peer(spec: dict[str, list[int]]) -> dict[str, list[Gpu]]:
    # Lists in the order drawn (not sorted): picks must sort, as GPUs given back are appended.
    return {peer: [Gpu(peer, i, "T4") for i in idx] for peer, idx in spec.items()}


def _reference(by_peer: dict[str, list[Gpu]], n: int, tp: int) -> list[Gpu] | None:
    """The documented rule, spelled out: best-fit single peer, else fullest peers first, whole tp groups."""
    holding = sorted((len(gs), peer) for peer, gs in by_peer.items() if len(gs) >= n)
    if holding:
        return sorted(by_peer[holding[0][1]])[:n]
    chosen: list[Gpu] = []
    for _, peer in sorted((-len(gs), peer) for peer, gs in by_peer.items()):
        take = min(len(by_peer[peer]) // tp * tp, n - len(chosen)) // tp * tp
        chosen += sorted(by_peer[peer])[:take]
        if len(chosen) == n:
            return chosen
    return None


@settings(max_examples=300, deadline=None)
@given(free_maps, st.integers(1, 20), st.sampled_from([1, 2, 4]))
def test_pick_packed_follows_its_rule(spec: dict[str, list[int]], n: int, tp: int) -> None:
    n = -(-n // tp) * tp  # plans use whole tp groups
    by_peer = _by_peer(spec)
    assert pick_packed(by_peer, n, tp) == _reference(by_peer, n, tp)


@settings(max_examples=300, deadline=None)
@given(free_maps, st.lists(st.tuples(st.integers(1, 12), st.sampled_from([1, 2, 4])), max_size=6))
def test_sorted_peer_index_picks_as_pick_packed_and_stays_sorted(
    spec: dict[str, list[int]], asks: list[tuple[int, int]]
) -> None:
    """Frenzy keeps a type's peers fullest first across placements; every pick equals pick_packed's."""
    by_peer = {peer: gs for peer, gs in _by_peer(spec).items() if gs}  # as Frenzy indexes free GPUs
    fullest = _fullest_first(by_peer)
    for ask, tp in asks:
        n = -(-ask // tp) * tp
        expected = pick_packed({p: list(gs) for p, gs in by_peer.items()}, n, tp)
        before = {p: set(gs) for p, gs in by_peer.items()}
        chunks = _pick_ordered(by_peer, fullest, n, tp)
        got = None if chunks is None else [g for c in chunks for g in c.taken]
        assert got == expected
        if chunks is not None:
            for c in chunks:  # each chunk: one peer's free GPUs before, split into taken and the rest
                assert c.had == len(before[c.peer])
                assert set(c.taken) | set(c.rest) == before[c.peer]
            _take(by_peer, fullest, chunks)
            assert fullest == _fullest_first(by_peer)
            assert all(by_peer.values()), "a peer left with no free GPU is dropped"
            left_free = {g for gs in by_peer.values() for g in gs}
            taken = {g for c in chunks for g in c.taken}
            assert left_free == {g for gs in before.values() for g in gs} - taken


@settings(max_examples=300, deadline=None)
@given(
    free_maps,
    st.lists(st.tuples(st.sampled_from(["ask", "place", "take", "give"]), st.integers(1, 24),
                       st.sampled_from([1, 2, 4])), max_size=12),
)
def test_index_peer_counts_match_the_pick_through_every_change(
    spec: dict[str, list[int]], ops: list[tuple[str, int, int]]
) -> None:
    """``FreeGpus.peers_for`` (cached per type and tp degree) counts the peers pick_packed's choice spans,
    after any mix of placements, takes and gives: a cache that outlived a change would miscount."""
    free = FreeGpus(g for gs in _by_peer(spec).values() for g in sorted(gs))
    out: list[Gpu] = []
    for op, ask, tp in ops:
        n = -(-ask // tp) * tp
        pool = {p: list(gs) for p, gs in free.by_type.get("T4", {}).items()}
        expected = pick_packed(pool, n, tp)
        assert free.peers_for("T4", n, tp) == (0 if expected is None else len({g.peer for g in expected}))
        if op == "place" and expected is not None:
            plan = Plan(gpu_type="T4", gpus=n, dp=n // tp, tp=tp, pp=1, zero=3, micro_batch=1, grad_accum=1,
                        bytes_per_gpu=1, gpu_memory_bytes=2, step_time_s=1.0)
            got = free.place(plan)
            assert got == expected
            out += got or []
        elif op == "take" and expected is not None:
            free.take("T4", expected)
            out += expected
        elif op == "give" and out:
            back, out = out[:ask], out[ask:]
            free.give(back)


# A pool of 3 types on 5 peers; each round frees a subset of it, drawn as GPU positions.
_POOL = [Gpu(peer, i, t)
         for peer, t in (("a", "T4"), ("b", "T4"), ("c", "A100"), ("d", "V100"), ("e", "A100"))
         for i in range(4)]
rounds = st.lists(st.lists(st.integers(0, len(_POOL) - 1), unique=True, max_size=len(_POOL)), max_size=8)


def _content(free: FreeGpus) -> tuple[dict[str, dict[str, set[Gpu]]], dict[str, int]]:
    """What an index holds, its lists' order aside (every pick sorts)."""
    return {t: {p: set(gs) for p, gs in by_peer.items()} for t, by_peer in free.by_type.items()}, free.count


@settings(max_examples=300, deadline=None)
@given(rounds, st.data())
def test_tracker_index_equals_a_fresh_build_whatever_the_last_round_did(
    picks: list[list[int]], data: st.DataObject
) -> None:
    """Each round's index from :class:`FreeTracker` holds exactly that round's free GPUs, as a fresh
    ``FreeGpus`` does, however the round before changed its own index (places, takes, gives): the
    per-peer lists the two share must never change in place."""
    tracker = FreeTracker()
    for pick in picks:
        free = tuple(sorted(_POOL[i] for i in pick))  # a snapshot lists GPUs by peer
        # New but equal GPU objects: the difference is by value, not identity.
        if data.draw(st.booleans()):
            free = tuple(Gpu(g.peer, g.index, g.gpu_type) for g in free)
        got = tracker.index(free)
        assert _content(got) == _content(FreeGpus(free))
        # The round uses its index as Frenzy's rules do; none of it may leak into the next round.
        for t in sorted(got.by_type):
            n = data.draw(st.integers(0, got.count[t]))
            plan = Plan(gpu_type=t, gpus=n, dp=n, tp=1, pp=1, zero=3, micro_batch=1, grad_accum=1,
                        bytes_per_gpu=1, gpu_memory_bytes=2, step_time_s=1.0)
            taken = got.place(plan) if n else None
            if taken and data.draw(st.booleans()):
                got.give(taken[:1])
        held = [g for g in _POOL if g not in free][:2]
        got.give(held)
