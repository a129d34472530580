"""The per-attempt lease supervisor (frenzyd.node.supervisor), as a real process guarding real
process groups: it kills them when the lease runs out or its daemon vanishes, and never otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest


def _group() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)


SUPERVISORS: list[subprocess.Popen[bytes]] = []


def _supervisor(lease: float) -> subprocess.Popen[bytes]:
    sup = subprocess.Popen([sys.executable, "-m", "frenzyd.node.supervisor", "--lease", str(lease),
                            "--grace", "0.3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    SUPERVISORS.append(sup)
    return sup


def _say(sup: subprocess.Popen[bytes], line: str) -> None:
    assert sup.stdin is not None
    sup.stdin.write(f"{line}\n".encode())
    sup.stdin.flush()


def _dead_within(p: subprocess.Popen[bytes], limit: float) -> bool:
    try:
        p.wait(limit)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[bytes]]:
    p = _group()
    yield p
    if p.poll() is None:
        os.killpg(p.pid, 9)
        p.wait()


@pytest.fixture(autouse=True)
def _reap_supervisors() -> Iterator[None]:
    """Every test's supervisors end with it and their pipes are closed (a test without ``rank`` too)."""
    yield
    while SUPERVISORS:
        sup = SUPERVISORS.pop()
        if sup.poll() is None:
            sup.kill()
        sup.wait()
        for f in (sup.stdin, sup.stdout):
            if f is not None:
                f.close()


def test_an_unrenewed_lease_kills_the_ranks(rank: subprocess.Popen[bytes]) -> None:
    sup = _supervisor(lease=1.0)
    _say(sup, f"watch {rank.pid}")
    assert _dead_within(rank, 30)
    assert rank.returncode == -15  # SIGTERM first, a grace before the deadline
    assert sup.stdout is not None
    assert sup.stdout.readline().strip() == b"EXPIRED"
    assert _dead_within(sup, 10)
    assert sup.returncode == 3


def test_renewals_keep_the_ranks_and_stop_leaves_them(rank: subprocess.Popen[bytes]) -> None:
    sup = _supervisor(lease=1.0)
    _say(sup, f"watch {rank.pid}")
    end = time.monotonic() + 3.0
    while time.monotonic() < end:  # three lease lengths, renewed
        _say(sup, "renew 1.0")
        time.sleep(0.2)
    assert rank.poll() is None
    _say(sup, "stop")
    assert _dead_within(sup, 10)
    assert not _dead_within(rank, 1.5)  # the lease is no longer enforced: stop means "over"


def test_the_ranks_die_with_the_daemon(rank: subprocess.Popen[bytes]) -> None:
    sup = _supervisor(lease=600.0)
    _say(sup, f"watch {rank.pid}")
    _say(sup, "garbage line")  # ignored
    assert sup.stdin is not None
    sup.stdin.close()  # the daemon is gone
    assert _dead_within(rank, 10)
    assert _dead_within(sup, 10)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_ranks_that_ended_before_the_deadline_were_not_cut_short() -> None:
    """Found by scripts/bench_chaos.py: the rank exits 0 while its daemon is frozen (a zombie until
    the daemon reaps it); the lease then runs out.  The supervisor must not say EXPIRED, or the
    daemon, once thawed, reports a finished attempt as vacated and the job runs again."""
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    end = time.monotonic() + 30
    while _state(done.pid) != "Z":  # exited, not reaped: what a frozen daemon leaves
        assert time.monotonic() < end
        time.sleep(0.05)
    sup = _supervisor(lease=1.0)
    _say(sup, f"watch {done.pid}")
    assert _dead_within(sup, 30)
    assert sup.returncode == 0
    assert sup.stdout is not None
    assert sup.stdout.readline().strip() == b"ENDED"
    assert done.wait() == 0
