"""scripts/jct_bound.py: the LP bound is exact where the answer is known, and no policy of a run beats it."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_sched  # noqa: E402
import jct_bound  # noqa: E402

from frenzyd.has.registry import load_policy  # noqa: E402
from frenzyd.sim import jobs as sim_jobs  # noqa: E402
from frenzyd.sim.cluster import parse_cluster_toml  # noqa: E402
from frenzyd.sim.mapping import map_jobs  # noqa: E402
from frenzyd.sim.preemption import DEFAULT  # noqa: E402
from frenzyd.sim.run import run_policies  # noqa: E402
from frenzyd.sim.trace import parse_philly_csv, split_window  # noqa: E402

LAB = bench_sched.clusters(True)["lab-20"]
ONE_GPU = parse_cluster_toml('[[nodes]]\nname = "ws"\ngpus = { A100-80GB = 1 }\n')


def a100_peers(*sizes: int):
    return parse_cluster_toml(
        "".join(f'[[nodes]]\nname = "n{i}"\ngpus = {{ A100-80GB = {k} }}\n' for i, k in enumerate(sizes))
    )


TWO_GPU_PEERS = a100_peers(2, 2, 2, 2)


@pytest.fixture(scope="module")
def trace() -> list:
    return parse_philly_csv((bench_sched.DATA / "philly.csv").read_text())


def window_jobs(trace: list, cluster, n: int, load: float, window: int = 0) -> list:
    jobs, _ = sim_jobs.prepare_jobs(
        map_jobs(split_window(trace, n, window, "tune"), "gpus", window), cluster, sim_jobs.MarpPlanSource(),
        load=load,
    )
    return jobs


def test_a_job_alone_is_bounded_by_exactly_its_time_alone(trace: list) -> None:
    job = window_jobs(trace, LAB, 30, 1.0)[0]
    b = jct_bound.lower_bound([job], LAB, horizon_s=job.arrival_s + 10 * sim_jobs.alone_jct_s(job))
    assert b.avg_jct_s == pytest.approx(sim_jobs.alone_jct_s(job), rel=1e-6)


def test_a_job_that_one_peer_would_run_faster_is_bounded_by_exactly_its_time_alone(trace: list) -> None:
    # Four 2-GPU peers: a plan on more than 2 GPUs pays the inter-peer bus on any placement.  The LP once
    # charged every plan its one-peer step time; for this job that is faster than any real placement
    # (a gpt2 whose 8-GPU plan would beat its 2-GPU one inside one peer), and the bound fell below its
    # time alone.
    speed_of = {t.name: t.speed for t in TWO_GPU_PEERS.types}

    def fastest_s(job, sizes: list[int]) -> float:
        rates = jct_bound.job_rates(job, {"A100-80GB": 8}, speed_of, {"A100-80GB": sizes}, ["A100-80GB"])
        return 1.0 / max(r.rate for r in rates)

    jobs = window_jobs(trace, TWO_GPU_PEERS, 60, 1.0)
    job = next(j for j in jobs if fastest_s(j, [8]) < 0.9 * fastest_s(j, [2, 2, 2, 2]))
    alone = sim_jobs.alone_jct_s(job)
    assert fastest_s(job, [2, 2, 2, 2]) == pytest.approx(alone - job.speed.restart_cost_s)
    b = jct_bound.lower_bound([job], TWO_GPU_PEERS, horizon_s=job.arrival_s + 10 * alone)
    assert b.avg_jct_s == pytest.approx(alone, rel=1e-6)


def test_plans_inside_one_peer_compete_for_the_peers_that_can_hold_them(trace: list) -> None:
    # One 4-GPU peer and two 2-GPU peers.  A job whose 4-GPU plan inside one peer is over twice as fast as
    # anything the 2-GPU peers run (its data-parallel gradients crawl between peers), and a twin: only one
    # of them can have the big peer at a time.  The LP once let every plan that fits the type's largest
    # peer run inside one, any number at once: it bounded this pair as if there were two big peers.
    mixed, even = a100_peers(4, 2, 2), a100_peers(4, 4)
    speed_of = {t.name: t.speed for t in mixed.types}

    def rates(job, cluster) -> list:
        sizes = jct_bound.peer_sizes(cluster)
        return jct_bound.job_rates(job, {"A100-80GB": 8}, speed_of, sizes, ["A100-80GB"])

    def big_peer_gain(job) -> float:
        rs = rates(job, mixed)
        inside = [r.rate for r in rs if r.band == 1]
        return max(inside, default=0.0) / max((r.rate for r in rs if r.band == 0), default=float("inf"))

    job = next(j for j in window_jobs(trace, mixed, 60, 1.0) if big_peer_gain(j) > 2.0)
    assert {(r.gpus, r.band) for r in rates(job, mixed) if r.band == 1} == {(4, 1)}
    assert all(r.band == 0 for r in rates(job, even))  # two big peers: nothing to compete for
    twin = dataclasses.replace(job, job_id=job.job_id + "-twin")
    alone = sim_jobs.alone_jct_s(job)
    horizon = job.arrival_s + 4 * alone
    on_even = jct_bound.lower_bound([job, twin], even, horizon_s=horizon)
    on_mixed = jct_bound.lower_bound([job, twin], mixed, horizon_s=horizon)
    assert on_even.avg_jct_s == pytest.approx(alone, rel=1e-6)  # each on its own big peer
    assert on_mixed.avg_jct_s > 1.1 * alone
    _, results = run_policies(
        [load_policy(p) for p in ("srtf", "frenzy")], [job, twin], mixed, seed=0, clock=time.perf_counter
    )
    for r in results:
        assert sum(o.end_s - o.arrival_s for o in r.outcomes) / 2 >= on_mixed.avg_jct_s, r.name


def test_a_numerical_error_of_the_interior_point_falls_back_to_the_simplex(
    trace: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HiGHS' interior point stopped with "Solve error" on one 64-GPU window after minutes of work and took
    # the whole run's windows with it; its dual simplex solved the same LP in seconds.
    job = window_jobs(trace, LAB, 30, 1.0)[0]
    horizon = job.arrival_s + 10 * sim_jobs.alone_jct_s(job)
    real = jct_bound.linprog
    calls: list[str] = []

    def ipm_fails(*args, method: str, **kwargs):
        calls.append(method)
        res = real(*args, method=method, **kwargs)
        if method == "highs-ipm":
            res.status, res.message = 4, "Solve error (forced by the test)"
        return res

    monkeypatch.setattr(jct_bound, "linprog", ipm_fails)
    b = jct_bound.lower_bound([job], LAB, horizon_s=horizon)
    assert calls == ["highs-ipm", "highs-ds"]
    assert b.solver == "highs-ds"
    assert b.avg_jct_s == pytest.approx(sim_jobs.alone_jct_s(job), rel=1e-6)

    def every_method_fails(*args, method: str, **kwargs):
        res = real(*args, method=method, **kwargs)
        res.status, res.message = 4, f"Solve error in {method}"
        return res

    monkeypatch.setattr(jct_bound, "linprog", every_method_fails)
    both = "highs-ipm: Solve error in highs-ipm; highs-ds: Solve error in highs-ds"
    with pytest.raises(RuntimeError, match=both):
        jct_bound.lower_bound([job], LAB, horizon_s=horizon)


def test_two_jobs_on_one_gpu_are_bounded_by_running_one_after_the_other(trace: list) -> None:
    # One GPU, two copies of a job arriving together: one runs first, the other after it.  The fluid bound
    # is the start-up plus 1.5x the run (the second job's start-up overlaps the first's run in the
    # relaxation, so the bound sits half a start-up below the 1.5x start-up of any real schedule).
    job = next(j for j in window_jobs(trace, ONE_GPU, 30, 1.0) if j.total_steps > 0)
    twin = dataclasses.replace(job, job_id=job.job_id + "-twin")
    r0 = DEFAULT.restart_s(job.speed.restart_cost_s, resumed=False)
    run = sim_jobs.alone_jct_s(job) - job.speed.restart_cost_s
    horizon = job.arrival_s + 3 * (r0 + run)
    b = jct_bound.lower_bound([job, twin], ONE_GPU, horizon_s=horizon, slots=400)
    exact = r0 + 1.5 * run
    slot = (horizon - job.arrival_s) / 400
    assert exact - slot <= b.avg_jct_s <= exact * (1 + 1e-6)
    # A real schedule: both policies pay the second start-up in full.
    _, results = run_policies([load_policy("srtf")], [job, twin], ONE_GPU, seed=0, clock=time.perf_counter)
    avg = sum(o.end_s - o.arrival_s for o in results[0].outcomes) / 2
    assert avg == pytest.approx(1.5 * r0 + 1.5 * run, rel=1e-6)
    assert b.avg_jct_s < avg


def test_no_policy_of_a_loaded_window_beats_the_bound_and_it_beats_the_alone_limit(trace: list) -> None:
    jobs = window_jobs(trace, LAB, 40, 3.0, window=3)  # alone 0.28 h on average, frenzy 0.48 h, srtf 1.22 h
    names = ("frenzy", "sia", "srtf", "srtf-wide", "tiresias", "gavel")
    _, results = run_policies(
        [load_policy(p, sia_time_limit_s=2.0) for p in names], jobs, LAB, seed=0, clock=time.perf_counter
    )
    horizon = max(o.end_s for r in results for o in r.outcomes if o.state == "completed")
    best = min(results, key=lambda r: sum(o.end_s for o in r.outcomes))
    b = jct_bound.lower_bound(jobs, LAB, horizon_s=horizon, slots=150, marks=[o.end_s for o in best.outcomes])
    limit = sim_jobs.limit_jct_s(jobs)
    assert b.avg_jct_s > 1.1 * limit  # contention the alone limit cannot see (here 1.19x)
    for r in results:
        done = [o.end_s - o.arrival_s for o in r.outcomes if o.state == "completed"]
        assert len(done) == len(jobs), r.name
        assert sum(done) / len(done) >= b.avg_jct_s, r.name


def best_mix(points: list[tuple[int, float]], n: int) -> float:
    """The best rate a time-share of two of these (GPUs, rate) plans reaches on at most ``n`` GPUs."""
    best = 0.0
    for (na, ra), (nb, rb) in itertools.product(points, points):
        if na <= n <= nb and nb > na:
            best = max(best, ra + (rb - ra) * (n - na) / (nb - na))
        elif nb <= n:
            best = max(best, rb)
    return best


def test_a_plan_inside_a_larger_peer_is_kept_only_where_it_beats_what_any_peer_runs(trace: list) -> None:
    mixed = a100_peers(4, 2, 2)
    speed_of = {t.name: t.speed for t in mixed.types}
    sizes = jct_bound.peer_sizes(mixed)
    assert sizes == {"A100-80GB": [4, 2, 2]}
    inside_big_peer = 0
    for job in window_jobs(trace, mixed, 40, 1.0):
        rs = jct_bound.job_rates(job, {"A100-80GB": 8}, speed_of, sizes, ["A100-80GB"])
        band0 = [(0, 0.0)] + [(r.gpus, r.rate) for r in rs if r.band == 0]
        for r in rs:
            assert r.band in (0, 1)
            if r.band == 1:  # inside one 4-GPU peer, and faster than any mix of band-0 plans on as many GPUs
                assert 2 < r.gpus <= 4
                assert r.rate > best_mix(band0, r.gpus)
                inside_big_peer += 1
        fastest = max(r.rate for r in rs)
        one_peer = max(
            1.0 / (job.total_steps * job.speed.step_time_s(p, speed_of[p.gpu_type], 1))
            for p in job.plans if p.gpus <= 4 and jct_bound.plan_fits(job, p)
        )
        assert fastest >= one_peer * (1 - 1e-12)  # the fastest plan inside a peer is never dropped
    assert inside_big_peer > 0  # the window has jobs for which the big peer is worth its cap


def test_plans_under_the_hull_are_dropped_and_the_fastest_is_kept(trace: list) -> None:
    job = max(window_jobs(trace, LAB, 30, 1.0), key=lambda j: len(j.plans))
    counts = {"A100-80GB": 2, "T4": 8}
    speed_of = {t.name: t.speed for t in LAB.types}
    rates = jct_bound.job_rates(job, counts, speed_of, jct_bound.peer_sizes(LAB), sorted(counts))
    assert rates, "the job fits these types"
    for ti in {r.type_index for r in rates}:
        hull = [(0, 0.0)] + [(r.gpus, r.rate) for r in rates if r.type_index == ti]
        # Strictly concave: each added GPU buys less than the one before.
        slopes = [(r2 - r1) / (n2 - n1) for (n1, r1), (n2, r2) in itertools.pairwise(hull)]
        assert all(a > b for a, b in itertools.pairwise(slopes))
    fastest = 1.0 / (job.total_steps * min(p.step_time_s for p in job.plans if p.gpu_type in counts))
    assert max(r.rate for r in rates) == pytest.approx(fastest)


def test_a_report_from_other_jobs_is_refused_with_what_to_do(tmp_path: Path, trace: list) -> None:
    report = tmp_path / "r.json"
    out = tmp_path / "o.json"
    assert bench_sched.main(["--tiny", "--out", str(report)]) == 0
    args = ["--from", str(report), "--slots", "50", "--processes", "1"]
    assert jct_bound.main([*args, "--json", str(out)]) == 0
    body = json.loads(out.read_text())
    (cell,) = body["cells"]
    assert cell["lp_avg_jct_s"] >= cell["limit_avg_jct_s"] * (1 - 1e-9)  # on the lab pool the LP is tighter
    assert cell["bound_avg_jct_s"] == pytest.approx(cell["lp_avg_jct_s"])
    assert cell["below_bound"] == []  # every policy that completed every job (FIFO fails some: not counted)
    assert cell["x_bound"]["frenzy"] >= 1
    assert cell["x_bound"]["sia"] >= 1
    saved = out.read_text()
    assert jct_bound.main(["--render", str(out)]) == 0  # the table again from the saved windows, no LP
    assert json.loads(out.read_text()) == json.loads(saved)
    data = json.loads(report.read_text())
    for outs in data["jct_cells"][0]["jobs_per_policy"].values():
        outs[0]["arrival_s"] += 1.0  # one job arrives a second later than this code makes it
    report.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="rerun bench_sched"):
        jct_bound.main(["--from", str(report), "--processes", "1"])
    with pytest.raises(SystemExit, match="no cell"):
        jct_bound.main(["--from", str(report), "--cells", "alibaba-64", "--processes", "1"])


def _window(seed: int, lp_s: float, limit_s: float, policies: dict[str, float]) -> dict:
    return {
        "cell": "alibaba-256:1:gpus", "seed": seed, "limit_avg_jct_s": limit_s, "policies": policies,
        "completed_all": dict.fromkeys(policies, True),
        "bound": {"avg_jct_s": lp_s, "slot_s": 60.0, "variables": 10, "solve_s": 1.0},
    }


def test_a_window_whose_lp_is_below_the_alone_limit_is_bounded_by_the_limit() -> None:
    # Both are lower bounds and the larger one is the bound (an LP that charged one-peer step times undercut
    # the alone limit where real placements span peers; saved files from it still render right).
    rows = [
        _window(0, lp_s=900.0, limit_s=1000.0, policies={"frenzy": 1500.0, "sia": 2000.0}),
        _window(1, lp_s=1200.0, limit_s=1100.0, policies={"frenzy": 1800.0, "sia": 2400.0}),
    ]
    (cell,) = jct_bound.summarise(rows)
    assert cell["bound_avg_jct_s"] == pytest.approx((1000.0 + 1200.0) / 2)
    assert cell["lp_avg_jct_s"] == pytest.approx((900.0 + 1200.0) / 2)
    assert cell["x_bound"]["frenzy"] == pytest.approx(1650.0 / 1100.0)
    assert cell["most_any_gain"] == pytest.approx(1 - 1100.0 / 2200.0)
    assert cell["below_bound"] == []
    rows[0]["policies"]["frenzy"] = 950.0  # above the LP, below the alone limit: a modelling mismatch
    (cell,) = jct_bound.summarise(rows)
    assert cell["below_bound"] == ["frenzy seed 0"]


def test_render_refuses_a_file_it_did_not_write(tmp_path: Path) -> None:
    other = tmp_path / "report.json"
    other.write_text(json.dumps({"jct_cells": []}))
    with pytest.raises(SystemExit, match="not a jct_bound --json"):
        jct_bound.main(["--render", str(other)])
    with pytest.raises(SystemExit, match="not a jct_bound --json"):
        jct_bound.main(["--render", str(tmp_path / "missing.json")])
    other.write_text(json.dumps({"windows": [{"cell": "lab-20:1:gpus"}]}))  # a window without its figures
    with pytest.raises(SystemExit, match="not a jct_bound --json"):
        jct_bound.main(["--render", str(other)])
