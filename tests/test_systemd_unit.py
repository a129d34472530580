"""The shipped systemd unit verifies and stays within its exposure target (issue 17: <= 4.0, "OK")."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "frenzyd.service"
EXPOSURE_TARGET = 4.0

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")


def test_unit_exposure_is_within_target() -> None:
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(UNIT)],
                         capture_output=True, text=True, check=False).stdout
    m = re.search(r"Overall exposure level for frenzyd\.service: ([0-9.]+)", out)
    assert m, out[-2000:]
    assert float(m.group(1)) <= EXPOSURE_TARGET, out[-4000:]


def test_unit_verifies(tmp_path: Path) -> None:
    """``systemd-analyze verify`` finds nothing wrong (ExecStart pointed at this checkout's frenzyd,
    since /usr/local/bin/frenzyd exists only where the unit is installed)."""
    frenzyd = Path(sys.executable).with_name("frenzyd")
    unit = tmp_path / "frenzyd.service"
    unit.write_text(UNIT.read_text().replace("/usr/local/bin/frenzyd", str(frenzyd)))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (res.stdout + res.stderr).strip(), res.stdout + res.stderr  # e.g. "Unknown key ..."


def test_the_unit_waits_for_the_daemons_whole_shutdown() -> None:
    """systemd must not SIGKILL frenzyd while its ranks still use their grace: TimeoutStopSec covers
    the default shutdown deadline (ranks' grace first) plus the servers' close steps (5 s each)."""
    from frenzyd.config import TimingSection

    text = UNIT.read_text()
    stop = next(int(line.split("=", 1)[1]) for line in text.splitlines()
                if line.startswith("TimeoutStopSec="))
    assert stop > TimingSection().shutdown_deadline_s + 5 * 5


def test_the_unit_lets_frenzyd_run_ranks_as_slot_accounts_in_its_own_cgroups() -> None:
    """What slot accounts need (frenzyd.node.slots, frenzyd.node.cgroup): switching to a slot, signalling
    it, reading and taking back its directory, a delegated cgroup subtree, the execute directory."""
    from frenzyd.config import LauncherSection

    keys: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            keys.setdefault(k, []).append(v)
    need = {"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_READ_SEARCH", "CAP_CHOWN"}
    assert set(keys["AmbientCapabilities"][0].split()) == need
    assert set(keys["CapabilityBoundingSet"][0].split()) == need
    assert keys["Delegate"] == ["yes"]
    assert keys["ProtectControlGroups"] == ["false"]
    assert "/var/lib/frenzy-execute" in keys["ReadWritePaths"][0].split()
    assert LauncherSection().slots  # on by default: the unit is what makes them possible
