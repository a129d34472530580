"""Per-job cgroup v2: one cgroup per attempt of a job on this node, ended at once by ``cgroup.kill``.

The cgroup v2 mount is found through ``/proc/mounts`` (``/sys/fs/cgroup`` on a unified system,
``/sys/fs/cgroup/unified`` on a hybrid one).  The daemon keeps its jobs in a subtree of its own,
``frenzy.<digest of its data directory>``, created under the daemon's own cgroup (what systemd's
``Delegate=yes`` hands the service) or, when that is not writable, under the mount's root (a root
daemon outside systemd).  A rank is moved into its job's cgroup by the daemon before it runs any of
the job's code (see :mod:`frenzyd.node.launcher`), so everything it forks stays inside, whatever
process group or session it moves to: ``cgroup.kill`` (Linux 5.14) kills them all.  Slot accounts
cannot write ``cgroup.procs`` of any cgroup, so they cannot leave it.

Where there is no usable cgroup v2 (none mounted, not writable, a kernel without ``cgroup.kill``)
:func:`open_tree` returns None and the launcher kills every process of the job's slot account
instead (:func:`frenzyd.node.slots.kill_uid`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC_MOUNTS = Path("/proc/mounts")


def find_mount(mounts: Path = PROC_MOUNTS) -> Path | None:
    """The mount point of the cgroup v2 hierarchy (the first ``cgroup2`` line), or None."""
    try:
        text = mounts.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            # /proc/mounts escapes spaces and tabs in paths as octal (\040)
            return Path(fields[1].encode().decode("unicode_escape"))
    return None


def own_cgroup(pid: int | str = "self") -> str | None:
    """This process's cgroup v2 path relative to the mount (``0::/PATH`` in /proc/PID/cgroup)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK) and os.access(path / "cgroup.procs", os.W_OK)


@dataclass(frozen=True)
class CgroupTree:
    """This daemon's subtree of the cgroup v2 hierarchy: one child cgroup per attempt here."""

    root: Path
    """``.../frenzy.<digest>``: made with an attempt's first cgroup, removed with its last one."""

    def path(self, run: str) -> Path:
        return self.root / run

    def create(self, run: str, leaf: str | None = None) -> Path:
        """The attempt's cgroup (a leftover of that name is killed first, unless ``leaf`` is given),
        or its child ``leaf`` (a rank's), made with whatever above it is missing."""
        path = self.path(run)
        if leaf is None and path.exists():
            self.kill(run)
        target = path if leaf is None else path / leaf
        for _ in range(3):  # a rank's exit may remove an empty attempt cgroup or subtree under us
            try:
                for d in (self.root, path, target):
                    d.mkdir(exist_ok=True)
            except FileNotFoundError:
                continue
            return target
        raise FileNotFoundError(f"{target}: its parent keeps disappearing")

    def prune(self, run: str) -> None:
        """Remove the attempt's cgroup and the subtree when they are empty (the last rank exited)."""
        for d in (self.path(run), self.root):
            try:
                d.rmdir()
            except OSError:  # not empty (another rank, another attempt) or already gone
                return

    def add(self, run: str, pid: int) -> None:
        """Move ``pid`` (with its threads) into the attempt's cgroup; OSError when it cannot."""
        (self.path(run) / "cgroup.procs").write_text(f"{pid}\n")

    def pids(self, run: str) -> set[int]:
        """The processes in the attempt's cgroup and its ranks' cgroups now (none when it does not exist)."""
        return cgroup_pids(self.path(run))

    def all_pids(self) -> set[int]:
        """Every process in this daemon's job cgroups."""
        return cgroup_pids(self.root)

    def kill(self, run: str, wait_s: float = 5.0) -> bool:
        """SIGKILL everything in the attempt's cgroup and its ranks' cgroups, wait until they are
        empty, and remove them.  True when they are gone (or never existed)."""
        gone = kill_cgroup(self.path(run), wait_s)
        with contextlib.suppress(OSError):  # the subtree goes with its last attempt (busy: not the last)
            self.root.rmdir()
        return gone

    def leftovers(self) -> list[str]:
        """The attempts a previous run of this daemon left cgroups for."""
        with contextlib.suppress(OSError):
            return sorted(c.name for c in self.root.iterdir() if c.is_dir())
        return []

    def close(self) -> None:
        """Kill what is left and remove the subtree (daemon shutdown)."""
        for run in self.leftovers():
            self.kill(run)
        with contextlib.suppress(OSError):
            self.root.rmdir()


def cgroup_pids(path: Path) -> set[int]:
    """Every process in the cgroup ``path`` and below."""
    out: set[int] = set()
    for root, _, _ in os.walk(path):
        with contextlib.suppress(OSError, ValueError):
            out |= {int(p) for p in (Path(root) / "cgroup.procs").read_text().split()}
    return out


def kill_cgroup(path: Path, wait_s: float = 5.0) -> bool:
    """SIGKILL every process in the cgroup ``path`` and below (``cgroup.kill`` is recursive), then
    remove it, its children first, once they are empty.  True when it is gone (or never existed)."""
    if not path.is_dir():
        return True
    try:
        (path / "cgroup.kill").write_text("1\n")
    except FileNotFoundError:
        return not path.exists()
    except OSError as exc:
        log.warning("cgroup %s: cgroup.kill failed: %s", path, exc)
        return False
    deadline = time.monotonic() + wait_s
    dirs = sorted((Path(root) for root, _, _ in os.walk(path)), key=lambda p: len(p.parts), reverse=True)
    for d in dirs:
        while True:
            try:
                d.rmdir()  # EBUSY while a process (a zombie being reaped too) is still inside
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    log.warning("cgroup %s not removed: %s", d, exc)
                    return False
            time.sleep(0.02)
    return True


def tree_name(data_dir: Path) -> str:
    """The daemon's subtree name: one per data directory, so several daemons on a host never meet."""
    digest = hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return f"frenzy.{digest}"


def open_tree(data_dir: Path, *, mounts: Path = PROC_MOUNTS) -> tuple[CgroupTree | None, str]:
    """This daemon's cgroup subtree, created if needed, and a line saying where it is (or why
    there is none: then the launcher falls back to killing the slot account's processes)."""
    mount = find_mount(mounts)
    if mount is None:
        return None, "no cgroup v2 mounted (/proc/mounts has no cgroup2 line)"
    own = own_cgroup()
    bases = []
    if own is not None:
        bases.append(mount / own.lstrip("/"))
    if mount not in bases:
        bases.append(mount)
    name = tree_name(data_dir)
    tried = []
    for base in bases:
        if not _writable_dir(base):
            tried.append(f"{base} is not writable")
            continue
        root = base / name
        try:
            root.mkdir(exist_ok=True)
        except OSError as exc:
            tried.append(f"{root}: {exc.strerror}")
            continue
        can_kill = (root / "cgroup.kill").exists()
        with contextlib.suppress(OSError):  # made again with the first attempt (leftovers keep it)
            root.rmdir()
        if not can_kill:
            return None, f"cgroup v2 at {mount} has no cgroup.kill (Linux >= 5.14 needed)"
        return CgroupTree(root), f"cgroup v2: {root}"
    return None, f"cgroup v2 at {mount} but no writable place for jobs ({'; '.join(tried)}); under " \
                 "systemd give the unit Delegate=yes"
