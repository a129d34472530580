"""The free-GPU index Frenzy's rules share in a round: per type and peer, counted, fullest peers first."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from itertools import groupby
from operator import attrgetter
from typing import NamedTuple

from frenzyd.has.interface import Gpu, pick_packed
from frenzyd.marp.spec import Plan

_peer_and_type = attrgetter("peer", "gpu_type")


def _neg_count(entry: tuple[int, str]) -> int:
    return entry[0]


def fullest_first(by_peer: dict[str, list[Gpu]]) -> list[tuple[int, str]]:
    """(-free GPUs, peer) for every peer with a free GPU of one type: fullest first, ties by name."""
    return sorted([(-len(gs), p) for p, gs in by_peer.items() if gs])


def peers_needed(fullest: list[tuple[int, str]], n: int, tp: int) -> int:
    """Peers :func:`pick_packed` spans for ``n`` GPUs over several peers (fullest first); 0: impossible.

    ``fullest``: (-free GPUs, peer) per peer of one type, fullest first.  The
    same count as picking the GPUs, without building the lists: O(peers used).
    """
    return peers_within([], fullest, n, tp)


def peers_within(reached: list[int], fullest: list[tuple[int, str]], n: int, tp: int) -> int:
    """:func:`peers_needed` with memory (the walk itself): ``reached[i]`` holds the GPUs in whole tp
    groups on the first ``i + 1`` peers of ``fullest``; the list is extended only as far as ``n``
    needs and answers every smaller count by bisection."""
    if n <= 0 or n % tp:
        return 0  # whole tp groups only: a count that is not a multiple of tp is never reached
    if not reached or reached[-1] < n:
        got = reached[-1] if reached else 0
        for i in range(len(reached), len(fullest)):
            c = -fullest[i][0]
            if c < tp:
                break  # descending: no later peer holds a whole tp group either
            got += (c // tp) * tp
            reached.append(got)
            if got >= n:
                break
        if not reached or reached[-1] < n:
            return 0
    return bisect.bisect_left(reached, n) + 1


class Chunk(NamedTuple):
    """What one placement takes from one peer: the peer's free GPUs before, the ones taken, the rest."""

    peer: str
    had: int
    taken: list[Gpu]
    rest: list[Gpu]


def pick_ordered(
    by_peer: dict[str, list[Gpu]], fullest: list[tuple[int, str]], n: int, tp: int
) -> list[Chunk] | None:
    """:func:`pick_packed`'s choice, per peer, from the type's peers kept fullest first (no scan of all).

    Best fit: among the peers holding ``n`` (a prefix of ``fullest``) the one
    with fewest free GPUs, ties by name; else fullest peers first (lowest
    indices first, whole tp groups: :func:`take_in_order`).
    """
    if fullest and -fullest[0][0] >= n:
        last = bisect.bisect_right(fullest, -n, key=_neg_count) - 1  # the last peer that holds n
        # The first name among the peers with that count:
        neg, peer = fullest[bisect.bisect_left(fullest, fullest[last][0], key=_neg_count)]
        gs = sorted(by_peer[peer])
        return [Chunk(peer, -neg, gs[:n], gs[n:])]
    chunks: list[Chunk] = []
    got = 0
    for neg, peer in fullest:
        if -neg < tp:
            break  # fullest first: no later peer holds a whole tp group
        take = (min(-neg, n - got) // tp) * tp
        gs = sorted(by_peer[peer])
        chunks.append(Chunk(peer, -neg, gs[:take], gs[take:]))
        got += take
        if got == n:
            return chunks
    return None


def take_chunks(by_peer: dict[str, list[Gpu]], fullest: list[tuple[int, str]], chunks: list[Chunk]) -> None:
    """Remove a placement's GPUs from a type's free GPUs, keeping ``fullest`` sorted (empty peers dropped)."""
    for peer, had, _, rest in chunks:
        del fullest[bisect.bisect_left(fullest, (-had, peer))]
        if rest:
            by_peer[peer] = rest
            bisect.insort(fullest, (-len(rest), peer))
        else:
            del by_peer[peer]


class FreeGpus:
    """The free GPUs of one round, the one copy every rule reads and changes.

    ``by_type[t][peer]``: the free GPUs of type ``t`` on ``peer`` (a peer with
    none is dropped; list order does not matter, every pick sorts);
    ``count[t]``: how many.  No method changes a per-peer list in place (each
    change puts a new list), so indexes may share them (:meth:`sharing`).
    Per type, the peers fullest first (ties: name) are
    built on first use and kept sorted while :meth:`place` takes GPUs; any other
    change of a type drops its list, to be rebuilt when next needed.  Every
    method keeps ``by_type`` and ``count`` in step.
    """

    __slots__ = ("by_type", "count", "fullest_of", "reach_of")

    @classmethod
    def sharing(cls, other: FreeGpus) -> FreeGpus:
        """An index of ``other``'s free GPUs: its dicts copied, its per-peer lists shared (safe: no method
        changes a list in place)."""
        index = cls(())
        index.by_type = {t: dict(by_peer) for t, by_peer in other.by_type.items()}
        index.count = dict(other.count)
        return index

    def __init__(self, free: Iterable[Gpu]) -> None:
        self.by_type: dict[str, dict[str, list[Gpu]]] = {}
        self.count: dict[str, int] = {}
        self.fullest_of: dict[str, list[tuple[int, str]]] = {}
        """The per-type lists :meth:`fullest` built (read only; a type missing: call :meth:`fullest`)."""
        self.reach_of: dict[tuple[str, int], list[int]] = {}
        """Per type and tp degree, :func:`peers_within`'s counts over the type's ``fullest`` list (as far
        as asked so far), dropped with any change of the type."""
        by_type = self.by_type
        count = self.count
        # Runs of one peer and type (a snapshot lists GPUs by peer), grouped in C: O(G), few steps.
        for (peer, t), run_of in groupby(free, key=_peer_and_type):
            gs = list(run_of)
            by_peer = by_type.get(t)
            if by_peer is None:
                by_peer = by_type[t] = {}
                count[t] = 0
            on_peer = by_peer.get(peer)
            if on_peer is None:
                by_peer[peer] = gs
            else:
                on_peer.extend(gs)
            count[t] += len(gs)

    def any_free(self) -> bool:
        """Some GPU is free."""
        return any(n > 0 for n in self.count.values())

    def any_free_outside(self, excluded: set[str]) -> bool:
        """Some GPU of a type not in ``excluded`` is free."""
        return any(n > 0 for t, n in self.count.items() if t not in excluded)

    def fullest(self, gpu_type: str) -> list[tuple[int, str]]:
        """The type's peers with a free GPU as (-free GPUs, peer), fullest first (read only)."""
        fullest = self.fullest_of.get(gpu_type)
        if fullest is None:
            fullest = self.fullest_of[gpu_type] = fullest_first(self.by_type.get(gpu_type, {}))
        return fullest

    def peers_for(self, gpu_type: str, n: int, tp: int) -> int:
        """Peers a pick of ``n`` GPUs of the type (tp groups inside peers) spans; 0: not there."""
        fullest = self.fullest(gpu_type)
        if fullest and -fullest[0][0] >= n:
            return 1
        reached = self.reach_of.get((gpu_type, tp))
        if reached is None:
            reached = self.reach_of[(gpu_type, tp)] = []
        return peers_within(reached, fullest, n, tp)

    def _changed(self, gpu_type: str) -> None:
        """The type's free GPUs changed: its reach lists no longer hold."""
        if self.reach_of:
            for key in [k for k in self.reach_of if k[0] == gpu_type]:
                del self.reach_of[key]

    def place(self, plan: Plan) -> list[Gpu] | None:
        """Take GPUs for ``plan`` as :func:`pick_packed` picks them (from the sorted peers); None if short."""
        t = plan.gpu_type
        by_peer = self.by_type.get(t)
        if by_peer is None:
            return None
        fullest = self.fullest(t)
        chunks = pick_ordered(by_peer, fullest, plan.gpus, plan.tp)
        if chunks is None:
            return None
        take_chunks(by_peer, fullest, chunks)
        self._changed(t)
        gpus = [g for c in chunks for g in c.taken]
        self.count[t] -= len(gpus)
        return gpus

    def pick(self, gpu_type: str, n: int, tp: int) -> list[Gpu] | None:
        """:func:`pick_packed` over the type's free GPUs, taking nothing."""
        return pick_packed(self.by_type.get(gpu_type, {}), n, tp)

    def take(self, gpu_type: str, gpus: list[Gpu]) -> None:
        """Remove ``gpus`` (all free, of ``gpu_type``); a peer left empty is dropped."""
        by_peer = self.by_type[gpu_type]
        per: dict[str, set[Gpu]] = {}
        for g in gpus:
            per.setdefault(g.peer, set()).add(g)
        for peer, mine in per.items():
            rest = [g for g in by_peer[peer] if g not in mine]
            if rest:
                by_peer[peer] = rest
            else:
                del by_peer[peer]
        self.count[gpu_type] -= len(gpus)
        self.fullest_of.pop(gpu_type, None)
        self._changed(gpu_type)

    def give(self, gpus: Iterable[Gpu]) -> None:
        """Make ``gpus`` (a running job's, given up) free."""
        types: set[str] = set()
        for g in gpus:
            t = g.gpu_type
            by_peer = self.by_type.setdefault(t, {})
            by_peer[g.peer] = [*by_peer.get(g.peer, ()), g]  # a new list: lists may be shared (FreeTracker)
            self.count[t] = self.count.get(t, 0) + 1
            types.add(t)
        for t in types:
            self.fullest_of.pop(t, None)
            self._changed(t)

    def hand_over(self, released: list[Gpu], plan: Plan) -> list[Gpu] | None:
        """GPUs for ``plan`` from its type's free GPUs plus ``released`` (a running job's, of that type).

        When they hold it (:func:`pick_packed`), the released GPUs become free
        and the chosen ones are taken; else nothing changes and None is returned.
        """
        t = plan.gpu_type
        pool = {peer: list(gs) for peer, gs in self.by_type.get(t, {}).items()}
        for g in released:
            pool.setdefault(g.peer, []).append(g)
        gpus = pick_packed(pool, plan.gpus, plan.tp)
        if gpus is None:
            return None
        self.give(released)
        self.take(t, gpus)
        return gpus


class FreeTracker:
    """The free GPUs kept from one round to the next: a round's :class:`FreeGpus` is the last round's
    free GPUs changed by the difference, not built again from every free GPU.

    Between two scheduling events few GPUs change hands while hundreds may
    stay free: on the 1,508-GPU Alibaba pool, grouping a snapshot's free list
    by type and peer was about half of Frenzy's slowest rounds (~0.3 ms).
    Here a round costs one set difference against the last round's free GPUs
    (C-level: GPUs are named tuples), a new list for each peer whose free
    GPUs changed, and a dict copy per type (the per-peer lists are shared
    with the round's index, which never changes one in place).  The result
    holds exactly the GPUs of ``free``, whatever came before (a new cluster, a
    restarted pool): compared by value, not identity.  When more than half
    the GPUs changed it builds afresh.  Decisions do not depend on the order
    of the dicts or lists (every pick sorts or breaks ties by name).
    """

    __slots__ = ("_base", "_free")

    def __init__(self) -> None:
        self._free: set[Gpu] = set()
        self._base = FreeGpus(())
        """The last round's free GPUs; never handed out (a round gets :meth:`FreeGpus.sharing` of it)."""

    def index(self, free: Iterable[Gpu]) -> FreeGpus:
        """The index of this round's free GPUs (the caller's to change)."""
        free = tuple(free)
        now = set(free)
        gone = self._free - now
        came = now - self._free
        self._free = now
        if len(gone) + len(came) > len(now) // 2:
            self._base = FreeGpus(free)
            return FreeGpus.sharing(self._base)
        base = self._base
        if gone:
            per_type: dict[str, list[Gpu]] = {}
            for g in gone:
                per_type.setdefault(g.gpu_type, []).append(g)
            for t, gs in per_type.items():
                base.take(t, gs)
                if not base.count[t]:  # as a fresh build: only types with a free GPU
                    del base.by_type[t], base.count[t]
        if came:
            base.give(came)
        return FreeGpus.sharing(base)
