"""The membership protocol on the peer network (``[network] membership = "swim"``).

``Members`` runs the SWIM core (``frenzyd.net.membership``, through ``frenzyd.net.gossip``) over the
mutual-TLS transport: each membership message is one ``POST /v1/msg`` whose sender the TLS certificate
names (the core drops a message whose ``src`` is another node); a ping's ack is its reply, so a probe
costs one request and no connection back.  What the protocol learns goes into
the peer table (a member alive or suspect is live without heartbeats) and the election (each entry
carries the member's priority, term and coordinator); an election change is gossiped as a new
incarnation of this node's entry.  Heartbeats, which carry the full report, go only to the
coordinator, to the peers of this node's unfinished jobs and to addresses whose node is not known yet
(``Heartbeats.targets``).  Static peers are the seeds; an address mDNS finds is joined by a sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from frenzyd.config import Config, TimingSection
from frenzyd.errors import AuthError, ElectionError, PeerError
from frenzyd.net import auth, wire
from frenzyd.net.dispatch import Dispatcher, Reply
from frenzyd.net.election import Change, ElectionState, PeerView
from frenzyd.net.gossip import SWIM_KINDS, GossipDriver
from frenzyd.net.heartbeats import Heartbeats
from frenzyd.net.membership import ALIVE, DEAD, SUSPECT, Membership, Params, SwimMessage
from frenzyd.net.messages import (
    POOL_PEERS_MAX,
    HeartbeatReport,
    MemberEntry,
    PeerSummary,
    PoolPeers,
    PoolView,
    SwimAck,
    pool_page,
)
from frenzyd.net.peer_table import PeerTable
from frenzyd.net.transport import FRAME_OVERHEAD, Transport

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 4
"""Membership posts in flight to one address; more are dropped (the protocol tolerates loss)."""
SWIM_REPLY_MAX = 64 * 1024
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
POOL_VIEW_PAGES = 64
"""Most ``pool.view`` pages one refresh fetches (a page holds up to 512 KiB of members' reports)."""
POOL_VIEW_RETRY_S = 0.25
"""A view that misses a live member is fetched again after this long (not only after ``max_age_s``)."""


MIN_PERIOD_S = 0.25
"""A probe and its ack are two TLS requests: a shorter period suspects live members of a loaded host."""


JOIN_DELAY_PERIODS = (1.0, 3.0)
"""An address mDNS finds while this node already has members is joined after a random 1-3 periods,
and only if gossip has not brought its member by then."""
JOINS_PER_FLUSH = 4
"""Delayed joins sent at once; the rest wait for the next flush."""


def swim_params(t: TimingSection) -> Params:
    """The protocol's timing from ``[timing]``: one probe per ``heartbeat_s`` (at least
    :data:`MIN_PERIOD_S`), 60 % of it for the direct ack.  Lifeguard's suspicion timeout: at least
    0.75 x ``peer_timeout_s`` and three periods (2 x log10(n + 1) periods past that) once three other
    members confirm the suspicion, six times that while nobody does (the mesh declares a peer gone
    after ``peer_timeout_s`` on one observer's word)."""
    period = max(MIN_PERIOD_S, t.heartbeat_s)
    return Params(period_s=period, ack_timeout_s=0.6 * period, suspicion_mult=2.0,
                  suspicion_min_s=max(0.75 * t.peer_timeout_s, 3 * period))


def partners(report: HeartbeatReport) -> set[str]:
    """The peers this node's unfinished jobs have ranks on (its report's ``jobs``)."""
    out: set[str] = set()
    for job in report.jobs or ():
        if job.get("state") in TERMINAL:
            continue
        for rank in job.get("ranks") or ():
            peer = rank.get("peer") if isinstance(rank, Mapping) else None
            if isinstance(peer, str):
                out.add(peer)
    return out


class Members:
    """This node's membership: the SWIM driver, its transport, and what it feeds."""

    def __init__(
        self,
        config: Config,
        creds: auth.Credentials,
        election: ElectionState,
        *,
        table: PeerTable,
        heartbeats: Heartbeats,
        transport: Transport,
        dispatch: Dispatcher,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.creds = creds
        self.election = election
        self.table = table
        self.heartbeats = heartbeats
        self.transport = transport
        self.counters = dispatch.counters
        self._check_peer = dispatch.check_peer  # the revocation list: a removed node is never a member
        self._clock = clock
        self.params = swim_params(config.timing)
        self.seeds = [str(p) for p in config.network.peers]
        self.driver: GossipDriver | None = None
        self._in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[str, str | None] = {}
        """Addresses mDNS found, waiting to be joined: address -> the node id its hints name."""
        self._flush: asyncio.TimerHandle | None = None
        self._rng = random.Random()
        for kind in SWIM_KINDS:
            dispatch.on(kind, self._handle)
        dispatch.on(PoolView.KIND, self._answer_pool_view)
        self.pool_view: dict[str, PeerSummary] = {}
        """The coordinator's members with their status fields, as :meth:`refresh_pool_view` last got them."""
        self.pool_view_at: float | None = None
        """When :attr:`pool_view` was fetched (this node's monotonic clock), None before the first time."""
        self._pool_view_task: asyncio.Task[None] | None = None
        heartbeats.targets = self.targets
        heartbeats.view_listeners.append(self._view_changed)
        heartbeats.unreachable_listeners.append(self._unreachable)

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the protocol (the transport is started: its address is this member's)."""
        v = self.election.view()
        me = MemberEntry(self.creds.node_id, self.creds.node_name, self.transport.address, v.priority,
                         int(time.time()), ALIVE, v.term, v.coordinator)  # a restart outranks its last life
        core = Membership(me, self.params, rng=random.Random(), seeds=self.seeds)
        self.driver = GossipDriver(core, self._send, on_changes=self._changed, clock=self._clock)
        self.driver.start(self.seeds)
        log.info("membership: SWIM, period %.2fs, seeds %s", self.params.period_s, self.seeds or "none")

    async def stop(self) -> None:
        """Tell a few members this node leaves, give those posts a moment, cancel the rest."""
        if self.driver is not None:
            self.driver.stop(leave=True)
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=min(1.0, self.params.period_s))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def found(self, address: str, hints: Mapping[str, str] | None) -> None:
        """An address discovery found: join through it unless it is ours, another pool's or a member's.

        Only a node with no live member yet joins at once.  Otherwise the join waits a random
        :data:`JOIN_DELAY_PERIODS` and is dropped if gossip brought the member meanwhile: when a pool
        starts together every member finds every other by mDNS, and joining each would be a full-state
        sync from each member to each other (n^2 at start); one sync and gossip do the same."""
        if self.driver is None or address == self.transport.address:
            return
        if hints and (hints.get("id") == self.creds.node_id or
                      (hints.get("pool") and hints.get("pool") != self.creds.pool_id)):
            return
        node_id = hints.get("id") if hints else None
        if node_id and self.driver.core.is_live(node_id):
            return
        if not self.driver.core.live():
            self.driver.join([address])
            return
        self._pending[address] = node_id
        if self._flush is None:
            lo, hi = JOIN_DELAY_PERIODS
            delay = self._rng.uniform(lo, hi) * self.params.period_s
            self._flush = asyncio.get_running_loop().call_later(delay, self._join_pending)

    def _join_pending(self) -> None:
        self._flush = None
        if self.driver is None or not self.driver.running:
            return
        core = self.driver.core
        live_at = {e.address for e in core.entries() if core.is_live(e.node_id)}
        for address, node_id in list(self._pending.items()):
            if (node_id and core.is_live(node_id)) or address in live_at:
                del self._pending[address]  # gossip brought it
        due = list(self._pending)[:JOINS_PER_FLUSH]
        for address in due:
            del self._pending[address]
        if due:
            self.driver.join(due)
        if self._pending:
            lo, hi = JOIN_DELAY_PERIODS
            delay = self._rng.uniform(lo, hi) * self.params.period_s
            self._flush = asyncio.get_running_loop().call_later(delay, self._join_pending)

    def _unreachable(self, node_id: str) -> None:
        if self.driver is not None and self.driver.core.is_live(node_id):
            self.driver.unreachable(node_id)

    # --- what the protocol feeds -------------------------------------------------------------

    def targets(self, report: HeartbeatReport) -> set[str]:
        """Whom this node's heartbeat (its full report) goes to: the coordinator and its jobs' peers."""
        out = partners(report)
        if self.election.coordinator is not None:
            out.add(self.election.coordinator)
        return out

    def _changed(self, entries: list[MemberEntry]) -> None:
        now = self._clock()
        for e in entries:
            if e.node_id == self.creds.node_id:
                continue
            if self._removed(e.node_id):
                continue  # the revocation list names it (frenzyd.net.revocation): its gossip is ignored
            live = e.state <= SUSPECT
            if e.state >= DEAD and self.table.get(e.node_id) is None:
                continue
            rec, revived = self.table.member(e.node_id, name=e.name, address=e.address, priority=e.priority,
                                             term=e.term, coordinator=e.coordinator, live=live, now=now)
            if e.state == SUSPECT:
                log.info("peer %s (%s) is suspect (membership, by %s)", e.name, e.node_id[:12],
                         (e.by or "?")[:12])
            if live:
                try:
                    self.election.observe(PeerView(e.node_id, e.priority, e.term, e.coordinator))
                except ElectionError as exc:
                    self.counters.dropped[str(exc).split(":", 1)[0]] += 1
                    log.warning("membership: refused the view of %s: %s", e.name, exc)
            elif e.state >= DEAD:
                log.warning("peer %s (%s) is %s (membership)", e.name, e.node_id[:12], e.state_name)
            self.heartbeats.member_seen(rec, revived)
        self.heartbeats.tick()

    def _removed(self, node_id: str) -> bool:
        try:
            self._check_peer(node_id)
        except AuthError:
            return True
        return False

    def _view_changed(self, change: Change) -> None:
        if self.driver is not None and self.driver.running:
            self.driver.set_view(term=change.after.term, coordinator=change.after.coordinator)

    # --- the coordinator's view, for the status page ---------------------------------------

    async def _answer_pool_view(self, peer_id: str, msg: Any) -> Reply:
        """A page of the members this node holds a fresh report of (the coordinator holds everyone's)."""
        ask: PoolView = msg
        now = self._clock()
        peers = [PeerSummary.of(r.node_id, r.name, r.address, self.table.is_alive(r.node_id, now),
                                r.report.to_dict())
                 for r in sorted(self.table.records(), key=lambda r: r.node_id)
                 if self.table.heard_lately(r, now) and r.node_id != peer_id]
        page = pool_page(peers, ask.offset)
        return Reply(page.KIND, page.to_body())

    async def refresh_pool_view(self, *, max_age_s: float, wait_s: float) -> None:
        """Fetch the coordinator's view (its members' GPUs and versions) when :attr:`pool_view` is older
        than ``max_age_s`` (or :data:`POOL_VIEW_RETRY_S` when it misses a live member), waiting at most
        ``wait_s`` for it (the fetch goes on after that; one at a time).  A member's work stays flat in
        the pool's size: it asks only when its status is read."""
        coord = self.election.coordinator
        if coord is None or coord == self.creds.node_id:
            return
        if self.pool_view_at is not None:
            age = self._clock() - self.pool_view_at
            if age < max_age_s and (age < POOL_VIEW_RETRY_S or not self._pool_view_misses(coord)):
                return
        if self._pool_view_task is None or self._pool_view_task.done():
            self._pool_view_task = asyncio.get_running_loop().create_task(self._fetch_pool_view(coord))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pool_view_task), wait_s)

    def _pool_view_misses(self, coord: str) -> bool:
        """Whether a live member this node has no fresh report of is missing from the view (it joined
        since, or the coordinator had not heard it yet)."""
        now = self._clock()
        return any(r.node_id not in self.pool_view and r.node_id not in (coord, self.creds.node_id)
                   and self.table.is_alive(r.node_id, now) and not self.table.heard_lately(r, now)
                   for r in self.table.records())

    async def _fetch_pool_view(self, coord: str) -> None:
        got: dict[str, PeerSummary] = {}
        offset = 0
        timeout_s = self.config.timing.request_timeout_s
        try:
            for _ in range(POOL_VIEW_PAGES):
                frame = wire.encode_message(PoolView(offset))
                reply = await self.transport.send_frame(coord, PoolView.KIND, frame, timeout_s,
                                                        POOL_PEERS_MAX + FRAME_OVERHEAD)
                page = wire.parse(reply)
                if not isinstance(page, PoolPeers) or page.offset != offset:
                    self.counters.dropped["pool_view"] += 1
                    return
                got.update((p.node_id, p) for p in page.peers)
                offset += len(page.peers)
                if not page.peers or offset >= page.total:
                    break
        except (PeerError, wire.FrameRejected) as exc:
            log.info("membership: the coordinator's view did not come (%s); the status shows what this "
                     "node has", exc)
            return
        self.pool_view = got
        self.pool_view_at = self._clock()

    # --- moving frames -----------------------------------------------------------------------

    async def _handle(self, peer_id: str, msg: Any) -> Reply | None:
        if self.driver is None:
            return None
        typed: SwimMessage = msg
        ack = self.driver.deliver(peer_id, typed, answer=True)
        return None if ack is None else Reply(ack.KIND, ack.to_body())

    def _send(self, address: str, node_id: str | None, frame: bytes) -> None:
        if self._in_flight.get(address, 0) >= MAX_IN_FLIGHT:
            self.counters.send_failures["membership_busy"] += 1
            return
        self._in_flight[address] = self._in_flight.get(address, 0) + 1
        task = asyncio.get_running_loop().create_task(self._post(address, node_id, frame))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._done(address, t))

    def _done(self, address: str, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        left = self._in_flight.get(address, 1) - 1
        if left > 0:
            self._in_flight[address] = left
        else:
            self._in_flight.pop(address, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("membership post to %s failed unexpectedly", address, exc_info=exc)

    async def _post(self, address: str, node_id: str | None, frame: bytes) -> None:
        timeout_s = min(self.config.timing.request_timeout_s, 2 * self.params.period_s)
        with contextlib.suppress(PeerError):  # counted by the transport; a lost message to the protocol
            peer_id, reply = await self.transport.post(address, frame, timeout_s, SWIM_REPLY_MAX)
            if node_id is not None and peer_id != node_id:
                self.counters.auth_refusals["wrong_peer"] += 1
            elif reply.kind == "error":
                self.counters.send_failures[str(reply.body.get("reason", "error"))] += 1
            elif reply.kind == SwimAck.KIND and self.driver is not None:  # a ping's ack, as its reply
                try:
                    ack = wire.parse(reply)
                except wire.FrameRejected as exc:
                    self.counters.dropped[exc.reason] += 1
                    return
                if isinstance(ack, SwimAck):
                    self.driver.deliver(peer_id, ack)
