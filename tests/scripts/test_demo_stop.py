"""scripts/demo --stop DIR ends a pool left by ``scripts/demo --keep`` (its pids file) and removes DIR;
anything else is refused.  (The --keep run itself takes ~40 s with a real DDP job: run by hand.)"""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = str(ROOT / "scripts/demo")


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DEMO, *args], capture_output=True, text=True, timeout=60, check=False)


def test_stop_ends_the_kept_pool_and_removes_its_directory(tmp_path: Path) -> None:
    pool = tmp_path / "frenzy-demo.x"
    pool.mkdir()
    procs = [subprocess.Popen(["sleep", "300"]) for _ in range(3)]
    # Reap each stand-in as soon as it dies (a zombie would still answer `kill -0`).
    with ThreadPoolExecutor(3) as reaper:
        codes = [reaper.submit(p.wait, 60) for p in procs]
        (pool / "pids").write_text(" ".join(str(p.pid) for p in procs) + "\n")
        res = _demo("--stop", str(pool))
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        assert [c.result() for c in codes] == [-15, -15, -15]  # SIGTERM, as to the daemons
        assert not pool.exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_stop_refuses_a_directory_the_demo_did_not_leave(tmp_path: Path) -> None:
    res = _demo("--stop", str(tmp_path))
    assert res.returncode == 2
    assert "not a pool left by scripts/demo --keep" in res.stderr
    assert tmp_path.exists()
    res = _demo("--bogus")
    assert res.returncode == 2
    assert "usage: scripts/demo [--keep | --stop DIR]" in res.stderr
