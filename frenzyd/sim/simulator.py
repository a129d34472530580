"""Discrete-event simulator: drives one policy through the HAS interface over a workload and a cluster.

Scheduling rounds happen at every arrival, completion and failure, and every
``policy.round_s`` seconds for round-based policies (Sia 60 s, Gavel 360 s).
A round tick is skipped only at a fixpoint: nothing happened since the last
round and that round changed nothing (the policy would see the same jobs,
placements and free GPUs, only a later clock), unless the policy sets
``time_driven = True`` (its decisions change with the clock alone).  Every placement costs the
job's restart cost (start-up plus checkpoint read, ``has.speed``, or the
calibrated figures of a ``sim.preemption`` model with ``start_s`` set) before it
makes progress; a job stopped or moved pays the checkpoint costs of
``sim.preemption`` (its checkpoint write delays its next start; the step in
flight is lost), the same for every policy.  A
placement whose plan does not fit the GPU's memory (only possible for plans
that are not MARP's, i.e. FIFO's user plans) fails after the restart cost
and is resubmitted with twice the GPUs, at most ``MAX_OOM_RESUBMITS`` times.
Decision time is measured with the ``clock`` the driver passes in.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from frenzyd.errors import SchedulerError
from frenzyd.has.interface import (
    Cluster,
    Decision,
    Gpu,
    JobView,
    Placement,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
    peers_of,
    tp_inside_peers,
)
from frenzyd.marp.spec import Plan
from frenzyd.sim.model import JobOutcome, PolicyResult, SimJob
from frenzyd.sim.preemption import DEFAULT, PreemptionModel

MAX_OOM_RESUBMITS = 3
_EPS = 1e-9
_INF = float("inf")


class RestartLearner(Protocol):
    """What a live coordinator learns of its pool's restart costs (``jobs.placement.RestartCosts``):
    the simulator feeds it the starts and stops it simulates and tells the policy what it holds."""

    def observe_start(self, seconds: float, model: str | None = None) -> bool: ...

    def observe_stop(self, seconds: float, model: str | None = None) -> bool: ...

    def for_model(self, model: str | None) -> tuple[float, float]: ...


PlanKey = tuple[str, int, int, int, int, int, int, int]


def plan_key(plan: Plan) -> PlanKey:
    """Every field of a plan that changes its speed or its memory (not the derived bytes or step time).

    Two plans with one key run alike: same GPU type and count, the same
    dp × tp × pp layout, ZeRO stage, micro-batch and gradient accumulation
    (``grad_accum`` sets the micro-batches per step: the pipeline bubble, the
    all-reduce overlap and the activations in flight).
    """
    return (
        plan.gpu_type,
        plan.gpus,
        plan.dp,
        plan.tp,
        plan.pp,
        plan.zero,
        plan.micro_batch,
        plan.grad_accum,
    )


def plan_fits(job: SimJob, plan: Plan) -> bool:
    """Whether ``plan`` fits in memory: a MARP plan of the job, or a ZeRO-3 dp plan MARP found feasible."""
    if any(plan_key(p) == plan_key(plan) for p in job.plans):
        return True
    if plan.zero == 3 and plan.tp == 1 and plan.pp == 1 and plan.dp == plan.gpus:
        return (plan.gpu_type, plan.gpus) in job.user_fits
    return False


@dataclass(slots=True)
class _State:
    job: SimJob
    remaining: float
    requested: int
    status: str = "future"  # future | queued | running | completed | failed | unfinished
    plan: Plan | None = None
    gpus: tuple[Gpu, ...] = ()
    placed_s: float = 0.0
    ready_s: float = 0.0  # progress starts after the restart cost
    step_s: float = 0.0
    oom_pending: bool = False
    first_start_s: float | None = None
    end_s: float = 0.0
    placements: int = 0
    oom_failures: int = 0
    last_update_s: float = 0.0
    version: int = 0
    service: dict[str, float] = field(default_factory=dict)
    write_delay_s: float = 0.0  # the checkpoint write of the last stop, paid before the next start
    ckpt_ready_s: float = 0.0  # finish_step: when the last stop's checkpoint is complete (absolute)
    lost_s: float = 0.0  # progress seconds lost to stops, in all
    gpu_types: list[str] = field(default_factory=list)  # the type of every placement, in order
    stop_cost_s: float = 0.0  # what a stop adds to the restart (the checkpoint write), shown to policies
    begin_s: float = 0.0  # when the placement's start began (its GPUs free)
    start_left: float = 0.0  # host_cores: CPU seconds of start work each rank still has to do

    def view(self, told: tuple[float, float] | None = None) -> JobView:
        """The policy's view; ``told``: the (start, stop) seconds a learner holds for the job's model
        (its speed must then carry ``restart_s``, as ``jobs.placement.PoolSpeed`` does)."""
        speed, stop = self.job.speed, self.stop_cost_s
        if told is not None:
            speed, stop = replace(speed, restart_s=told[0]), told[1]  # type: ignore[call-arg]
        return JobView(
            job_id=self.job.job_id,
            arrival_s=self.job.arrival_s,
            requested_gpus=self.requested,
            plans=self.job.plans,
            speed=speed,
            total_steps=self.job.total_steps,
            remaining_steps=self.remaining,
            restarts=max(0, self.placements - 1),
            service_s=tuple(sorted(self.service.items())),
            global_batch=self.job.global_batch,
            stop_cost_s=stop,
        )


def simulate(
    policy: Policy,
    jobs: Sequence[SimJob],
    cluster: Cluster,
    *,
    seed: int,
    clock: Callable[[], float],
    progress: Callable[[str], None] | None = None,
    max_time_s: float = 365 * 86400.0,
    preemption: PreemptionModel = DEFAULT,
    step_time: Callable[[SimJob, Plan, int], float] | None = None,
    restart_costs: RestartLearner | None = None,
) -> PolicyResult:
    """Run ``policy`` over ``jobs`` on ``cluster``; every job ends exactly once (completed/failed/unfinished).

    ``clock`` (seconds, monotonic) times each ``decide`` call; ``preemption``
    prices every stop or move of a running job (``sim.preemption``).
    ``step_time(job, plan, peers)``: the seconds per step a placement really
    runs at, when that is not the job's speed model (a live pool's paced
    stand-ins, ``scripts/bench_live.py``); the policies still see the speed
    model and the plans' own step times, as the live coordinator's do.
    ``restart_costs``: tell the policy what this learner holds for each job's
    model as its restart and stop costs, and feed it every simulated start
    (its GPUs free to its first step) and stop (the order to its GPUs' handover),
    as a live coordinator measures its pool.  With ``preemption.host_cores``
    the ranks starting at once share the host's cores (``sim.preemption``).  Raises
    :class:`SchedulerError` when the policy returns an impossible decision
    (a GPU twice, a GPU not free, a plan on the wrong GPUs, tp across peers).
    """
    rng = random.Random(seed)
    states = {
        j.job_id: _State(
            job=j,
            remaining=float(j.total_steps),
            requested=j.requested_gpus,
            stop_cost_s=preemption.shown_stop_s(j.speed.params),
        )
        for j in jobs
    }
    if len(states) != len(jobs):
        raise SchedulerError("job ids must be unique")
    speed_of = {t.name: t.speed for t in cluster.types}
    all_gpus = set(cluster.gpus)
    free: set[Gpu] = set(all_gpus)
    free_at: dict[Gpu, float] = {}  # finish_step: a stopped job holds its GPUs until then
    arrivals = sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))
    next_arrival = 0
    queue: list[str] = []  # arrival order (resubmissions keep their place)
    running: dict[str, _State] = {}
    heap: list[tuple[float, int, str, int]] = []  # (time, kind order, job id, version)
    busy = 0.0
    decisions: list[float] = []
    timeouts = 0
    now = arrivals[0].arrival_s if arrivals else 0.0
    round_s = policy.round_s
    next_tick = now + round_s if round_s else float("inf")
    last_changed = True
    # A policy whose decisions change with time alone (Tiresias demotes a running job once its service
    # passes a threshold) says so with ``time_driven = True``: its quiet round ticks are not skipped,
    # from its ``wake_at_s`` on if it keeps one.
    time_driven = bool(getattr(policy, "time_driven", False))
    ended = 0
    steps = 0
    cores = preemption.host_cores
    starting: dict[str, _State] = {}  # host_cores: placements whose start work is not done
    ps_at = now  # the time the starts' work was last brought up to

    def told(st: _State) -> tuple[float, float] | None:
        return None if restart_costs is None else restart_costs.for_model(st.job.model)

    def queue_end(st: _State) -> None:
        """Its start done (``ready_s`` known): the event of its end (or its out-of-memory failure)."""
        work = st.remaining * st.step_s + preemption.finish_s
        end = st.ready_s if st.oom_pending else st.ready_s + work
        heapq.heappush(heap, (end, 1 if st.oom_pending else 0, st.job.job_id, st.version))
        if restart_costs is not None:
            restart_costs.observe_start(st.ready_s - st.begin_s, st.job.model)

    def ps_rate(t: float) -> tuple[float, float]:
        """(each active start's work per second, when the next start becomes active) at ``t``."""
        ranks = sum(len(st.gpus) for st in starting.values() if st.begin_s <= t + _EPS)
        later = min((st.begin_s for st in starting.values() if st.begin_s > t + _EPS), default=_INF)
        assert cores is not None
        return (min(1.0, cores / ranks) if ranks else 0.0), later

    def ps_next() -> float:
        """When the next start finishes or begins, at the current rates."""
        if not starting:
            return _INF
        rate, later = ps_rate(ps_at)
        done = min((ps_at + st.start_left / rate for st in starting.values()
                    if rate > 0 and st.begin_s <= ps_at + _EPS), default=_INF)
        return min(done, later)

    def ps_advance(t: float) -> None:
        """Bring every start's work up to ``t`` (processor sharing of the host's cores); a start that
        finishes gets its ``ready_s`` and its end event."""
        nonlocal ps_at
        while starting and ps_at < t - _EPS:
            rate, later = ps_rate(ps_at)
            active = [st for st in starting.values() if st.begin_s <= ps_at + _EPS]
            nxt = min([t, later] + [ps_at + st.start_left / rate for st in active if rate > 0])
            for st in active:
                st.start_left -= (nxt - ps_at) * rate
                if st.start_left <= 1e-7:
                    st.start_left = 0.0
                    st.ready_s = nxt
                    del starting[st.job.job_id]
                    queue_end(st)
            ps_at = nxt
        ps_at = max(ps_at, t)

    def advance(st: _State, t: float) -> None:
        if st.status != "running":
            return
        start = max(st.last_update_s, st.ready_s)
        if t > start and not st.oom_pending:
            st.remaining = max(0.0, st.remaining - (t - start) / st.step_s)
        gpu_t = st.plan.gpu_type if st.plan else ""
        st.service[gpu_t] = st.service.get(gpu_t, 0.0) + (t - st.last_update_s) * len(st.gpus)
        st.last_update_s = t

    def charge_stop(st: _State, t: float) -> None:
        """The checkpoint costs of stopping ``st`` at ``t`` (after :func:`advance`)."""
        progress_s = t - st.ready_s if not st.oom_pending else 0.0
        if preemption.charge and preemption.finish_step:
            # The step in flight finishes, then the checkpoint is written and the ranks exit: the
            # GPUs (and the job's own next start) wait for both.
            drain = 0.0
            if progress_s > 0 and st.step_s > 0:
                frac = (progress_s / st.step_s) % 1.0
                if frac > 1e-9:
                    drain = (1.0 - frac) * st.step_s
                    st.remaining = max(1e-6, st.remaining - (1.0 - frac))
            st.ckpt_ready_s = t + drain + preemption.handover_s
            for g in st.gpus:
                free_at[g] = st.ckpt_ready_s
            if restart_costs is not None:  # the stop order to the GPUs' handover, as measured live
                restart_costs.observe_stop(st.ckpt_ready_s - t, st.job.model)
            return
        lost, write = preemption.stop_cost(st.job.speed.params, progress_s, st.step_s)
        if lost > 0 and st.step_s > 0:
            st.remaining = min(float(st.job.total_steps), st.remaining + lost / st.step_s)
            st.lost_s += lost
        st.write_delay_s = write

    def release(st: _State, t: float) -> None:
        nonlocal busy
        starting.pop(st.job.job_id, None)
        busy += (t - st.placed_s) * len(st.gpus)
        free.update(st.gpus)
        running.pop(st.job.job_id, None)
        st.gpus = ()
        st.plan = None
        st.version += 1

    def finish(st: _State, t: float, state: str) -> None:
        nonlocal ended
        st.status = state
        st.end_s = t
        ended += 1

    def apply(decision: Decision, t: float) -> bool:
        changed = False
        for jid in decision.preemptions:
            st = states.get(jid)
            if st is None or st.status != "running":
                raise SchedulerError(f"{policy.name}: preempted job {jid!r} is not running")
            advance(st, t)
            charge_stop(st, t)
            release(st, t)
            st.status = "queued"
            queue.append(jid)
            changed = True
        queue.sort(key=lambda j: (states[j].job.arrival_s, j))
        used: set[Gpu] = set()
        for pl in decision.placements:
            st = states.get(pl.job_id)
            if st is None or st.status not in ("queued", "running"):
                raise SchedulerError(f"{policy.name}: placed job {pl.job_id!r} is neither queued nor running")
            if st.status == "running" and st.plan == pl.plan and set(st.gpus) == set(pl.gpus):
                continue
            _check(policy.name, pl, free | set(st.gpus), used)
            if st.status == "running":
                advance(st, t)
                charge_stop(st, t)
                release(st, t)
            else:
                queue.remove(pl.job_id)
            used.update(pl.gpus)
            free.difference_update(pl.gpus)
            st.status = "running"
            st.plan = pl.plan
            st.gpus = tuple(pl.gpus)
            st.placed_s = t
            st.last_update_s = t
            resumed = st.remaining < st.job.total_steps
            begin = max([t, st.ckpt_ready_s] + [free_at.get(g, t) for g in pl.gpus])
            restart = preemption.restart_s(st.job.speed.restart_cost_s, resumed=resumed)
            st.begin_s = begin + st.write_delay_s
            st.ready_s = st.begin_s + restart
            st.write_delay_s = 0.0
            st.placements += 1
            st.gpu_types.append(pl.plan.gpu_type)
            if st.first_start_s is None:
                st.first_start_s = t
            if step_time is not None:
                st.step_s = step_time(st.job, pl.plan, peers_of(pl.gpus))
            else:
                st.step_s = st.job.speed.step_time_s(pl.plan, speed_of[pl.plan.gpu_type], peers_of(pl.gpus))
            st.oom_pending = not plan_fits(st.job, pl.plan)
            st.version += 1
            running[pl.job_id] = st
            if cores is not None and restart > 0:  # the start's work shares the host's cores
                st.start_left, st.ready_s = restart, _INF
                starting[pl.job_id] = st
            else:
                queue_end(st)
            changed = True
        return changed

    while ended < len(states):
        # Next event: arrival, completion/failure, or a round tick.
        t_arr = arrivals[next_arrival].arrival_s if next_arrival < len(arrivals) else float("inf")
        while heap and (heap[0][2] not in running or states[heap[0][2]].version != heap[0][3]):
            heapq.heappop(heap)
        t_end = heap[0][0] if heap else float("inf")
        t_tick = next_tick if (running or queue) else float("inf")
        t = min(t_arr, t_end, t_tick, ps_next())
        if t == float("inf") or t > max_time_s + (arrivals[0].arrival_s if arrivals else 0.0):
            break  # stuck: queued jobs the policy never places and nothing left to happen
        now = t
        if cores is not None:
            ps_advance(now)
        reason: Reason = "round"
        event = False
        while heap and heap[0][0] <= now + _EPS:
            _, kind, jid, ver = heapq.heappop(heap)
            st = states[jid]
            if jid not in running or st.version != ver:
                continue
            advance(st, now)
            event = True
            if kind == 0:
                release(st, now)
                finish(st, now, "completed")
                reason = "completion"
            else:
                release(st, now)
                st.oom_failures += 1
                reason = "failure"
                if st.oom_failures > MAX_OOM_RESUBMITS:
                    finish(st, now, "failed")
                else:
                    st.requested *= 2
                    st.status = "queued"
                    queue.append(jid)
        while next_arrival < len(arrivals) and arrivals[next_arrival].arrival_s <= now + _EPS:
            j = arrivals[next_arrival]
            next_arrival += 1
            states[j.job_id].status = "queued"
            queue.append(j.job_id)
            event = True
            if reason == "round":
                reason = "arrival"
        queue.sort(key=lambda j: (states[j].job.arrival_s, j))
        is_tick = now >= next_tick - _EPS
        if is_tick:
            while next_tick <= now + _EPS:
                next_tick += round_s if round_s else float("inf")
            if not event and not last_changed:
                if not running and next_arrival >= len(arrivals):
                    break  # stuck: nothing runs, nothing arrives, the policy places nothing
                # A time-driven policy wants the tick once its clock passes ``wake_at_s`` (if it keeps one);
                # with nothing running, time alone changes nothing.
                due = time_driven and running and now >= float(getattr(policy, "wake_at_s", 0.0)) - _EPS
                if not due:
                    continue  # fixpoint: same state as the last round, only the clock moved
        for st in running.values():
            advance(st, now)
        snap = Snapshot(
            now_s=now,
            reason=reason,
            cluster=cluster,
            free=tuple(sorted(free)),
            queued=tuple(states[j].view(told(states[j])) for j in queue),
            running=tuple(
                RunningJob(
                    job=st.view(told(st)), plan=st.plan, gpus=st.gpus, started_s=st.placed_s,
                    step_time_s=st.step_s, ready_s=st.ready_s,
                )
                for st in sorted(running.values(), key=lambda s: s.job.job_id)
                if st.plan is not None
            ),
        )
        t0 = clock()
        decision = policy.decide(snap, rng)
        decisions.append(clock() - t0)
        timeouts += decision.solver_timeouts
        last_changed = apply(decision, now)
        steps += 1
        if progress is not None and steps % 2000 == 0:
            progress(f"{policy.name}: t={now / 3600:.1f} h, {ended}/{len(states)} jobs ended")

    for st in states.values():
        if st.status in ("running", "queued", "future"):
            if st.status == "running":
                advance(st, now)
                release(st, now)
            finish(st, now, "unfinished")
    outcomes = tuple(
        JobOutcome(
            job_id=st.job.job_id,
            state=st.status,
            arrival_s=st.job.arrival_s,
            end_s=st.end_s,
            first_start_s=st.first_start_s,
            restarts=max(0, st.placements - 1 - st.oom_failures),
            oom_failures=st.oom_failures,
            gpu_types=tuple(st.gpu_types),
            lost_s=st.lost_s,
        )
        for st in sorted(states.values(), key=lambda s: s.job.job_id)
    )
    return PolicyResult(
        name=policy.name,
        outcomes=outcomes,
        busy_gpu_s=busy,
        total_gpus=len(all_gpus),
        decision_s=tuple(decisions),
        solver_timeouts=timeouts,
    )


def _check(name: str, pl: Placement, available: set[Gpu], used: set[Gpu]) -> None:
    gpus = pl.gpus
    if len(gpus) != pl.plan.gpus or len(set(gpus)) != len(gpus):
        raise SchedulerError(f"{name}: job {pl.job_id} got {len(gpus)} GPUs for a {pl.plan.gpus}-GPU plan")
    if any(g.gpu_type != pl.plan.gpu_type for g in gpus):
        raise SchedulerError(f"{name}: job {pl.job_id} placed on GPUs that are not {pl.plan.gpu_type}")
    if any(g in used or g not in available for g in gpus):
        raise SchedulerError(f"{name}: job {pl.job_id} placed on a GPU that is not free")
    if not tp_inside_peers(pl.plan, gpus):
        raise SchedulerError(f"{name}: job {pl.job_id} has a tensor-parallel group across peers")
