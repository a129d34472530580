"""The namespace lab's host-wide neighbour limits: raised to fit a lab, put back after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import netns


@pytest.fixture
def sysctls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sys"
    for family in ("ipv4", "ipv6"):
        d = root / family / "neigh" / "default"
        d.mkdir(parents=True)
        (d / "gc_thresh2").write_text("512\n")
        (d / "gc_thresh3").write_text("1024\n")
    monkeypatch.setattr(netns, "NEIGH_SYSCTL", str(root / "{family}" / "neigh" / "default" / "gc_thresh{k}"))
    return root


def _read(root: Path, family: str, k: int) -> int:
    return int((root / family / "neigh" / "default" / f"gc_thresh{k}").read_text())


def test_forty_hosts_get_room_and_the_old_limits_come_back(sysctls: Path) -> None:
    changed = netns._raise_neighbour_limits(40 * 39)
    for family in ("ipv4", "ipv6"):
        assert _read(sysctls, family, 2) >= 40 * 39
        assert _read(sysctls, family, 3) >= 2 * 40 * 39
    assert len(changed) == 4
    netns._restore_neighbour_limits(changed)
    assert [_read(sysctls, f, k) for f in ("ipv4", "ipv6") for k in (2, 3)] == [512, 1024, 512, 1024]


def test_limits_already_high_enough_are_left_alone(sysctls: Path) -> None:
    for family in ("ipv4", "ipv6"):
        (sysctls / family / "neigh" / "default" / "gc_thresh2").write_text("4096\n")
        (sysctls / family / "neigh" / "default" / "gc_thresh3").write_text("8192\n")
    assert netns._raise_neighbour_limits(40 * 39) == {}
    assert _read(sysctls, "ipv4", 3) == 8192


def test_a_limit_another_lab_raised_since_is_not_lowered(sysctls: Path) -> None:
    changed = netns._raise_neighbour_limits(1000)
    path = sysctls / "ipv4" / "neigh" / "default" / "gc_thresh3"
    path.write_text("99999\n")
    netns._restore_neighbour_limits(changed)
    assert _read(sysctls, "ipv4", 3) == 99999
    assert _read(sysctls, "ipv6", 3) == 1024


def test_a_kernel_without_the_knob_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns, "NEIGH_SYSCTL", str(tmp_path / "none" / "{family}" / "gc_thresh{k}"))
    assert netns._raise_neighbour_limits(10_000) == {}
