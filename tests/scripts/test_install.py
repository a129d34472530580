"""scripts/install and scripts/uninstall round trip in a throwaway root (issue 17): owners and
modes, ``systemd-analyze verify --root``, and after ``uninstall --purge`` the tree is as before."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or not sys.platform.startswith("linux"),
    reason="needs root and shadow-utils (useradd --root)")

SHADOW_UTILS_OWN = {"etc/.pwd.lock", "etc/passwd-", "etc/group-", "etc/shadow-", "etc/gshadow-",
                    "etc/subuid-", "etc/subgid-"}
"""Lock and backup files useradd/userdel leave in any root they edit (not ours to remove)."""


def _snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if rel in SHADOW_UTILS_OWN:
                continue
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                what: object = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                what = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                what = None
            out[rel] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, what)
    return out


def _seed(root: Path) -> Path:
    """A minimal system: root in the account files, systemd's units, a venv stand-in inside the root."""
    etc = root / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (etc / "group").write_text("root:x:0:\n")
    for f in ("shadow", "gshadow"):
        (etc / f).write_text("root:*::\n" if f == "gshadow" else "root:*:19000:0:99999:7:::\n")
        (etc / f).chmod(0o600)
    if Path("/usr/lib/systemd/system").is_dir():
        shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "usr/local/bin").mkdir(parents=True)
    (root / "usr/local/bin").chmod(0o775)  # an admin's choice the install must leave alone
    venv = root / "srv/venv/bin"
    venv.mkdir(parents=True)
    for exe in ("python", "frenzyd", "frenzy-client"):
        (venv / exe).write_text(f'#!/bin/sh\nexec {Path(sys.executable).with_name(exe)} "$@"\n')
        (venv / exe).chmod(0o755)
    return venv.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)


def _ids(root: Path) -> tuple[int, int]:
    for line in (root / "etc/passwd").read_text().splitlines():
        f = line.split(":")
        if f[0] == "frenzy":
            return int(f[2]), int(f[3])
    raise AssertionError("no frenzy user in the root's etc/passwd")


def _mode(p: Path) -> tuple[int, int, int]:
    st = p.stat()
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def test_install_uninstall_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    venv = _seed(root)
    before = _snapshot(root)

    res = _run(str(ROOT / "scripts/install"), "--root", str(root), "--venv-from", str(venv),
               "--node-name", "ws-07")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "frenzyd enroll ws-07.frenzy-node" in res.stdout
    assert "systemctl enable --now frenzyd" in res.stdout

    uid, gid = _ids(root)
    assert _mode(root / "etc/frenzy") == (0o750, 0, gid)
    assert _mode(root / "etc/frenzy/frenzyd.toml") == (0o640, 0, gid)
    assert _mode(root / "var/lib/frenzy") == (0o700, uid, gid)
    unit_file = root / "etc/systemd/system/frenzyd.service"
    for unit in (unit_file, root / "etc/sysusers.d/frenzy.conf", root / "etc/tmpfiles.d/frenzy.conf"):
        assert _mode(unit) == (0o644, 0, 0), unit
    assert unit_file.read_text() == (ROOT / "systemd/frenzyd.service").read_text()
    assert os.readlink(root / "opt/frenzy/venv") == "/srv/venv"  # as the installed system sees it
    assert os.readlink(root / "usr/local/bin/frenzyd") == "/opt/frenzy/venv/bin/frenzyd"
    config = tomllib.loads((root / "etc/frenzy/frenzyd.toml").read_text())
    assert config["node"]["name"] == "ws-07"
    assert config["pool"]["credentials"] == "/etc/frenzy/node"

    if shutil.which("systemd-analyze") and (root / "usr/lib/systemd/system/sysinit.target").exists():
        v = _run("systemd-analyze", "verify", "--root", str(root), "frenzyd.service")
        assert v.returncode == 0, v.stdout + v.stderr
        assert not (v.stdout + v.stderr).strip(), v.stdout + v.stderr

    again = _run(str(ROOT / "scripts/install"), "--root", str(root), "--venv-from", str(venv))
    assert again.returncode == 2
    assert "already installed" in again.stderr

    res = _run(str(ROOT / "scripts/uninstall"), "--root", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (root / "etc/systemd/system/frenzyd.service").exists()
    assert not (root / "opt").exists()
    assert list((root / "usr/local/bin").iterdir()) == []
    assert (root / "etc/frenzy/frenzyd.toml").exists()
    assert (root / "var/lib/frenzy").is_dir()
    assert _ids(root) == (uid, gid)

    res = _run(str(ROOT / "scripts/uninstall"), "--root", str(root), "--purge")
    assert res.returncode == 0, res.stdout + res.stderr
    after = _snapshot(root)
    assert {k: v for k, v in after.items() if before.get(k) != v} == {}
    assert set(before) - set(after) == set()


def test_install_refuses_bad_options(tmp_path: Path) -> None:
    res = _run(str(ROOT / "scripts/install"), "--root", str(tmp_path), "--torch-spec", "torch")
    assert res.returncode == 2
    assert "must pin torch 2.13.0" in res.stderr
    res = _run(str(ROOT / "scripts/install"), "--root", str(tmp_path), "--offline")
    assert res.returncode == 2
    assert "--offline needs --wheelhouse" in res.stderr
    res = _run(str(ROOT / "scripts/install"), "--root", str(tmp_path), "--no-venv")
    assert res.returncode == 2
    assert "no etc/passwd" in res.stderr
    assert list(tmp_path.iterdir()) == []
    res = _run(str(ROOT / "scripts/uninstall"), "--root", str(tmp_path))
    assert res.returncode == 2
    assert "no install record" in res.stderr
