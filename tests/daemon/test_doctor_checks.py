"""The checks behind ``frenzy-client doctor`` without a network (tests/test_doctor_netns.py runs the
whole command in namespaces): certificate dates, clock offsets, GPUs, the address book's sources."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from frenzy_client import doctor
from frenzyd.net import auth
from frenzyd.net.peer_table import AddressBook


@pytest.fixture(scope="module")
def creds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pool")
    auth.create_pool(base / "pool")
    return auth.add_node(base / "pool", "ws-01").out_dir


def _statuses(found: list[doctor.Finding]) -> list[tuple[str, str]]:
    return [(f.area, f.status) for f in found]


def test_certificate_dates(creds: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    _, not_after = auth.certificate_dates((creds / "node.pem").read_bytes())
    assert _statuses(doctor.check_certificate(creds, "ws-01", now)) == [("certificate", "ok")]
    soon = doctor.check_certificate(creds, "ws-01", not_after - dt.timedelta(days=3))
    assert _statuses(soon) == [("certificate", "warn")]
    assert "expires in 2 day(s)" in soon[0].detail or "expires in 3 day(s)" in soon[0].detail
    late = doctor.check_certificate(creds, "ws-01", not_after + dt.timedelta(seconds=1))
    assert _statuses(late) == [("certificate", "fail")]
    assert "expired on" in late[0].detail
    assert "frenzyd enroll" in late[0].fix
    renamed = doctor.check_certificate(creds, "ws-02", now)
    assert _statuses(renamed) == [("certificate", "ok"), ("certificate", "warn")]
    assert doctor.check_certificate(creds.parent / "nowhere", "ws-01", now)[0].status == "fail"


def _status(offsets: dict[str, Any]) -> dict[str, Any]:
    peers = [{"id": "me", "name": "me", "alive": True, "clock_offset_s": 0.0}]
    peers += [{"id": n, "name": n, "alive": True, "clock_offset_s": off} for n, off in offsets.items()]
    return {"node": {"id": "me"}, "peers": peers}


def test_clock_offsets() -> None:
    found = doctor.check_clocks(_status({"a": 0.004, "b": -2.5, "c": 95.0, "d": None}))
    assert _statuses(found) == [("clock", "ok"), ("clock", "warn"), ("clock", "fail"), ("clock", "skip")]
    assert "-2.5 s" in found[1].detail
    assert "timedatectl set-ntp true" in found[2].fix


def test_gpus_from_declared_devices_say_why() -> None:
    backend = {"kind": "declared", "note": "NVML unavailable: no driver"}
    gpus = [{"index": 0, "type": "T4", "offered": True},
            {"index": 1, "type": "T4", "offered": False, "reason": "owner"}]
    status = {"node": {"id": "me", "gpu_backend": backend}, "peers": [{"id": "me", "gpus": gpus}]}
    found = doctor.check_gpus(status)
    assert _statuses(found) == [("gpus", "warn"), ("gpus", "warn")]
    assert "no driver" in found[0].detail
    assert "GPU 1" in found[1].detail
    nvml = {"node": {"id": "me", "gpu_backend": {"kind": "nvml", "note": "NVML: 2 GPU(s)"}}, "peers": []}
    assert _statuses(doctor.check_gpus(nvml)) == [("gpus", "ok")]


def test_address_book_remembers_every_way_an_address_was_learned() -> None:
    book = AddressBook(base_s=1.0, max_s=8.0)
    assert book.add("10.0.0.2:7470", "static", pinned=True)
    assert not book.add("10.0.0.2:7470", "mdns")
    book.succeeded("10.0.0.2:7470", "n2")
    assert book.sources("n2") == ["mdns", "static"]
    assert book.sources("n3") == []
