"""Per-attempt lease supervisor: kills a job's ranks when its daemon stops renewing the lease.

Run by :class:`frenzyd.node.launcher.Launcher` as ``python -m frenzyd.node.supervisor --grace S``,
one per attempt of a job on this node, in its own session, outside the daemon's event loop.  It
reads commands on stdin, one per line:

* ``watch PGID`` -- a rank's process group to kill when the lease runs out;
* ``cgroup PATH`` -- the attempt's cgroup: everything in it is killed too (``cgroup.kill``), so a
  rank that left its process group with ``setsid`` dies as well;
* ``uid UID`` -- without a cgroup, the attempt's slot account: every process of it is killed too;
* ``renew SECONDS`` -- the lease now ends SECONDS from now (monotonic clock);
* ``stop`` -- the attempt is over: exit without killing anything.

When the deadline comes near without a renewal (the daemon is frozen, partitioned from the job's
submitter, or too slow to renew), it sends SIGTERM to every watched group ``grace`` seconds before
the deadline and SIGKILL at the deadline, prints ``EXPIRED`` and exits: at the deadline the ranks
are gone, which is what the coordinator's wait before re-placing the job counts on.  When every
watched rank had already exited (ranks that finished while their daemon was frozen are zombies
until it reaps them) it prints ``ENDED`` and exits 0: their exit codes stand.  If stdin
closes without ``stop`` (the daemon died), it kills the groups at once: the ranks must not outlive
the daemon that answers for them (DESIGN.md §8).  Exit status: ``EXPIRED`` (3) when it killed the
ranks for the lease, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import time

EXPIRED = 3
"""Exit status when the lease ran out and the ranks were killed for it."""


class Targets:
    """What an expired lease kills: process groups, cgroups, slot uids."""

    def __init__(self) -> None:
        self.pgids: set[int] = set()
        self.cgroups: set[str] = set()
        self.uids: set[int] = set()

    def pids(self) -> set[int]:
        """The processes in the cgroups and of the uids (beyond the process groups)."""
        out: set[int] = set()
        for cg in self.cgroups:
            for root, _, _ in os.walk(cg):
                with contextlib.suppress(OSError, ValueError), open(os.path.join(root, "cgroup.procs")) as f:
                    out |= {int(p) for p in f.read().split()}
        if self.uids:
            for name in os.listdir("/proc"):
                if not name.isdigit():
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if {int(x) for x in line.split()[1:3]} & self.uids:
                                out.add(int(name))
                            break
        out.discard(os.getpid())
        return out

    def signal(self, sig: int) -> None:
        _kill(self.pgids, sig)
        if sig == signal.SIGKILL:
            for cg in self.cgroups:
                with contextlib.suppress(OSError), open(os.path.join(cg, "cgroup.kill"), "w") as f:
                    f.write("1\n")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def alive(self) -> bool:
        return _alive(self.pgids) or bool(self.pids())


def _kill(pgids: set[int], sig: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _alive(pgids: set[int]) -> bool:
    for pgid in pgids:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            continue
        return True
    return False


def _running(pgids: set[int]) -> bool:
    """Whether a watched rank (a group leader) has not exited yet.  A rank that exited while its
    daemon was frozen stays a zombie until the daemon reaps it: it finished on its own."""
    for pgid in pgids:
        try:
            with open(f"/proc/{pgid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            return True
    return False


def _expire(targets: Targets, kill_at: float) -> None:
    targets.signal(signal.SIGTERM)
    while time.monotonic() < kill_at and targets.alive():
        time.sleep(0.05)
    targets.signal(signal.SIGKILL)
    for _ in range(50):  # a uid's processes forking while they are killed: until none is left
        if not targets.pids():
            break
        targets.signal(signal.SIGKILL)
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frenzyd.node.supervisor")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="SIGTERM this many seconds before the deadline, SIGKILL at it")
    parser.add_argument("--lease", type=float, default=30.0, help="initial lease length in seconds")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the lease (or the daemon's "stop") ends us
    targets = Targets()
    pgids = targets.pgids
    deadline = time.monotonic() + args.lease
    fd = sys.stdin.fileno()
    buf = b""
    while True:
        left = deadline - args.grace - time.monotonic()
        if left <= 0:
            killed = _running(pgids)  # ranks that all ended on their own were not cut short
            _expire(targets, deadline)
            print("EXPIRED" if killed else "ENDED", flush=True)
            return EXPIRED if killed else 0
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:  # the daemon is gone
            _expire(targets, time.monotonic())
            return 0
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd, _, arg = line.decode(errors="replace").strip().partition(" ")
            try:
                if cmd == "watch":
                    pgids.add(int(arg))
                elif cmd == "cgroup" and arg:
                    targets.cgroups.add(arg)
                elif cmd == "uid":
                    if int(arg) not in (0, os.getuid(), os.geteuid()):
                        targets.uids.add(int(arg))
                elif cmd == "renew":
                    deadline = time.monotonic() + max(0.0, float(arg))
                elif cmd == "stop":
                    return 0
            except ValueError:
                continue


if __name__ == "__main__":
    sys.exit(main())
