"""The coordinator role: soft job table, HAS/MARP placement, leases, term-bound launch orders."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import replace
from typing import Any

from frenzyd.errors import FrenzyError, LaunchError, LeaseError
from frenzyd.jobs.context import (
    KEEP_FINISHED,
    LAUNCH_TIMEOUT_S,
    SEND_TIMEOUT_S,
    ClusterView,
    RoleContext,
    host_of,
    own_codes,
)
from frenzyd.jobs.lifecycle import Cancel, Exits, Placed, Requeue, StaleAttempt, Wait, step
from frenzyd.jobs.messages import (
    Ack,
    AttemptAck,
    JobAttempt,
    JobCancel,
    JobExit,
    JobLaunch,
    JobState,
    JobStop,
    JobSubmit,
    LaunchAck,
    LeaseRelease,
    LeaseRequest,
    StateAck,
)
from frenzyd.jobs.model import (
    TERMINAL,
    JobRecord,
    JobSpec,
    JobTable,
    RankAssignment,
)
from frenzyd.jobs.placement import (
    PeerOffer,
    Placement,
    QueuedJob,
    RestartCosts,
    RunningInfo,
    offers_from_reports,
    restart_key,
    schedule,
    warm_plans,
)
from frenzyd.jobs.step_fit import STEP_WINDOW, StepFits, measured_step_s

log = logging.getLogger(__name__)

START_PATIENCE_S = 600.0
"""A trainer attempt still without a first step this long after its placement counts as running for
HAS, which may then stop or move it: a start that hangs does not hold its GPUs against the queue."""

PLANNING = ("waiting for MARP's plans of this job shape (computed off the scheduling pass); "
            "placed on a later pass")
"""A queued job's message while its plans are computed (``placement.warm_plans``)."""

REFUSED_BAR_S = 30.0
"""A peer that refused a job's lease or launch gets no placement of it for this long, doubled at each
refusal up to ``REFUSED_BAR_MAX_S`` (an owner-busy or full peer recovers; a misconfigured one costs
the job one attempt number per bar, not one per pass)."""
REFUSED_BAR_MAX_S = 600.0


def _step_s(progress: dict[str, Any], most: float) -> float:
    """The reported step's own seconds (the trainer's ``step_s``), within [0, ``most``]; 0 when the
    report has none (an older trainer) or it is not a finite number."""
    raw = progress.get("step_s")
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return 0.0
    return min(max(float(raw), 0.0), max(most, 0.0))


class CoordinatorRole:
    """Active while this node is the elected coordinator (soft state, rebuilt per term)."""

    def __init__(self, ctx: RoleContext, *, min_run_s: float = 120.0, policy: str = "frenzy",
                 restart: RestartCosts | None = None) -> None:
        self.ctx = ctx
        self.min_run_s = min_run_s
        self.policy_name = policy
        self.table = JobTable()
        self._table_term = -1
        self._reserved: dict[str, str] = {}  # gpu uuid -> job id (placements in flight)
        self._placing: set[str] = set()
        self._silent_since: dict[str, float] = {}  # peer running ranks -> when it left the view
        self._warming: set[str] = set()  # jobs whose MARP plans a worker thread computes now
        self._warm_lock = asyncio.Lock()  # one plan enumeration at a time (they share the GIL anyway)
        self._last_offers: list[PeerOffer] | None = None  # the last pass's: what an admission plans on
        self.restart = restart or RestartCosts()
        """What re-placing a running job costs here, measured (kept across terms: it is this pool's)."""
        self.fits = StepFits()
        """How this pool's measured steps correct MARP's (``step_fit``; kept across terms, as ``restart``)."""
        self._reset()

    def _reset(self) -> None:
        """Everything that lives as long as one term: the policy (its caches), stops in flight, and
        placements waiting for the GPUs those stops free."""
        from frenzyd.has.frenzy import FrenzyPolicy
        from frenzyd.has.interface import Policy
        from frenzyd.has.registry import load_policy

        self.policy: Policy = (FrenzyPolicy(min_run_s=self.min_run_s) if self.policy_name == "frenzy"
                               else load_policy(self.policy_name))
        self._preempting: dict[tuple[str, int], set[str]] = {}  # attempt being preempted -> peers exited
        self._pending: dict[str, tuple[Placement, float]] = {}  # job -> placement waiting for GPUs, until
        self._stop_began: dict[tuple[str, int], float] = {}  # attempt being preempted -> when ordered
        self._start_began: dict[tuple[str, int], float] = {}  # attempt started -> when its placement began
        self._first_step: dict[tuple[str, int], float] = {}  # attempt -> when its first step was seen
        self._step_seen: dict[tuple[str, int], int] = {}  # attempt -> the first step number seen here
        self._retry_at: dict[str, float] = {}  # pending job its submitter gave no attempt yet -> ask again
        self._stopped: dict[str, int] = {}  # job -> its last attempt preempted here, every rank exited
        self._refused: dict[tuple[str, str], tuple[float, int]] = {}  # (job, peer) -> (barred until, times)
        self.preemptions = 0
        """Preemption orders given in this term (shrink, grow, move and stop alike)."""

    def ensure_table(self, v: ClusterView) -> None:
        """Start a fresh soft job table when this node becomes coordinator of a new term."""
        if v.coordinator == self.ctx.node_id and self._table_term != v.term:
            log.info("coordinator for term %d: rebuilding the job view from peers' reports", v.term)
            self.table, self._reserved, self._placing, self._table_term = JobTable(), {}, set(), v.term
            self._reset()
        elif v.coordinator != self.ctx.node_id and self._table_term != -1:
            log.info("no longer coordinator; dropping the soft job table")
            self.table, self._reserved, self._placing, self._table_term = JobTable(), {}, set(), -1
            self._reset()

    def replace_after_s(self) -> float:
        """How long a peer must have been out of the view before its jobs are placed elsewhere: by
        then its ranks' supervisor has killed them (the lease deadline passed), so an attempt
        never runs twice at once.  The peer table already waited ``peer_timeout_s``."""
        return self.ctx.lease_timeout_s + 2 * self.ctx.heartbeat_s

    async def tick(self, v: ClusterView) -> None:
        """One coordinator pass: requeue jobs whose peers are gone for good, then place the queue."""
        now = self.ctx.clock()
        running = self.table.running()
        busy_peers = {p for rec in running for p in rec.peers()}
        for p in list(self._silent_since):
            if p in v.peers or p not in busy_peers:
                del self._silent_since[p]
        for rec in running:
            gone = [p for p in rec.peers() if p not in v.peers]
            for p in gone:
                self._silent_since.setdefault(p, now)
            lost = [p for p in gone if now - self._silent_since[p] >= self.replace_after_s()]
            if lost:
                log.warning("job %s: peer %s silent for %.0fs; stopping its other ranks and requeueing it",
                            rec.id, lost[0][:12], now - self._silent_since[lost[0]])
                requeued = step(rec, Requeue(rec.attempt, f"peer {lost[0][:12]} lost"), now=now)
                self.table.update(requeued)
                self._unreserve(rec.id)
                self.ctx.spawn(self._tell_submitter(requeued), f"tell {rec.id}")
                await self._stop_everywhere(rec, v.term)
        self.table.forget_finished(KEEP_FINISHED)
        self._measure_starts(v, now)
        self._start_pending(v)
        self.fits.forget(self._gone)
        own = self.fits.jobs
        queue = [QueuedJob(q.id, q.spec, q.created_at, self._done_steps(v, q), owner=q.owner,
                           fit=own.get(q.id))
                 for q in self.table.queued() if q.id not in self._placing and q.id not in self._pending]
        movable = [self._running_info(v, r) for r in self.table.running()
                   if r.spec.keeps_checkpoints and r.plan is not None
                   and (r.id, r.attempt) not in self._preempting and r.id not in self._pending]
        offers = self._offers(v)
        if not queue and not (movable and any(g.available for p in offers for g in p.gpus)):
            return
        sched = await asyncio.to_thread(schedule, queue, offers, now_s=self.ctx.clock(), running=movable,
                                        policy=self.policy, restart=self.restart, refused=self._barred(now),
                                        plan_inline=False, model_fits=dict(self.fits.models))
        self._last_offers = offers
        for job_id, fit in sched.fits:
            if (measured := self.table.get(job_id)) is not None:
                self.fits.observe(job_id, restart_key(measured.spec), fit)
        self._plan_waiting(sched.planning, offers)
        for job_id, reason in sched.infeasible:
            # Only the submitter fails a job that cannot be placed (after jobs.unplaceable_after_s):
            # the peers that fit it may be rebooting.  Here it waits, and the submitter learns why.
            cur = self.table.get(job_id)
            if cur is None or cur.state != "queued" or cur.phase != "waiting" or cur.message == reason:
                continue
            waiting = step(cur, Wait(reason), now=self.ctx.clock())
            self.table.update(waiting)
            log.info("job %s waits: %s", job_id, reason)
            self.ctx.spawn(self._tell_submitter(waiting), f"tell {job_id}")
        for job_id, why in sched.preempt:
            self._preempt(job_id, why, v)
        until = self.ctx.clock() + self._pending_ttl_s()
        for job_id, pl in sched.pending:
            self._pending[job_id] = (pl, until)
            for r in pl.ranks:
                self._reserved[r.gpu] = job_id
        for job_id, pl in sched.start:
            cur = self.table.get(job_id)
            if cur is None or cur.state != "queued" or job_id in self._placing:
                continue
            self._placing.add(job_id)
            for r in pl.ranks:
                self._reserved[r.gpu] = job_id
            self.ctx.spawn(self._start(cur, pl, v), f"start {job_id}")

    def _plan_waiting(self, planning: tuple[str, ...], offers: list[PeerOffer]) -> None:
        """Jobs the pass left out because their MARP plans are not cached: compute them off the pass
        (a new job shape, or the pool changed under a warmed one); a queued job's status says so."""
        for job_id in planning:
            cur = self.table.get(job_id)
            if cur is None:
                continue
            self._warm(job_id, cur.spec, offers)
            if cur.state != "queued" or cur.phase != "waiting" or cur.message == PLANNING:
                continue
            waiting = step(cur, Wait(PLANNING), now=self.ctx.clock())
            self.table.update(waiting)
            self.ctx.spawn(self._tell_submitter(waiting), f"tell {job_id}")

    def _warm(self, job_id: str, spec: JobSpec, offers: list[PeerOffer]) -> None:
        """Compute ``spec``'s MARP plans over ``offers`` in a worker thread (never on the event loop,
        never inside a pass); the next pass finds them cached."""
        if job_id in self._warming or not (spec.model is not None or spec.model_config is not None):
            return
        self._warming.add(job_id)
        self.ctx.spawn(self._warm_plans(job_id, spec, offers), f"plan {job_id}")

    async def _warm_plans(self, job_id: str, spec: JobSpec, offers: list[PeerOffer]) -> None:
        try:
            async with self._warm_lock:
                began = self.ctx.clock()
                computed = await asyncio.to_thread(warm_plans, spec, offers)
        except FrenzyError as exc:  # an impossible shape: the pass says why, as for any infeasible job
            log.debug("job %s: MARP cannot plan it (%s)", job_id, exc)
            return
        finally:
            self._warming.discard(job_id)
        if computed:
            log.debug("job %s: MARP's plans computed in %.2fs", job_id, self.ctx.clock() - began)
            self.ctx.wake()

    def _pending_ttl_s(self) -> float:
        """How long GPUs stay kept for a placement that waits on a preempted job's stop: its ranks'
        grace and exit report, with room; after that HAS decides afresh."""
        return 3 * self.ctx.lease_timeout_s + 30.0

    @staticmethod
    def _progress(v: ClusterView, rec: JobRecord) -> dict[str, Any]:
        """A trainer job's last step as its submitter reports it (``step``, ``attempt``; empty: none)."""
        for j in (v.peers.get(rec.submitter) or {}).get("jobs") or ():
            if isinstance(j, dict) and j.get("id") == rec.id:
                progress = j.get("progress")
                return progress if isinstance(progress, dict) else {}
        return {}

    @classmethod
    def _done_steps(cls, v: ClusterView, rec: JobRecord) -> int:
        """Steps a trainer job has done, as its submitter reports (0 when unknown)."""
        step_ = cls._progress(v, rec).get("step")
        return step_ if isinstance(step_, int) and not isinstance(step_, bool) and step_ > 0 else 0

    def _measure_starts(self, v: ClusterView, now: float) -> None:
        """A started attempt's first step, as its submitter reports it, is a measured start (from the
        placement's first order); an attempt that ends before its first step measures nothing."""
        for job_id in [j for j in self._stopped if self.table.get(j) is None]:
            del self._stopped[job_id]
        # What is kept per attempt ends with it (stopped some other way too: its peer lost, cancelled).
        per_attempt: tuple[dict[tuple[str, int], Any], ...] = (self._stop_began, self._first_step,
                                                               self._step_seen)
        for kept in per_attempt:
            for key in list(kept):
                rec = self.table.get(key[0])
                if rec is None or rec.state != "running" or rec.attempt != key[1]:
                    del kept[key]
        for key, began in list(self._start_began.items()):
            rec = self.table.get(key[0])
            if rec is None or rec.state != "running" or rec.attempt != key[1]:
                del self._start_began[key]
                continue
            progress = self._progress(v, rec)
            if progress.get("attempt") == key[1] and isinstance(progress.get("step"), int):
                del self._start_began[key]
                # The report comes when the first step has ended: the start ended when it began, its
                # own time (step_s) earlier.  Without that, a model with 15 s steps measured every
                # start 15 s long and HAS was told so for every move (the simulator measures the
                # start alone).
                ready = now - _step_s(progress, now - began)
                self._first_step[key] = ready
                if self.restart.observe_start(ready - began, restart_key(rec.spec)):
                    log.info("job %s attempt %d: first step %.1fs after its placement; restart cost now "
                             "%.1fs (start %.1fs + stop %.1fs)", key[0], key[1], ready - began,
                             self.restart.restart_s, self.restart.start_s, self.restart.stop_s)

    def _gone(self, job_id: str) -> bool:
        """The job left the table or ended (what it measured is no use any more)."""
        rec = self.table.get(job_id)
        return rec is None or rec.terminal

    def restart_costs(self) -> dict[str, Any]:
        """What HAS is told a re-placement costs here, and from how many measurements, and how the
        pool's measured steps correct MARP's (status)."""
        return {**self.restart.to_dict(), "step_fits": self.fits.to_dict()}

    def _running_info(self, v: ClusterView, rec: JobRecord) -> RunningInfo:
        """The job as HAS sees it.  Its progress counts from its first step (``ready_s``): a trainer
        attempt whose first step has not come is still starting (inf), and HAS leaves it to start;
        an attempt started before this term (its start not measured here) counts from its start."""
        assert rec.plan is not None
        key = (rec.id, rec.attempt)
        ready = self._first_step.get(key)
        began = self._start_began.get(key)
        if ready is None and began is not None and self.ctx.clock() - began < START_PATIENCE_S:
            ready = math.inf
        return RunningInfo(rec.id, rec.spec, rec.plan, tuple((r.peer, r.gpu_index) for r in rec.ranks),
                           rec.started_at or self.ctx.clock(), self._done_steps(v, rec), owner=rec.owner,
                           ready_s=ready, step_s=self._measured_step_s(v, rec),
                           fit=self.fits.jobs.get(rec.id))

    def _measured_step_s(self, v: ClusterView, rec: JobRecord) -> float | None:
        """The attempt's mean step as its trainer reports it, once the reported mean holds only steps
        of this attempt after the first one seen here (``STEP_WINDOW``); None until then."""
        progress = self._progress(v, rec)
        n = progress.get("step")
        if progress.get("attempt") != rec.attempt or not isinstance(n, int) or isinstance(n, bool):
            return None
        first = self._step_seen.setdefault((rec.id, rec.attempt), n)
        return measured_step_s(progress) if n - first >= STEP_WINDOW else None

    def _bar(self, job_id: str, peer: str) -> None:
        """``peer`` refused (or did not take) the job's lease or launch: place the job elsewhere for a
        while, doubling each time, instead of asking again every pass (each try costs an attempt)."""
        n = self._refused.get((job_id, peer), (0.0, 0))[1] + 1
        wait = min(REFUSED_BAR_MAX_S, REFUSED_BAR_S * 2 ** (n - 1))
        self._refused[(job_id, peer)] = (self.ctx.clock() + wait, n)
        log.info("job %s: not placing it on peer %s for %.0fs (refused %d time(s))", job_id, peer[:12],
                 wait, n)

    def _barred(self, now: float) -> dict[str, set[str]]:
        """Job id -> the peers it is kept off now (a job's refusal count lives as long as the job)."""
        out: dict[str, set[str]] = {}
        for (job_id, peer), (until, _) in list(self._refused.items()):
            rec = self.table.get(job_id)
            if rec is None or rec.terminal:
                del self._refused[(job_id, peer)]
            elif until > now:
                out.setdefault(job_id, set()).add(peer)
        return out

    def _preempt(self, job_id: str, why: str, v: ClusterView) -> None:
        """Stop a running checkpointable job for the scheduler: every rank gets SIGTERM and its grace
        to checkpoint; the job is requeued (not lost) once all its peers have reported the exit."""
        rec = self.table.get(job_id)
        if rec is None or rec.state != "running" or (rec.id, rec.attempt) in self._preempting:
            return
        self._preempting[(rec.id, rec.attempt)] = set()
        self._stop_began[(rec.id, rec.attempt)] = self.ctx.clock()
        self.preemptions += 1
        log.info("job %s attempt %d: preempting it (%s)", rec.id, rec.attempt, why)
        self.ctx.spawn(self._stop_everywhere(rec, v.term, preempt=why), f"preempt {job_id}")

    def _start_pending(self, v: ClusterView) -> None:
        """Start the placements that waited for a preempted job's GPUs, once those GPUs are free."""
        now = self.ctx.clock()
        for job_id in [j for j in self._retry_at if j not in self._pending and j not in self._placing]:
            del self._retry_at[job_id]
        for job_id, (pl, until) in list(self._pending.items()):
            cur = self.table.get(job_id)
            if cur is None or cur.terminal or now > until:
                del self._pending[job_id]
                self._unreserve(job_id)
                continue
            if cur.state != "queued" or job_id in self._placing or now < self._retry_at.get(job_id, now):
                continue  # a stopped job's own new plan: it has not stopped yet; or asked a moment ago
            others = {g: j for g, j in self._reserved.items() if j != job_id}
            free = {g.uuid for p in offers_from_reports(v.peers, others) for g in p.gpus if g.available}
            if not all(r.gpu in free for r in pl.ranks):
                continue
            del self._pending[job_id]
            self._placing.add(job_id)
            (log.debug if job_id in self._retry_at else log.info)(
                "job %s: the GPUs kept for it are free; starting it", job_id)
            self.ctx.spawn(self._start(cur, pl, v, pending_until=until), f"start {job_id}")

    def _offers(self, v: ClusterView) -> list[PeerOffer]:
        return offers_from_reports(v.peers, self._reserved)

    def _unreserve(self, job_id: str) -> None:
        for g in [g for g, j in self._reserved.items() if j == job_id]:
            del self._reserved[g]
        for other, (pl, _) in self._pending.items():  # GPUs kept for a waiting placement stay kept
            for r in pl.ranks:
                self._reserved.setdefault(r.gpu, other)

    async def _begin_attempt(self, rec: JobRecord, term: int) -> int:
        """Ask the submitter for the job's next attempt number (0: it will not run; table updated)."""
        reply = await self.ctx.send(rec.submitter, JobAttempt(rec.id, term, rec.attempt), SEND_TIMEOUT_S)
        ack = Ack.from_body(reply)
        if not ack.ok:
            raise LaunchError(f"the submitter refused a new attempt: {ack.reason}")
        attempt = reply.get("attempt")
        if attempt == 0:
            state = reply.get("state")
            if state in TERMINAL:  # finished or cancelled while queued here: forget our stale copy
                self.table.drop(rec.id)
            return 0
        return AttemptAck.attempt_of(reply)

    async def _start(self, rec: JobRecord, pl: Placement, v: ClusterView,
                     pending_until: float | None = None) -> None:
        """Get an attempt number, lease on every chosen peer, launch rank 0's peer (store), then the rest.

        ``pending_until``: the placement waited for a stop (HAS's new plan for a preempted job, or for
        the job that takes its GPUs); when the submitter gives no attempt yet (it has not heard of the
        stopped attempt's exit), the placement waits on, until then, instead of being dropped."""
        term = v.term
        began = self.ctx.clock()
        by_peer: dict[str, list[RankAssignment]] = {}
        for r in pl.ranks:
            by_peer.setdefault(r.peer, []).append(r)
        granted: list[str] = []
        launched: list[str] = []
        attempt = 0
        blame: list[str] = []  # the peers that refused or did not take it
        try:
            attempt = await self._begin_attempt(rec, term)
            if attempt == 0:
                cur = self.table.get(rec.id)
                if pending_until is not None and self.ctx.clock() < pending_until and cur is not None \
                        and cur.state == "queued" and rec.id not in self._pending:
                    log.debug("job %s: its submitter gives no new attempt yet; the GPUs stay kept for it",
                              rec.id)
                    self._retry_at[rec.id] = self.ctx.clock() + self.ctx.heartbeat_s  # its next report
                    self._pending[rec.id] = (pl, pending_until)
                    for r in pl.ranks:
                        self._reserved[r.gpu] = rec.id
                    return
                self._unreserve(rec.id)
                return
            for peer, ranks in by_peer.items():
                ack = Ack.from_body(await self.ctx.send(
                    peer, LeaseRequest(rec.id, attempt, tuple(r.gpu for r in ranks), term), SEND_TIMEOUT_S))
                if not ack.ok:
                    blame.append(peer)
                    raise LeaseError(f"peer {peer[:12]} refused the lease: {ack.reason}")
                granted.append(peer)
            running = step(rec, Placed(attempt, pl.ranks, term, pl.plan), now=self.ctx.clock())
            rank0 = pl.ranks[0].peer
            host0 = host_of(str(v.peers.get(rank0, {}).get("address", "")))
            order = JobLaunch(rec.id, attempt, term, running, host0, master_port=0, start_store=True,
                              backend=pl.backend)
            reply = await self.ctx.send_order(rank0, order, LAUNCH_TIMEOUT_S)
            launched.append(rank0)
            if not (ack := Ack.from_body(reply)).ok:
                blame.append(rank0)
                raise LaunchError(f"peer {rank0[:12]} refused the launch: {ack.reason}")
            order = replace(order, master_port=LaunchAck.port_of(reply), start_store=False)
            others = [p for p in by_peer if p != rank0]
            replies = await asyncio.gather(
                *(self.ctx.send_order(p, order, LAUNCH_TIMEOUT_S) for p in others),
                return_exceptions=True,
            )
            launched.extend(others)
            blame.extend(p for p, rep in zip(others, replies, strict=True)
                         if isinstance(rep, BaseException) or not Ack.from_body(rep).ok)
            for p, rep in zip(others, replies, strict=True):
                if isinstance(rep, BaseException):
                    raise LaunchError(f"peer {p[:12]} did not take the launch: {rep}")
                if not (ack := Ack.from_body(rep)).ok:
                    raise LaunchError(f"peer {p[:12]} refused the launch: {ack.reason}")
            current = self.table.get(rec.id)
            if current is not None and current.state == "queued":
                # The attempt runs from now (every launch acknowledged): jobs.min_run_s counts from here,
                # not from the placement decision before the payload and checkpoint were fetched.
                running = replace(running, started_at=self.ctx.clock())
                self.table.update(running)
                if rec.spec.trainer:  # its first step, as its submitter reports it, measures the start
                    self._start_began[(rec.id, attempt)] = began
                log.info("job %s placed on %s (term %d)", rec.id,
                         ", ".join(f"{r.peer_name}:{r.gpu}" for r in pl.ranks), term)
                state = await self._tell_submitter(running)
                if state in TERMINAL:  # the submitter finished it meanwhile (cancelled): undo
                    self.table.update(step(running, Cancel(f"submitter says {state}"), now=self.ctx.clock()))
                    self._unreserve(rec.id)
                    await self._stop_everywhere(running, term)
            else:  # cancelled while we were launching
                self._unreserve(rec.id)
                await self._stop_everywhere(running, term)
        except (FrenzyError, OSError) as exc:
            log.warning("job %s: placement of attempt %d failed (%s); it stays queued", rec.id, attempt, exc)
            for peer in blame:
                self._bar(rec.id, peer)
            if launched:
                await self._stop_everywhere(rec, term, only=launched, attempt=attempt)
            for peer in granted:
                with contextlib.suppress(FrenzyError, OSError):
                    await self.ctx.send(peer, LeaseRelease(rec.id, attempt, term), SEND_TIMEOUT_S)
            self._unreserve(rec.id)
            if attempt:  # the submitter's record is placing this attempt: back to waiting
                back = replace(rec, attempt=attempt, message=f"placement failed: {exc}")
                with contextlib.suppress(FrenzyError, OSError):
                    await self.ctx.send(rec.submitter, JobState(back), SEND_TIMEOUT_S)
        finally:
            self._placing.discard(rec.id)

    async def _tell_submitter(self, rec: JobRecord) -> str | None:
        """Send the job's new state to its submitter; return the submitter's state (None: unreachable)."""
        for attempt in range(5):
            try:
                reply = await self.ctx.send(rec.submitter, JobState(rec), SEND_TIMEOUT_S)
            except FrenzyError as exc:
                log.info("job %s: submitter unreachable (%s), retry %d", rec.id, exc, attempt + 1)
                await asyncio.sleep(self.ctx.heartbeat_s)
            else:
                return StateAck.state_of(reply)
        return None

    async def _stop_everywhere(self, rec: JobRecord, term: int, only: list[str] | None = None,
                               attempt: int | None = None, preempt: str = "") -> None:
        """Stop the ranks of ``rec``'s attempt (or ``attempt``) on its peers (or ``only`` these);
        ``preempt``: a preemption by the scheduler (why), so the job is requeued, not failed."""
        stop = JobStop(rec.id, rec.attempt if attempt is None else attempt, term, preempt)
        for peer in only if only is not None else rec.peers():
            try:
                await self.ctx.send_order(peer, stop, SEND_TIMEOUT_S)
            except (FrenzyError, OSError) as exc:
                log.info("job %s: stop order to %s failed: %s", rec.id, peer[:12], exc)

    async def on_submit(self, peer: str, msg: JobSubmit) -> Ack:
        v = self.ctx.view()
        if v.coordinator != self.ctx.node_id:
            return Ack(False, "not the coordinator")
        self.ensure_table(v)
        theirs = msg.record
        if theirs.submitter != peer:
            return Ack(False, "a job can only be submitted by its submitter")
        known = self.table.get(theirs.id)
        if known is None:
            if theirs.state == "queued":
                self.table.submit(theirs)
                if self._last_offers is not None:  # its plans, before the pass that places it
                    self._warm(theirs.id, theirs.spec, self._last_offers)
            elif theirs.state == "running":
                self.table.adopt(theirs)
        elif known.state == "running" and theirs.state == "queued" and theirs.attempt >= known.attempt \
                and not (theirs.phase == "placing" and theirs.attempt == known.attempt):
            # the submitter requeued it (its ranks were lost); a record still "placing" the attempt
            # that runs only missed the news of its placement (its submitter was down)
            self.table.update(theirs)
            self._unreserve(theirs.id)
            await self._stop_everywhere(known, v.term)
        elif known.state == "queued" and theirs.state == "running" and theirs.attempt >= known.attempt \
                and theirs.id not in self._placing and self._stopped.get(theirs.id, 0) < theirs.attempt:
            # placed by an earlier coordinator: running, not queued (but not an attempt whose ranks this
            # coordinator saw exit: its submitter has not heard of the exit yet, and would revive it)
            self.table.update(theirs)
        self.ctx.wake()
        return Ack()

    async def on_cancel(self, peer: str, msg: JobCancel) -> StateAck | Ack:
        rec = self.table.get(msg.job_id)
        if rec is None:
            return StateAck("unknown")
        if rec.submitter != peer:
            return Ack(False, "only the submitter can cancel a job")
        if rec.terminal:
            return StateAck(rec.state)
        self.table.update(step(rec, Cancel(), now=self.ctx.clock()))
        if rec.state == "running":
            await self._stop_everywhere(rec, self.ctx.view().term)
        self._unreserve(rec.id)
        self.ctx.wake()
        return StateAck("cancelled")

    async def on_exit(self, peer: str, msg: JobExit) -> None:
        """A peer's ranks of a job exited: requeue (vacated) or record the exit codes."""
        job_id = msg.job_id
        known = self.table.get(job_id)
        if known is None:
            return
        try:
            key = (job_id, msg.attempt)
            if key in self._preempting and known.state == "running" and known.attempt == msg.attempt:
                # A preemption: the job is requeued once every peer's ranks have stopped (and
                # written their part of the checkpoint), never while some still run.
                self._preempting[key].add(peer)
                if set(known.peers()) <= self._preempting[key]:
                    del self._preempting[key]
                    began = self._stop_began.pop(key, None)
                    if began is not None and self.restart.observe_stop(self.ctx.clock() - began,
                                                                       restart_key(known.spec)):
                        log.info("job %s attempt %d: every rank exited %.1fs after the stop order; restart "
                                 "cost now %.1fs", job_id, msg.attempt, self.ctx.clock() - began,
                                 self.restart.restart_s)
                    why = msg.reason or "preempted by the scheduler"
                    requeued = step(known, Requeue(msg.attempt, why, lost=False), now=self.ctx.clock())
                    self.table.update(requeued)
                    self._stopped[job_id] = msg.attempt
                    self._unreserve(job_id)
                    self.ctx.wake()
                return
            if known.state == "running" and msg.vacated:
                why = f"peer {peer[:12]} stopped while running ranks"
                self.table.update(step(known, Requeue(msg.attempt, why, lost=False), now=self.ctx.clock()))
                self._unreserve(job_id)
                others = [p for p in known.peers() if p != peer]
                await self._stop_everywhere(known, self.ctx.view().term, only=others)
                self.ctx.wake()
                return
            codes = own_codes(msg.exit_codes, known, peer)
            done = step(known, Exits(msg.attempt, codes), now=self.ctx.clock())
        except StaleAttempt as exc:
            self.ctx.stale(JobExit.KIND, exc)
            return
        self.table.update(done)
        if done.terminal:
            self._unreserve(job_id)
            self.ctx.wake()
        elif done.failed_rank is not None and known.failed_rank is None:
            # torchrun's semantics: one rank failing stops the others (a peer waiting in
            # init_process_group for a dead rank would otherwise hold its GPUs for minutes).
            others = [p for p in done.peers() if p != peer]
            log.info("job %s: rank %d exited %d; stopping its other ranks", job_id, done.failed_rank,
                     done.exit_codes[done.failed_rank])
            await self._stop_everywhere(done, self.ctx.view().term, only=others)
