"""Who ranks run as: unprivileged slot accounts, one per attempt running on this node (HTCondor's model).

A slot account (``frenzy-slot1``, ``frenzy-slot2``, ..., made by ``scripts/install --slots N``) has
its own group, no home and no login; ranks get that group plus the GPU device groups (``video``,
``render``, where they exist).  A slot serves one attempt at a time, so two jobs running at once,
of one user or of two, never share a uid; it is given out again only once every process of it is
gone.  Each attempt gets a fresh directory under ``[launcher] execute_dir`` (mode 0711, the
daemon's; the slots can pass through but not list it), ``RUN/`` mode 0700 owned by the slot,
holding ``work`` (the job's files), ``output``, ``checkpoints`` and ``tmp``; it is removed once the
attempt's results and checkpoint are in the outbox.  The daemon reads what it needs there as root
or with ``CAP_DAC_READ_SEARCH`` and takes the tree back (``CAP_CHOWN``) to remove it.

A daemon that cannot switch users (not root and no ``CAP_SETUID``/``CAP_SETGID``/``CAP_KILL``) runs
ranks as its own user and only its own user's jobs; one that could but finds no slot account (or
has ``[launcher] slots = false``) runs every job as its own user, with a warning.
:class:`Isolation` says which, with the reason, for the status JSON.

Also here: the start-up check that the daemon's secrets are out of other users' reach.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from frenzyd.errors import ConfigError, LaunchError

log = logging.getLogger(__name__)

SLOT_PREFIX: Final = "frenzy-slot"
GPU_GROUPS: Final = ("video", "render")
"""Groups that own GPU device nodes on common distributions; slots get those that exist."""

_CAP_SETGID, _CAP_SETUID, _CAP_CHOWN, _CAP_DAC_READ_SEARCH, _CAP_KILL = 6, 7, 0, 2, 5


@dataclass(frozen=True)
class SlotAccount:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    """Supplementary groups the ranks get: the slot's own group and the GPU groups that exist."""


def gpu_group_ids(names: Iterable[str] = GPU_GROUPS) -> tuple[int, ...]:
    out = []
    for n in names:
        with contextlib.suppress(KeyError):
            out.append(grp.getgrnam(n).gr_gid)
    return tuple(out)


def find_slots(prefix: str = SLOT_PREFIX) -> list[SlotAccount]:
    """The slot accounts of the user database (``PREFIXN``, N = 1, 2, ...), in order of N."""
    pat = re.compile(re.escape(prefix) + r"([1-9][0-9]*)")
    gpu = gpu_group_ids()
    found = []
    for pw in pwd.getpwall():
        m = pat.fullmatch(pw.pw_name)
        if m is None or pw.pw_uid == 0 or pw.pw_gid == 0:
            continue  # never root's uid or group, whatever the database says
        found.append((int(m.group(1)), SlotAccount(pw.pw_name, pw.pw_uid, pw.pw_gid,
                                                   tuple(dict.fromkeys((pw.pw_gid, *gpu))))))
    return [s for _, s in sorted(found)]


def capabilities(pid: int | str = "self") -> int:
    """The effective capability set of a process (``CapEff`` of /proc/PID/status), 0 when unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def switch_users_refusal(pid: int | str = "self") -> str | None:
    """Why the process ``pid`` (default: this one) cannot start processes as other users (None: it
    can): it is not root and lacks one of CAP_SETUID, CAP_SETGID, CAP_KILL."""
    try:
        euid = os.geteuid() if pid == "self" else int(Path(f"/proc/{pid}/status").read_text()
                                                      .split("Uid:")[1].split()[1])
    except (OSError, IndexError, ValueError):
        return f"cannot read the credentials of process {pid}"
    if euid == 0:
        return None
    caps = capabilities(pid)
    missing = [n for n, bit in (("CAP_SETUID", _CAP_SETUID), ("CAP_SETGID", _CAP_SETGID),
                                ("CAP_KILL", _CAP_KILL)) if not caps >> bit & 1]
    if not missing:
        return None
    return (f"frenzyd runs as {user_name(euid)}, not root, without {', '.join(missing)}: it "
            "cannot switch users")


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass
class Isolation:
    """How this node runs ranks: as slot accounts, or as the daemon's own user (and why)."""

    mode: str
    """``slots``: one slot account per running attempt; ``own-user``: the daemon's user."""
    user: str
    """The daemon's user."""
    reason: str = ""
    """Why not ``slots`` (empty in ``slots`` mode)."""
    slots: tuple[SlotAccount, ...] = ()
    kill: str = ""
    """How a job's processes are ended: the cgroup line of :func:`frenzyd.node.cgroup.open_tree`, or the
    fallback."""
    accept: str = "any"
    only_own: bool = False
    """Run only the daemon's own user's jobs: it cannot switch users (not root, no CAP_SETUID...)."""
    busy: dict[str, SlotAccount] = field(default_factory=dict)
    """Attempt (run key) -> the slot it holds."""

    def report(self) -> dict[str, Any]:
        """The node's part of the status JSON (``launcher`` in its report)."""
        out: dict[str, Any] = {"accept": self.accept, "runs_as": self.mode, "user": self.user,
                               "kill": self.kill}
        if self.mode == "slots":
            out.update(slots=len(self.slots), slots_busy=len(self.busy))
        else:
            out.update(reason=self.reason, only_jobs_of=self.user if self.only_own else None)
        return out

    def admit(self, job_id: str, owner: str | None, trainer: bool) -> None:
        """Refuse, with a reason that says what to do, a job this node must not run."""
        if self.accept == "trainer-only" and not trainer:
            raise LaunchError(f"job {job_id}: this node accepts only built-in trainer jobs ([launcher] "
                              "accept = \"trainer-only\"): it runs no foreign code; submit with "
                              "--model/--data, or run the script on another node")
        if self.only_own and owner is not None and owner != self.user:
            raise LaunchError(f"job {job_id} of user {owner!r}: this node runs only its own user's "
                              f"({self.user}) jobs because {self.reason}; give it slot accounts "
                              "(scripts/install --slots N) and run it as root or with "
                              "CAP_SETUID/CAP_SETGID/CAP_KILL")

    def take(self, run: str, alive: Any) -> SlotAccount | None:
        """A free slot for the attempt ``run`` (None in ``own-user`` mode).  ``alive(slot)`` says
        whether the slot still has processes: such a slot is not given out."""
        if self.mode != "slots":
            return None
        held = self.busy.get(run)
        if held is not None:
            return held
        used = {s.uid for s in self.busy.values()}
        for s in self.slots:
            if s.uid not in used and not alive(s):
                self.busy[run] = s
                return s
        raise LaunchError(f"all {len(self.slots)} slot accounts of this node are busy (or still have "
                          "processes); add slots with scripts/install --slots N")

    def give_back(self, run: str) -> SlotAccount | None:
        return self.busy.pop(run, None)


def isolation(prefix: str = SLOT_PREFIX, *, want_slots: bool = True, accept: str = "any",
              refusal: str | None = "") -> Isolation:
    """Decide how this daemon runs ranks (see the module docstring).  ``refusal``: why it cannot
    switch users (default: :func:`switch_users_refusal` of this process; None: it can)."""
    me = user_name(os.geteuid())
    if refusal == "":
        refusal = switch_users_refusal()
    if refusal is not None:
        return Isolation("own-user", me, refusal, accept=accept, only_own=True)
    if not want_slots:
        iso = Isolation("own-user", me, "[launcher] slots = false", accept=accept)
    else:
        found = find_slots(prefix)
        if found:
            mine = [s.name for s in found if s.uid == os.geteuid()]
            if mine:
                raise ConfigError(f"slot account {mine[0]} is frenzyd's own uid: slots must be accounts of "
                                  "their own")
            return Isolation("slots", me, slots=tuple(found), accept=accept)
        iso = Isolation("own-user", me, f"no slot accounts {prefix}1, {prefix}2, ... exist (scripts/install "
                        "--slots N makes them)", accept=accept)
    # It could switch users but has no slot to switch to: every job runs as the daemon's user.
    log.warning("jobs' ranks run as %s, the daemon's own user (%s): they can read what it reads; make slot "
                "accounts (scripts/install --slots N)", me, iso.reason)
    return iso


# ---- processes of a slot ----------------------------------------------------------------------------


def uid_pids(uid: int) -> set[int]:
    """Every live process whose real or effective uid is ``uid`` (a scan of /proc)."""
    out = set()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            text = (entry / "status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Uid:"):
                ids = line.split()[1:3]
                if str(uid) in ids and not _zombie(text):
                    out.add(int(entry.name))
                break
    return out


def _zombie(status: str) -> bool:
    for line in status.splitlines():
        if line.startswith("State:"):
            return line.split()[1] in ("Z", "X")
    return False


def kill_uid(uid: int, wait_s: float = 5.0) -> int:
    """SIGKILL every process of ``uid`` until none is left (a rank forking while we scan is caught on
    the next round); the number of processes killed.  Never for uid 0 or this daemon's uid."""
    if uid in (0, os.geteuid(), os.getuid()):
        raise ValueError(f"refusing to kill every process of uid {uid}")
    killed: set[int] = set()
    deadline = time.monotonic() + wait_s
    while True:
        pids = uid_pids(uid)
        if not pids or time.monotonic() > deadline:
            if pids:
                log.warning("uid %d still has processes %s after %.0fs", uid, sorted(pids), wait_s)
            return len(killed)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.02)


# ---- the per-attempt directory ---------------------------------------------------------------------


def check_execute_dir(path: Path) -> None:
    """Make ``path`` (0711, the daemon's) and check that a slot account can reach it: every
    directory above it must be searchable by others."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o711)
    for d in [path, *path.parents]:
        mode = d.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise ConfigError(f"[launcher] execute_dir {path}: {d} is mode {stat.S_IMODE(mode):04o}, so "
                              "the slot accounts cannot reach their job directories; choose a directory "
                              "whose parents are searchable (e.g. /var/lib/frenzy-execute) or "
                              f"`chmod o+x {d}`")


def hand_over(run_dir: Path, slot: SlotAccount) -> None:
    """Give the attempt's directory (and everything the daemon put in it) to the slot: mode 0700
    on the top, owned by the slot's uid and group throughout (links are not followed)."""
    for root, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), slot.uid, slot.gid)
    run_dir.chmod(0o700)  # before it is the slot's: a non-root daemon has no CAP_FOWNER
    os.chown(run_dir, slot.uid, slot.gid)


def remove_run_dir(run_dir: Path) -> None:
    """Take the attempt's directory back and remove it.  Only once every process of its slot is
    gone: nothing can then race the walk."""
    if not run_dir.exists():
        return
    uid, gid = os.geteuid(), os.getegid()
    for root, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(root, name), uid, gid)
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700)
    with contextlib.suppress(FileNotFoundError):
        os.chown(run_dir, uid, gid)
        run_dir.chmod(0o700)
    shutil.rmtree(run_dir, ignore_errors=True)
    if run_dir.exists():
        log.warning("job directory %s could not be removed", run_dir)


# ---- secrets ---------------------------------------------------------------------------------------


def check_secrets(paths: Iterable[Path]) -> None:
    """Each existing file must be the daemon's (or root's) and unreadable by group and others: the
    ranks of jobs run as other users on this machine.  ConfigError naming the fix otherwise."""
    me = os.geteuid()
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        except PermissionError as exc:
            raise ConfigError(f"cannot check {p}: {exc.strerror}; run frenzyd as the user that owns "
                              "it") from exc
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (me, 0):
            raise ConfigError(f"{p} belongs to uid {st.st_uid}, not to frenzyd's user {user_name(me)}: "
                              f"`chown {user_name(me)} {p}`")
        if mode & 0o077:
            raise ConfigError(f"{p} is mode {mode:04o}: group and other users can read or change it "
                              f"(and jobs' code runs as other users here): `chmod 600 {p}`")
