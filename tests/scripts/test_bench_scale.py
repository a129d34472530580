"""scripts/bench_scale.py: its --tiny run, the world it simulates, and its --no-cache baseline."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_scale as bs  # noqa: E402
from benchmeta import PROVENANCE_KEYS  # noqa: E402

from frenzyd.jobs.placement import offers_from_reports, schedule  # noqa: E402
from frenzyd.marp import plan_cache  # noqa: E402


def test_tiny_run_writes_every_cell_with_provenance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = plan_cache.default_cache()
    out = tmp_path / "scale.json"
    assert bs.main(["--tiny", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc)[: len(PROVENANCE_KEYS)] == list(PROVENANCE_KEYS)
    cells = doc["cells"]
    assert [(c["members"], c["queued"]) for c in cells] == [(20, 10), (20, 40)]
    for c in cells:
        assert c["gpus"] == 4 * c["members"]
        assert len(c["pass_s"]) == c["passes"] == 5
        assert c["cold_s"] == c["pass_s"][0]
        assert 0 < c["median_s"] <= c["p95_s"] <= c["max_s"]
        assert c["started"] > 0  # the pass really places jobs
        assert c["queue_changed_per_pass"] >= 0.05
        pc = c["plan_cache"]
        assert pc["hits"] > 0
        assert pc["counts_computed"] > 0
    assert doc["target"]["met"] is None  # no 1,000-member cell in the tiny run
    assert "namespaces" in doc["not_measured"]
    (row,) = doc["membership"]["rows"]  # 20 SWIM members over the in-memory transport, 1 % loss
    assert row["members"] == 20
    assert row["loss"] == 0.01
    assert row["msgs_per_member_s"] > 0
    assert row["dead_known_by"] == row["of"] == 19  # every other member learnt of the crash
    assert row["dead_known_by_all_s"] is not None
    assert doc["membership"]["target"]["met"] is None  # no 1,000-member row in the tiny run
    assert "p95 ms" in capsys.readouterr().out
    assert plan_cache.default_cache() is before  # the run puts the process's cache back


def test_no_cache_runs_the_uncached_enumeration() -> None:
    cell = bs.run_cell(8, 5, gpus=4, passes=2, churn=0.05, busy=0.5, shapes=4, novel=0.0, seed=1, cache=False,
                       profile=False)
    assert cell["plan_cache"] is None
    assert cell["cache"] is False
    assert len(cell["pass_s"]) == 2


def test_the_world_reports_as_members_do_and_moves_on() -> None:
    w = bs.World.make(30, 20, gpus=4, busy=0.5, shapes=6, novel=0.1, seed=5)  # its catalogue has trainer jobs
    offers = offers_from_reports(w.peers())
    assert len(offers) == 30
    assert sum(len(o.gpus) for o in offers) == 120
    busy = sum(1 for o in offers for g in o.gpus if not g.available)
    assert 0.4 * 120 <= busy <= 0.7 * 120  # half leased at the start, a few withheld by their owners
    # The fill placed real jobs: the trainer jobs among them are HAS's to move, as the coordinator's.
    movable = w.movable()
    assert movable
    gpus = {(o.node_id, g.index): g for o in offers for g in o.gpus}
    for info in movable:
        assert info.spec.trainer
        assert all(gpus[key].uuid in w.running[info.job_id].uuids for key in info.gpus)
        assert not any(gpus[key].available for key in info.gpus)
    sched = schedule(w.queue, offers, now_s=w.now, running=movable, **w.policy)
    assert sched.start
    ids = {q.job_id for q in w.queue}
    placed = [(j, pl) for j, pl in (*sched.start, *sched.pending) if j in ids]
    preempted = {j for j, _ in sched.preempt}
    left = w.advance(sched, churn=0.05)
    assert left == max(1, len(placed))  # placed jobs leave; at least 5 % of 20 is replaced
    assert len(w.queue) >= 20  # preempted jobs come back on top
    assert not {j for j, _ in placed} & {q.job_id for q in w.queue}
    assert len(ids - {q.job_id for q in w.queue}) == left
    for job, pl in placed:
        assert all(w.by_uuid[r.gpu]["leased_to"] in (job, None) for r in pl.ranks)  # None: it finished
    for job in preempted - {j for j, _ in sched.pending}:
        assert job not in w.running


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        bs.main(["--tiny", "--passes", "0"])
    with pytest.raises(SystemExit):
        bs.main(["--tiny", "--busy", "1.0"])
