"""The restart cost the coordinator measures and tells HAS shows in the status JSON (``scheduler``)
and on /metrics (``frenzy_restart_cost_seconds``, ``frenzy_restart_cost_measurements``)."""

from __future__ import annotations

from frenzyd.api.metrics import status_metrics
from frenzyd.jobs.placement import DEFAULT_START_S, DEFAULT_STOP_S, RestartCosts
from frenzyd.jobs.status import build_status


def samples(st: dict[str, object]) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("part", "")): s.value for fam in status_metrics(st) for s in fam.samples
            if fam.name.startswith("frenzy_restart_cost")}


def test_the_measured_restart_cost_is_in_the_status_and_the_metrics() -> None:
    costs = RestartCosts()
    st = build_status(node_id="n", node_name="n", term=1, coordinator=("n", "n"), peers=[], jobs=[],
                      scheduler=costs.to_dict())
    assert st["scheduler"] == {"restart_s": DEFAULT_START_S + DEFAULT_STOP_S, "start_s": DEFAULT_START_S,
                               "stop_s": DEFAULT_STOP_S, "starts_measured": 0, "stops_measured": 0}
    assert samples(st) == {("frenzy_restart_cost_seconds", "stop"): DEFAULT_STOP_S,
                           ("frenzy_restart_cost_seconds", "start"): DEFAULT_START_S,
                           ("frenzy_restart_cost_measurements", "stop"): 0.0,
                           ("frenzy_restart_cost_measurements", "start"): 0.0}
    costs.observe_stop(6.0)
    st = build_status(node_id="n", node_name="n", term=1, coordinator=("n", "n"), peers=[], jobs=[],
                      scheduler=costs.to_dict())
    got = samples(st)
    assert got[("frenzy_restart_cost_measurements", "stop")] == 1.0
    assert got[("frenzy_restart_cost_seconds", "stop")] < DEFAULT_STOP_S
    bare = build_status(node_id="n", node_name="n", term=1, coordinator=None, peers=[], jobs=[])
    assert bare["scheduler"] is None
    assert samples(bare) == {}
