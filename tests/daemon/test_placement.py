"""Placement adapter: version matching, packing, tp groups inside one peer, wait vs infeasible."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import InfeasibleError
from frenzyd.has.frenzy import FrenzyPolicy
from frenzyd.jobs.model import JobSpec
from frenzyd.jobs.placement import (
    DEFAULT_START_S,
    DEFAULT_STOP_S,
    RESTART_WEIGHT,
    OfferedGpu,
    PeerOffer,
    QueuedJob,
    RestartCosts,
    RunningInfo,
    _pack,
    marp_plans,
    place,
    restart_key,
    schedule,
)
from frenzyd.jobs.step_fit import StepFit

GIB = 1 << 30


def spec(nproc: int = 2, mem: int = GIB, py: str = "3.11.7", torch: str = "2.13.0") -> JobSpec:
    return JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version=py,
                   torch_version=torch, nproc=nproc, mem_per_rank=mem)


def peer(nid: str, gpus: list[tuple[str, int, bool]], py: str = "3.11.9", torch: str = "2.13.0") -> PeerOffer:
    return PeerOffer(
        nid, nid.upper(), f"{nid}:1", py, torch,
        tuple(OfferedGpu(f"{nid}-{i}", i, t, gib * GIB, gib * GIB, True, avail)
              for i, (t, gib, avail) in enumerate(gpus)),
    )


def test_packs_onto_one_peer_when_possible() -> None:
    offers = [peer("a", [("T4", 16, True)]), peer("b", [("A10", 24, True), ("A10", 24, True)])]
    pl = place(spec(2), offers)
    assert pl is not None
    assert [(r.rank, r.peer, r.local_rank) for r in pl.ranks] == [(0, "b", 0), (1, "b", 1)]
    assert pl.backend == "gloo"
    assert pl.plan.peers == 1


def test_spans_peers_and_numbers_ranks_peer_by_peer() -> None:
    offers = [peer("a", [("T4", 16, True)]), peer("b", [("A10", 24, True)]), peer("c", [("L4", 24, False)])]
    pl = place(spec(2), offers)
    assert pl is not None
    assert sorted(r.peer for r in pl.ranks) == ["a", "b"]
    assert [r.rank for r in pl.ranks] == [0, 1]
    assert all(r.local_rank == 0 for r in pl.ranks)


def test_waits_when_busy_and_fails_when_never_fits() -> None:
    offers = [peer("a", [("T4", 16, False), ("T4", 16, True)])]
    assert place(spec(2), offers) is None
    with pytest.raises(InfeasibleError, match="--nproc"):
        place(spec(3), offers)
    with pytest.raises(InfeasibleError, match="--mem-per-rank"):
        place(spec(1, mem=17 * GIB), offers)


def test_version_mismatch_is_never_placed() -> None:
    offers = [peer("a", [("T4", 16, True)], torch="2.12.0")]
    with pytest.raises(InfeasibleError, match=r"torch 2\.13\.0"):
        place(spec(1), offers)
    offers.append(peer("b", [("T4", 16, True)], py="3.12.1"))
    with pytest.raises(InfeasibleError):
        place(spec(1), offers)
    offers.append(peer("c", [("T4", 16, True)]))
    pl = place(spec(1), offers)
    assert pl is not None
    assert pl.ranks[0].peer == "c"


def test_real_gpus_use_nccl() -> None:
    p = peer("a", [("A100-80GB", 80, True)])
    p = PeerOffer(p.node_id, p.name, p.address, p.python_version, p.torch_version,
                  tuple(OfferedGpu(g.uuid, g.index, g.type, g.memory_bytes, g.free_bytes, False, True)
                        for g in p.gpus))
    pl = place(spec(1), [p])
    assert pl is not None
    assert pl.backend == "nccl"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=0, max_size=6), min_size=1, max_size=5),
    st.integers(1, 12),
    st.sampled_from([1, 2, 4]),
)
def test_pack_respects_groups_and_availability(avail: list[list[bool]], need: int, tp: int) -> None:
    offers = [peer(f"p{i}", [("A10", 24, a) for a in row]) for i, row in enumerate(avail)]
    groups = {p.node_id: [g for g in p.gpus if g.available] for p in offers}
    chosen = _pack(offers, groups, need, group=tp)
    possible = sum(len(gs) - len(gs) % tp for gs in groups.values())
    if need % tp or possible < need:
        assert chosen is None or sum(len(gs) for _, gs in chosen) == need
        if possible < need:
            assert chosen is None
        return
    assert chosen is not None
    assert sum(len(gs) for _, gs in chosen) == need
    used = [g.uuid for _, gs in chosen for g in gs]
    assert len(set(used)) == need
    for _, gs in chosen:
        assert all(g.available for g in gs)
        assert len(gs) % tp == 0


def q(job_id: str, s: JobSpec, t: float = 0.0) -> QueuedJob:
    return QueuedJob(job_id, s, t)


def test_schedule_uses_has_and_prefers_the_smaller_memory_type() -> None:
    # Within HAS's cost slack the 24 GB GPUs are taken, keeping the 48 GB A6000s for jobs only they hold.
    offers = [peer("a", [("RTX-3090", 24, True)] * 2), peer("b", [("A10", 24, True)] * 2),
              peer("c", [("RTX-A6000", 48, True)] * 2)]
    sched = schedule([q("j1", spec(2, 8 * GIB))], offers, now_s=0.0)
    assert sched.policy == "frenzy"
    assert not sched.infeasible
    (job, pl), = sched.start
    assert job == "j1"
    assert pl.plan.policy == "frenzy"
    assert pl.plan.gpu_type == "RTX-3090"  # faster than the A10, same memory
    assert [(r.rank, r.peer, r.local_rank) for r in pl.ranks] == [(0, "a", 0), (1, "a", 1)]


def test_schedule_never_gives_a_gpu_twice_and_reports_infeasible() -> None:
    offers = [peer("a", [("T4", 16, True)] * 2), peer("b", [("T4", 16, True)])]
    queue = [q("j1", spec(2), 0.0), q("j2", spec(2), 1.0), q("big", spec(1, 40 * GIB), 2.0)]
    sched = schedule(queue, offers, now_s=10.0)
    assert [j for j, _ in sched.infeasible] == ["big"]
    used = [r.gpu for _, pl in sched.start for r in pl.ranks]
    assert len(used) == len(set(used))
    assert len(sched.start) == 1  # three free GPUs: only one 2-rank job fits now


def test_schedule_places_a_declared_job_across_gpu_types() -> None:
    # 20 GiB ranks: one A100 and one A6000 hold them, no single type has two.
    offers = [peer("n0", [("A100-80GB", 80, True)]), peer("n1", [("RTX-A6000", 48, True)]),
              peer("n2", [("T4", 16, True)])]
    sched = schedule([q("j", spec(2, 20 * GIB))], offers, now_s=0.0)
    (_, pl), = sched.start
    assert {r.peer for r in pl.ranks} == {"n0", "n1"}
    assert pl.plan.policy.startswith("packing")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["T4", "A10", "A100-80GB"]), st.integers(0, 3), st.booleans()),
             min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(1, 4), st.sampled_from([4, 12, 20, 60])), min_size=1, max_size=5),
)
def test_schedule_properties(peers_spec: list[tuple[str, int, bool]], jobs: list[tuple[int, int]]) -> None:
    mem = {"T4": 16, "A10": 24, "A100-80GB": 80}
    offers = [peer(f"p{i}", [(t, mem[t], avail)] * n) for i, (t, n, avail) in enumerate(peers_spec)]
    queue = [q(f"j{i}", spec(n, gib * GIB), float(i)) for i, (n, gib) in enumerate(jobs)]
    sched = schedule(queue, offers, now_s=100.0)
    free = {g.uuid: g for p in offers for g in p.gpus if g.available}
    used: list[str] = []
    for job_id, pl in sched.start:
        s = next(x.spec for x in queue if x.job_id == job_id)
        assert len(pl.ranks) == s.nproc
        assert [r.rank for r in pl.ranks] == list(range(len(pl.ranks)))
        for r in pl.ranks:
            assert r.gpu in free
            assert free[r.gpu].memory_bytes >= (s.mem_per_rank or 0)
        used += [r.gpu for r in pl.ranks]
    assert len(used) == len(set(used))
    assert not {j for j, _ in sched.start} & {j for j, _ in sched.infeasible}


def test_schedule_model_job_uses_marp_plans() -> None:
    s = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                torch_version="2.13.0", model="tiny-gpt2", seq_len=128, micro_batch=1, global_batch=4,
                dtype="fp32")
    offers = [peer("a", [("T4", 16, True)] * 2), peer("b", [("A100-80GB", 80, True)])]
    sched = schedule([q("m", s)], offers, now_s=0.0)
    (_, pl), = sched.start
    assert pl.plan.source == "marp"
    assert pl.plan.policy == "frenzy"
    assert 0 < pl.plan.bytes_per_gpu < 16 * GIB
    assert pl.plan.step_time_s > 0
    assert len(pl.ranks) == pl.plan.gpus == pl.plan.dp * pl.plan.tp * pl.plan.pp
    bad = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                  torch_version="2.13.0", model="/etc/passwd", seq_len=128)
    sched = schedule([q("x", bad)], offers, now_s=0.0)
    assert sched.infeasible
    assert "unknown model preset" in sched.infeasible[0][1]


def stepped(steps: int | None) -> JobSpec:
    s = spec(2, 4 * GIB)
    return JobSpec(**{**s.to_dict(), "argv": tuple(s.argv), "steps": steps})


@pytest.mark.parametrize(
    ("first", "second", "starts"),
    [
        (None, None, "early"),  # nobody declares work: arrival order
        (10_000, 100, "late"),  # shorter declared work first, though it came later
        (100, 10_000, "early"),
        (100, None, "early"),
        # Undeclared work counts as long as the longest declared job: arrival breaks the tie.
        (None, 100, "early"),
        (10_000, None, "early"),
    ],
)
def test_schedule_runs_shorter_declared_work_first(
    first: int | None, second: int | None, starts: str
) -> None:
    offers = [peer("a", [("T4", 16, True)] * 2)]  # room for one 2-rank job
    queue = [q("early", stepped(first), 0.0), q("late", stepped(second), 5.0)]
    sched = schedule(queue, offers, now_s=10.0)
    assert [j for j, _ in sched.start] == [starts]


def test_schedule_puts_undeclared_work_behind_shorter_declared_work() -> None:
    offers = [peer("a", [("T4", 16, True)] * 2)]
    queue = [
        q("undeclared", stepped(None), 0.0), q("long", stepped(10_000), 1.0), q("short", stepped(100), 2.0)
    ]
    assert [j for j, _ in schedule(queue, offers, now_s=10.0).start] == ["short"]
    # Room for two: the undeclared job ties the long one and came first.
    offers = [peer("a", [("T4", 16, True)] * 4)]
    assert [j for j, _ in schedule(queue, offers, now_s=10.0).start] == ["short", "undeclared"]


TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
        "tie_word_embeddings": False, "attention_dropout": 0.0}


def trainer_spec(steps: int) -> JobSpec:
    return JobSpec(argv=(), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                   torch_version="2.13.0", model_config=TINY, seq_len=16, global_batch=8, steps=steps,
                   dtype="fp32", trainer=True, data_name="corpus.txt")


def test_schedule_preempts_a_long_running_job_for_a_short_one_and_keeps_its_gpus_for_it() -> None:
    """HAS gets the running checkpointable jobs: on a full pool a short job makes a much longer one
    stop; its placement waits (``pending``) for the GPU the stop frees.  A job that has run less than
    the policy's ``min_run_s`` is left alone, and so is one whose GPU its peer does not show busy, and
    one with less time left than its own restart would cost."""
    busy = [peer("b", [("T4", 16, False)])]
    # The tiny model's modelled step is ~1 us: 10^9 steps are ~1,000 s, more than a restart (~96 s).
    long = trainer_spec(1_000_000_000)
    plan = marp_plans(long, [peer("b", [("T4", 16, True)])], headroom=0.1, only_available=False)[0]
    running = [RunningInfo("long", long, plan, (("b", 0),), started_s=0.0, done_steps=10)]
    queue = [QueuedJob("short", trainer_spec(6), 50.0)]
    sched = schedule(queue, busy, now_s=100.0, running=running, policy=FrenzyPolicy(min_run_s=2.0))
    assert sched.preempt == (("long", "making room for job short"),)
    (job, pl), = sched.pending
    assert job == "short"
    assert [(r.peer, r.gpu) for r in pl.ranks] == [("b", "b-0")]
    assert sched.start == ()
    young = schedule(queue, busy, now_s=100.0, running=running, policy=FrenzyPolicy(min_run_s=200.0))
    assert (young.preempt, young.pending) == ((), ())
    shown_free = schedule([], [peer("b", [("T4", 16, True)])], now_s=100.0, running=running,
                          policy=FrenzyPolicy(min_run_s=2.0))
    assert shown_free.preempt == ()
    # 100,000 steps (~0.1 s) left: stopping it would cost more than the short job gains.
    nearly_done = [replace(running[0], spec=trainer_spec(100_000))]
    nearly = schedule(queue, busy, now_s=100.0, running=nearly_done, policy=FrenzyPolicy(min_run_s=2.0))
    assert (nearly.preempt, nearly.pending) == ((), ())


def test_a_measured_step_corrects_the_running_job_and_the_newcomers_of_its_model() -> None:
    """MARP predicts the tiny model at ~1 us a step; the pool measures 50 ms.  Told the measurement,
    HAS sees the 100,000 steps left as ~5,000 s (not ~0.1 s) and stops the job for a newcomer of the
    same model whose 1,000 steps its model's fit prices at ~50 s, but not for one whose time, on
    the same fit, is no shorter than what the running job has left.  The pass reports the fit."""
    busy = [peer("b", [("T4", 16, False)])]
    spec_ = trainer_spec(100_000)
    plan = marp_plans(spec_, [peer("b", [("T4", 16, True)])], headroom=0.1, only_available=False)[0]
    assert plan.step_time_s is not None
    assert plan.step_time_s < 1e-4
    measured = RunningInfo("long", spec_, plan, (("b", 0),), started_s=0.0, done_steps=10, step_s=0.05)
    policy = FrenzyPolicy(min_run_s=2.0)
    fit = StepFit.of(0.05, plan.step_time_s)
    assert fit is not None
    assert fit.scale == 1.0
    assert fit.extra_s == pytest.approx(0.05, rel=0.01)
    models = {restart_key(spec_): fit}  # the newcomers' model: the running job's
    short = [QueuedJob("short", trainer_spec(1000), 50.0)]
    sched = schedule(short, busy, now_s=1000.0, running=[measured], policy=policy, model_fits=models)
    assert sched.preempt == (("long", "making room for job short"),)
    assert sched.fits == (("long", fit),)
    as_long = [QueuedJob("short", trainer_spec(100_000), 50.0)]
    assert schedule(as_long, busy, now_s=1000.0, running=[measured], policy=policy,
                    model_fits=models).preempt == ()
    assert schedule([replace(as_long[0], fit=fit)], busy, now_s=1000.0, running=[measured],
                    policy=policy).preempt == ()  # its own fit, as its model's
    # Without its model's fit the newcomer looks ~0.1 s long: a measurement on one side only.
    assert schedule(as_long, busy, now_s=1000.0, running=[measured], policy=policy).preempt != ()
    # Unmeasured, the prediction stands: ~0.1 s left, and nothing pays for a restart.
    unmeasured = replace(measured, step_s=None)
    assert schedule(short, busy, now_s=1000.0, running=[unmeasured], policy=policy).preempt == ()
    # Between attempts the job keeps its fit (or its model's): its last measurement prices it until
    # this attempt's comes.
    for running, told in (([replace(unmeasured, fit=fit)], None), ([unmeasured], models)):
        assert schedule(short, busy, now_s=1000.0, running=running, policy=policy,
                        model_fits=told).preempt == (("long", "making room for job short"),)


def test_an_overhead_the_model_does_not_explain_moves_no_job_and_a_plan_keeps_marps_step() -> None:
    """A step measured above MARP's prediction is an overhead a faster GPU does not shrink: the
    tiny job measured at 50 ms a step on a T4 stays there when an A100 frees (scaled by the
    measurement, the A100 would look 5x faster on paper, and the job would move every pass).
    Measured below the prediction, every plan shrinks by the factor: the job is still worth moving
    onto the A100, and the plan it moves with carries MARP's step, not the pool's correction."""
    spec_ = trainer_spec(1_000_000_000)
    plan = marp_plans(spec_, [peer("b", [("T4", 16, True)])], headroom=0.1, only_available=False)[0]
    offers = [peer("b", [("T4", 16, False)]), peer("a", [("A100-80GB", 80, True)])]
    policy = FrenzyPolicy(min_run_s=2.0)
    running = RunningInfo("long", spec_, plan, (("b", 0),), started_s=0.0, done_steps=10)
    moved = schedule([], offers, now_s=1000.0, running=[running], policy=policy)
    assert moved.preempt == (("long", "moved to a new plan by the scheduler"),)  # the model's gain
    marp_a100 = moved.pending[0][1].plan.step_time_s
    assert moved.pending[0][1].plan.gpu_type == "A100-80GB"
    stays = schedule([], offers, now_s=1000.0, running=[replace(running, step_s=0.05)], policy=policy)
    assert (stays.preempt, stays.pending) == ((), ())
    assert stays.fits[0][1].extra_s > 0
    assert plan.step_time_s is not None
    faster = replace(running, step_s=plan.step_time_s / 2)
    sched = schedule([], offers, now_s=1000.0, running=[faster], policy=policy)
    assert sched.fits == (("long", StepFit(0.5, 0.0)),)
    (job, pl), = sched.pending
    assert (job, pl.plan.gpu_type) == ("long", "A100-80GB")
    assert pl.plan.step_time_s == pytest.approx(marp_a100, rel=1e-9)


@pytest.mark.parametrize("policy", ["fifo", "srtf", "tiresias"])
def test_every_live_policy_places_a_trainer_job(policy: str) -> None:
    """jobs.policy = fifo crashed the pass (StopIteration): its user plan (ZeRO-3 on the requested
    GPUs) is not among the trainer's MARP plans.  A policy's own plan shape now runs as MARP's best
    plan of that GPU type and count."""
    from frenzyd.has.registry import load_policy

    spec = JobSpec(argv=(), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                   torch_version="2.13.0", model="gpt2", seq_len=1024, global_batch=16, steps=10,
                   dtype="bf16-mixed", trainer=True, data_name="corpus.txt")
    offers = [peer("a", [("A100-80GB", 80, True)])]
    sched = schedule([q("j", spec)], offers, now_s=0.0, policy=load_policy(policy))
    (job, pl), = sched.start
    assert job == "j"
    assert pl.plan.source == "marp"
    assert pl.plan.policy == policy
    assert len(pl.ranks) == pl.plan.gpus == pl.plan.dp * pl.plan.tp * pl.plan.pp


def test_restart_costs_start_conservative_and_follow_what_the_pool_measures() -> None:
    costs = RestartCosts()
    assert costs.restart_s == DEFAULT_START_S + DEFAULT_STOP_S >= 90.0  # ~ what a loaded pool paid
    assert costs.observe_start(8.0)
    assert costs.observe_stop(2.0)
    assert costs.start_s == pytest.approx(DEFAULT_START_S + RESTART_WEIGHT * (8.0 - DEFAULT_START_S))
    assert costs.stop_s == pytest.approx(DEFAULT_STOP_S + RESTART_WEIGHT * (2.0 - DEFAULT_STOP_S))
    for _ in range(40):
        costs.observe_start(8.0)
        costs.observe_stop(2.0)
    assert costs.restart_s == pytest.approx(10.0, abs=0.001)
    assert not costs.observe_start(float("nan"))
    assert not costs.observe_stop(-1.0)
    assert costs.to_dict() == {"restart_s": 10.0, "start_s": 8.0, "stop_s": 2.0, "starts_measured": 41,
                               "stops_measured": 41}
    pinned = RestartCosts(start_s=1.0, stop_s=1.0, weight=0.0)
    pinned.observe_start(50.0)
    assert pinned.restart_s == 2.0
    with pytest.raises(ValueError, match="weight"):
        RestartCosts(weight=1.5)
    with pytest.raises(ValueError, match="non-negative"):
        RestartCosts(start_s=-1.0)


def stand_in_spec(steps: int, model: str = "gpt2-medium", seq_len: int = 1024) -> JobSpec:
    """A paced stand-in: gpt2-medium at 1024 takes 1.44 s a step on one T4, 0.82 s on two, 0.5 s on
    an A100 (MARP, the stand-in's floor); gpt2 at 128 0.5 s on one GPU of any type."""
    return JobSpec(argv=(), payload_sha256="0" * 64, payload_size=0, python_version="3.11.7",
                   torch_version="2.13.0", model=model, seq_len=seq_len,
                   global_batch=16 if seq_len > 128 else 8, steps=steps, dtype="fp32", trainer=True,
                   data_name="corpus.txt", stand_in=True)


def plan_of(s: JobSpec, gpu_type: str, gpus: int) -> Any:
    offers = [peer("x", [(gpu_type, 80 if gpu_type.startswith("A100") else 16, True)] * gpus)]
    plan = next(p for p in marp_plans(s, offers, headroom=0.1, only_available=False)
                if (p.gpu_type, p.gpus) == (gpu_type, gpus))
    return replace(plan, backend="gloo")


def test_schedule_grows_a_job_onto_an_idle_gpu_only_when_its_measured_restart_pays() -> None:
    """GROW is carried out as a stop (preempt) and the job's own bigger plan kept for it (pending) on
    its GPU and the idle one.  The pool's restart cost decides it: 2 s pays, the default 96 s does not."""
    long = stand_in_spec(20)
    offers = [peer("b", [("T4", 16, False), ("T4", 16, True)])]
    running = [RunningInfo("long", long, plan_of(long, "T4", 1), (("b", 0),), started_s=0.0)]
    quick = RestartCosts(start_s=1.0, stop_s=1.0, weight=0.0)
    sched = schedule([], offers, now_s=10.0, running=running, policy=FrenzyPolicy(min_run_s=2.0),
                     restart=quick)
    assert [j for j, _ in sched.preempt] == ["long"]
    (job, pl), = sched.pending
    assert job == "long"
    assert sorted(r.gpu for r in pl.ranks) == ["b-0", "b-1"]
    assert pl.plan.gpus == 2
    assert sched.start == ()
    slow = schedule([], offers, now_s=10.0, running=running, policy=FrenzyPolicy(min_run_s=2.0),
                    restart=RestartCosts())
    assert (slow.preempt, slow.pending) == ((), ())


def test_schedule_shrinks_a_grown_job_for_a_short_one_keeping_one_of_its_gpus() -> None:
    """SHRINK is carried out as a stop of the donor, its own smaller plan on a GPU it keeps, and the
    short job on the GPU it gives up, both waiting (pending) for the stop."""
    long = stand_in_spec(20)
    offers = [peer("b", [("T4", 16, False), ("T4", 16, False)])]
    running = [RunningInfo("long", long, plan_of(long, "T4", 2), (("b", 0), ("b", 1)), started_s=0.0,
                           done_steps=5)]
    queue = [q("short", stand_in_spec(2, "gpt2", 128), 9.0)]
    sched = schedule(queue, offers, now_s=10.0, running=running, policy=FrenzyPolicy(min_run_s=2.0),
                     restart=RestartCosts(start_s=1.0, stop_s=1.0, weight=0.0))
    assert [j for j, _ in sched.preempt] == ["long"]
    pending = dict(sched.pending)
    assert set(pending) == {"long", "short"}
    assert pending["long"].plan.gpus == 1
    assert pending["short"].plan.gpus == 1
    assert {pending["long"].ranks[0].gpu, pending["short"].ranks[0].gpu} == {"b-0", "b-1"}
    assert sched.start == ()


def test_schedule_upgrades_a_job_onto_freed_faster_gpus_and_gives_its_slow_one_to_a_waiting_job() -> None:
    """UPGRADE is carried out as a stop of the mover, its new plan on the freed A100 and the waiting
    job's on the T4 it gives up, both pending until the stop."""
    mover = stand_in_spec(20)
    offers = [peer("s", [("T4", 16, False)]), peer("f", [("A100-80GB", 80, True)])]
    running = [RunningInfo("mover", mover, plan_of(mover, "T4", 1), (("s", 0),), started_s=0.0, done_steps=2)]
    queue = [q("waiting", stand_in_spec(400), 9.0)]
    sched = schedule(queue, offers, now_s=10.0, running=running, policy=FrenzyPolicy(min_run_s=2.0),
                     restart=RestartCosts(start_s=1.0, stop_s=1.0, weight=0.0))
    assert sched.preempt == (("mover", "making room for job waiting"),)
    pending = dict(sched.pending)
    assert pending["mover"].plan.gpu_type == "A100-80GB"
    assert [r.gpu for r in pending["mover"].ranks] == ["f-0"]
    assert [r.gpu for r in pending["waiting"].ranks] == ["s-0"]
    assert sched.start == ()
