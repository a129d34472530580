"""The peer layer's typed heartbeat and its report: shape checked once, keys in wire order, absent
keys kept absent, unknown keys passed through."""

from __future__ import annotations

from typing import Any

import pytest

from frenzyd.net import wire
from frenzyd.net.messages import Heartbeat, HeartbeatReport

GPU = {"uuid": "GPU-0", "type": "A10", "free_bytes": 1 << 30}
LEASE = {"job_id": "j", "gpus": ["GPU-0"], "term": 3}
JOB = {"id": "j", "state": "running"}


def test_a_daemons_report_round_trips_in_wire_order() -> None:
    data = {"python": "3.11.7", "torch": "2.13.0", "gpus": [GPU], "leases": [LEASE], "jobs": [JOB]}
    report = HeartbeatReport.from_dict(data)
    assert report.python == "3.11.7"
    assert report.gpus == (GPU,)
    out = report.to_dict()
    assert out == data
    assert list(out) == list(data)


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"python": "3.11.7"},
        {"python": "3.11.7", "gpus": []},  # present but empty stays present
        {"python": "3.11.7", "jobs": [JOB], "load": 0.5, "zone": "lab-2"},  # unknown keys kept, in order
    ],
)
def test_absent_keys_stay_absent_and_unknown_keys_pass_through(data: dict[str, Any]) -> None:
    out = HeartbeatReport.from_dict(data).to_dict()
    assert out == data
    assert list(out) == list(data)


def test_unknown_keys_go_after_the_known_ones() -> None:
    report = HeartbeatReport.from_dict({"zone": "lab-2", "python": "3.11.7"})
    assert report.extra == {"zone": "lab-2"}
    assert list(report.to_dict()) == ["python", "zone"]


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"python": 311}, "python"),
        ({"torch": b"2.13.0"}, "torch"),
        ({"gpus": "GPU-0"}, "gpus"),
        ({"leases": {"job_id": "j"}}, "leases"),
        ({"jobs": [JOB, "j2"]}, "jobs"),
    ],
)
def test_a_report_of_the_wrong_shape_is_a_schema_rejection(data: dict[str, Any], key: str) -> None:
    with pytest.raises(wire.FrameRejected) as info:
        HeartbeatReport.from_dict(data)
    assert info.value.reason == "schema"
    assert f"heartbeat.report.{key}" in info.value.detail


def test_heartbeat_is_the_typed_form_of_its_kind() -> None:
    hb = Heartbeat("n" * 64, "ws-01", "10.0.0.1:7470", 2, 3, "c" * 64, HeartbeatReport(python="3.11.7"))
    msg = wire.decode(wire.encode_message(hb))
    assert msg.kind == "heartbeat"
    assert wire.parse(msg) == hb
    # The schema's minimum (no coordinator, no report) is a heartbeat too.
    bare = {"node_id": "p", "name": "p", "address": "h:1", "priority": 0, "term": 0}
    parsed = wire.parse(wire.decode(wire.encode("heartbeat", bare)))
    assert parsed == Heartbeat("p", "p", "h:1", 0, 0)
    assert isinstance(parsed, Heartbeat)
    assert parsed.report.to_dict() == {}


def test_a_heartbeat_with_a_bad_report_is_rejected_when_parsed() -> None:
    body = {"node_id": "p", "name": "p", "address": "h:1", "priority": 0, "term": 0, "report": {"gpus": 1}}
    with pytest.raises(wire.FrameRejected) as info:
        wire.parse(wire.decode(wire.encode("heartbeat", body)))
    assert info.value.reason == "schema"
