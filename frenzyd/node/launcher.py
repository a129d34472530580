"""Launcher: runs a job's rank processes with torchrun's environment contract, and moves its files.

Each rank is its own process in its own process group (so cancel kills the
whole group, TERM then KILL), armed with a parent-death signal (so ranks die with
the daemon) and recorded in a pid file under ``data_dir/launcher`` (so a
restarted daemon reaps leftovers).  The rendezvous store of a job runs in a
child process (:mod:`frenzyd.node.rendezvous_store`) bound to the pool interface.
Payloads (the job's directory, rank 0's output files) are gzip'd tars, size-capped
and hash-checked; unpacking rejects anything but plain files and directories
inside the destination.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from frenzyd.errors import LaunchError
from frenzyd.node import slots as slots_mod
from frenzyd.node import supervisor
from frenzyd.node.cgroup import CgroupTree, kill_cgroup, open_tree
from frenzyd.node.slots import Isolation, SlotAccount

# Re-exported (explicitly, for mypy): callers and tests import these from here.
from frenzyd.payload import pack_dir as pack_dir  # noqa: PLC0414
from frenzyd.payload import private_dir as private_dir  # noqa: PLC0414
from frenzyd.payload import unpack as unpack  # noqa: PLC0414

log = logging.getLogger(__name__)

OutputCallback = Callable[[int, str, bytes], Awaitable[None] | None]
"""``on_output(rank, stream ("stdout" | "stderr"), chunk)``; may be a coroutine function."""

TERM_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL on cancel."""

RANK_LOG_BYTES = 16 * 1024 * 1024
"""Default cap of one rank's log file on its host before it is rotated (``[launcher] rank_log_bytes``)."""
RANK_LOG_KEEP = 2
"""Default number of rotated files kept per rank (``[launcher] rank_log_keep``)."""
RANK_LOG_RETENTION_S = 7 * 24 * 3600.0
"""Default age after which rank logs are removed (``[launcher] rank_log_retention_s``)."""

# Runs in the fresh rank process before the real command, as the daemon's user: wait until the
# daemon has put it in its job's cgroup (argv[2]: the read end of a pipe, -1: no cgroup), take the
# slot account's identity (argv[3]: "UID:GID:GROUP,GROUP", empty: stay), arm the parent-death signal
# (a uid change clears it, execve keeps it), give up if the daemon already died, drop every
# capability when asked (argv[4]; a non-root daemon's ambient capabilities must not reach a job),
# then exec.  Running this part as the daemon also means the slot needs no access to its Python.
_RANK_EXEC = (
    "import ctypes,os,signal,sys\n"
    "libc=ctypes.CDLL(None,use_errno=True)\n"
    "gate=int(sys.argv[2])\n"
    "if gate>=0:\n"
    "    ok=os.read(gate,1)\n"
    "    os.close(gate)\n"
    "    ok==b'1' or os._exit(3)\n"
    "if sys.argv[3]:\n"
    "    uid,gid,groups=sys.argv[3].split(':')\n"
    "    os.setgroups([int(g) for g in groups.split(',') if g])\n"
    "    os.setresgid(int(gid),int(gid),int(gid))\n"
    "    os.setresuid(int(uid),int(uid),int(uid))\n"
    "libc.prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(3)\n"
    "if sys.argv[4]=='1':\n"
    "    libc.prctl(38,1,0,0,0)\n"  # PR_SET_NO_NEW_PRIVS
    "    libc.prctl(47,4,0,0,0)\n"  # PR_CAP_AMBIENT_CLEAR_ALL
    "    libc.capset((ctypes.c_uint32*2)(0x20080522,0),(ctypes.c_uint32*6)())==0 or os._exit(4)\n"
    "os.execvp(sys.argv[5], sys.argv[5:])\n"
)


@dataclass(frozen=True)
class RankSpec:
    """One rank to start on this peer.

    ``argv`` is the command as the user gave it after ``run --``: a leading
    ``*.py`` script runs under this daemon's Python (as torchrun does); anything
    else is executed as it is.  ``gpu_indices`` are all of the job's GPUs on this
    peer (they become ``CUDA_VISIBLE_DEVICES``; ``LOCAL_RANK`` indexes them).
    ``env`` adds variables; the contract variables always win.
    """

    job_id: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    gpu_indices: tuple[int, ...]
    argv: list[str]
    workdir: Path
    output_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    backend: Literal["gloo", "nccl"] = "gloo"
    socket_ifname: str | None = None
    attempt: int = 1
    """The job's attempt (DESIGN.md §8); the launcher keys processes and files by ``run_key``."""
    cuda_devices: tuple[str, ...] = ()
    """``CUDA_VISIBLE_DEVICES`` entries when they are not ``gpu_indices`` (a MIG instance's UUID:
    ``frenzyd.gpu_types.cuda_device``)."""

    @property
    def run_key(self) -> str:
        return run_key(self.job_id, self.attempt)


def run_key(job_id: str, attempt: int) -> str:
    """How the launcher names one attempt of a job (process bookkeeping, pid and log files)."""
    return f"{job_id}.a{attempt}"


ENV_ALLOW: Final = (
    "PATH", "HOME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "USER", "LOGNAME", "TERM",
    "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    "CUDA_*", "NCCL_*", "GLOO_*", "TORCH_*", "PYTORCH_*", "OMP_*",
)
"""What ranks take from the daemon's environment (``*``: a prefix); ``[launcher] env_allow`` adds
names.  Everything else (``SSH_AUTH_SOCK``, cloud and API tokens, ``FRENZY_*`` of the daemon's own
configuration) stays with the daemon."""


def env_allowed(name: str, allow: Iterable[str] = ENV_ALLOW) -> bool:
    """True when ``name`` matches an entry of ``allow`` (exactly, or by prefix for ``PREFIX*``)."""
    return any(name.startswith(a[:-1]) if a.endswith("*") else name == a for a in allow)


def rank_env(
    spec: RankSpec, base: Mapping[str, str] | None = None, extra_allow: Iterable[str] = ()
) -> dict[str, str]:
    """The environment of a rank: the allow-listed part of ``base`` (default: this process's
    environment; ``ENV_ALLOW`` plus ``extra_allow``), ``spec.env``, then the contract."""
    allow = (*ENV_ALLOW, *extra_allow)
    env = {k: v for k, v in (os.environ if base is None else base).items() if env_allowed(k, allow)}
    env.update(spec.env)
    env.update(
        {
            "RANK": str(spec.rank),
            "LOCAL_RANK": str(spec.local_rank),
            "WORLD_SIZE": str(spec.world_size),
            "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "GROUP_RANK": str(spec.rank // max(spec.local_world_size, 1)),
            "ROLE_RANK": str(spec.rank),
            "ROLE_WORLD_SIZE": str(spec.world_size),
            "MASTER_ADDR": spec.master_addr,
            "MASTER_PORT": str(spec.master_port),
            # The store runs in the daemon's child, not in rank 0 (torch/distributed/rendezvous.py).
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHELASTIC_RUN_ID": spec.run_key,
            "TORCHELASTIC_RESTART_COUNT": str(max(0, spec.attempt - 1)),
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(spec.cuda_devices or (str(i) for i in spec.gpu_indices)),
            "FRENZY_JOB_ID": spec.job_id,
            "FRENZY_ATTEMPT": str(spec.attempt),
            "FRENZY_BACKEND": spec.backend,
            "FRENZY_OUTPUT_DIR": str(spec.output_dir),
            "PYTHONUNBUFFERED": "1",
        }
    )
    # torchrun sets 1 only with several ranks per node and leaves a lone rank at torch's default (a
    # thread per core).  A pool node is shared, so every rank gets 1 unless the daemon's environment
    # says otherwise: tiny-llama alone on the 2-core machine at load 17-30 ran 67 tokens/s with
    # torch's 2 threads and 365-402 with 1 (OpenMP threads waiting on each other for a core).
    env.setdefault("OMP_NUM_THREADS", "1")
    if spec.socket_ifname:
        env["GLOO_SOCKET_IFNAME"] = spec.socket_ifname
        env["NCCL_SOCKET_IFNAME"] = spec.socket_ifname
    return env


def _proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): tells a live pid from a recycled one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _pgid_members(pgids: set[int]) -> set[int]:
    """Every live pid whose process group is in ``pgids`` (a rank's children included)."""
    found: set[int] = set()
    if not pgids:
        return found
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) in pgids:
            found.add(int(entry.name))
    return found


class RankHandle:
    """A started rank: its pid (= its process group id) and a way to wait for its exit code."""

    def __init__(self, spec: RankSpec, proc: asyncio.subprocess.Process, pid_file: Path, *,
                 launcher: Launcher | None = None, cgroup: Path | None = None,
                 slot: SlotAccount | None = None) -> None:
        self.spec = spec
        self.proc = proc
        self.pid = proc.pid
        self.pid_file = pid_file
        self.cgroup = cgroup
        """The rank's own cgroup (a leaf under its attempt's), None without cgroups."""
        self.slot = slot
        self._launcher = launcher
        self._pumps: list[asyncio.Task[None]] = []
        self._exited: asyncio.Future[None] | None = None
        self.returncode: int | None = None
        # A pidfd tells us when the rank itself exits, even while a child it left behind still holds
        # our pipes (asyncio's wait() only returns once every pipe is closed).
        try:
            self._pidfd: int | None = os.pidfd_open(proc.pid)
        except (OSError, AttributeError):
            self._pidfd = None

    async def _rank_exited(self) -> None:
        if self._pidfd is None or self.proc.returncode is not None:
            return
        if self._exited is None:
            loop = asyncio.get_running_loop()
            self._exited = loop.create_future()
            fd, fut = self._pidfd, self._exited

            def ready() -> None:
                loop.remove_reader(fd)
                if not fut.done():
                    fut.set_result(None)

            loop.add_reader(fd, ready)
        await asyncio.shield(self._exited)

    async def wait(self) -> int:
        """The rank's exit code (negative: killed by that signal), once its output is drained.

        When the rank exits, whatever it left running is killed (a volunteer's machine keeps no
        strays, and they would hold the output pipes open): its process group, and its cgroup
        (what left the group with ``setsid`` too).  Without cgroups, a slot account's processes
        are all killed once every rank of the attempt has exited.
        """
        if self.returncode is not None:
            return self.returncode
        await self._rank_exited()
        _killpg(self.pid, signal.SIGKILL)
        if self.cgroup is not None:
            await asyncio.to_thread(kill_cgroup, self.cgroup)
            if self._launcher is not None and self._launcher.cgroups is not None:
                await asyncio.to_thread(self._launcher.cgroups.prune, self.spec.run_key)
        elif self.slot is not None and self._launcher is not None \
                and self._launcher.all_exited(self.spec.run_key):
            await asyncio.to_thread(slots_mod.kill_uid, self.slot.uid)
        code = await self.proc.wait()
        if self._pumps:
            await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        self.returncode = code
        self.pid_file.unlink(missing_ok=True)
        return code

    @property
    def done(self) -> bool:
        return self.proc.returncode is not None

    @property
    def exited(self) -> bool:
        """Whether the rank process has exited: reaped, or its pidfd said so (asyncio may not have
        reaped it yet; a loaded loop runs the child watcher's callback late)."""
        return self.proc.returncode is not None or (self._exited is not None and self._exited.done())


class Launcher:
    """Starts, watches and stops this peer's rank processes and rendezvous stores."""

    def __init__(
        self,
        data_dir: Path,
        run_as: str | None = None,
        rendezvous_ports: tuple[int, int] = (0, 0),
        term_grace_s: float = TERM_GRACE_S,
        lease_s: float = 30.0,
        *,
        env_allow: Iterable[str] = (),
        isolation: Isolation | None = None,
        cgroups: bool = True,
        execute_dir: Path | None = None,
        rank_log_bytes: int = RANK_LOG_BYTES,
        rank_log_keep: int = RANK_LOG_KEEP,
        rank_log_retention_s: float = RANK_LOG_RETENTION_S,
    ) -> None:
        self.env_allow = tuple(env_allow)
        """Names of the daemon's environment ranks get besides ``ENV_ALLOW`` (``[launcher] env_allow``)."""
        self.dir = Path(data_dir) / "launcher"
        self.pid_dir = self.dir / "pids"
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.dir / "logs"
        self.run_as = run_as
        self.rendezvous_ports = rendezvous_ports
        self.term_grace_s = term_grace_s
        self.lease_s = lease_s
        self.isolation = isolation or Isolation(
            "own-user", slots_mod.user_name(os.geteuid()),
            "[launcher] run_as names one account for every job" if run_as else "no slot accounts configured")
        """Who ranks run as (:mod:`frenzyd.node.slots`); ``report()`` is the status JSON's ``launcher``."""
        self.cgroups: CgroupTree | None = None
        if cgroups:
            self.cgroups, self.isolation.kill = open_tree(Path(data_dir))
        else:
            self.isolation.kill = "[launcher] cgroups = false"
        if self.cgroups is None:
            self.isolation.kill += ("; a job is ended by killing every process of its slot account"
                                    if self.isolation.mode == "slots" else "; a job is ended by killing its "
                                    "ranks' process groups (a rank that calls setsid escapes)")
        self.execute_dir = Path(execute_dir) if execute_dir is not None else \
            Path(data_dir).parent / f"{Path(data_dir).name}-execute"
        if self.isolation.mode == "slots":
            slots_mod.check_execute_dir(self.execute_dir)
        self.rank_log_bytes, self.rank_log_keep = rank_log_bytes, rank_log_keep
        self.rank_log_retention_s = rank_log_retention_s
        self._ranks: dict[str, list[RankHandle]] = {}
        self._stores: dict[str, asyncio.subprocess.Process] = {}
        self._supervisors: dict[str, asyncio.subprocess.Process] = {}
        self._expired: set[str] = set()  # attempts whose supervisor killed the ranks for the lease
        self._run_dirs: dict[str, Path] = {}  # attempt -> its directory under execute_dir (slots only)
        self._handed: set[str] = set()  # attempts whose directory belongs to their slot already

    # ---- who runs what (frenzyd.node.slots) -------------------------------------------------
    def report(self) -> dict[str, Any]:
        """This node's launcher in its report: ``accept``, ``runs_as`` (``slots`` or ``own-user`` with
        the ``reason``), how jobs are killed."""
        return self.isolation.report()

    def admit(self, job_id: str, owner: str | None, trainer: bool) -> None:
        """LaunchError when this node must not run the job (a script on a trainer-only node; another
        user's job on a node that cannot switch users)."""
        self.isolation.admit(job_id, owner, trainer)

    def run_dir(self, job_id: str, attempt: int, default: Path) -> Path:
        """The attempt's directory: with slot accounts a fresh ``execute_dir/JOB.aN`` (0700; handed to
        the slot when its first rank starts), else ``default`` (``data_dir/runs/JOB/aN``)."""
        if self.isolation.mode != "slots":
            return default
        run = run_key(job_id, attempt)
        path = self._run_dirs.get(run)
        if path is None:
            path = self.execute_dir / run
            if path.exists():  # a leftover of an earlier daemon: never reuse its files
                slots_mod.remove_run_dir(path)
            path.mkdir(mode=0o700)
            self._run_dirs[run] = path
        return path

    def release(self, job_id: str, attempt: int) -> None:
        """The attempt is over here and its results and checkpoint are in the outbox: kill whatever
        is left of it, remove its directory and cgroup and free its slot (blocking: call it in a
        thread)."""
        self._release(run_key(job_id, attempt))

    def _release(self, run: str) -> None:
        if self.cgroups is not None:
            self.cgroups.kill(run)
        slot = self.isolation.busy.get(run)
        if slot is not None and self.cgroups is None:
            slots_mod.kill_uid(slot.uid)
        path = self._run_dirs.pop(run, None)
        if path is not None:
            slots_mod.remove_run_dir(path)
        self._handed.discard(run)
        self.isolation.give_back(run)
        self._prune_logs()

    def _slot_alive(self, slot: SlotAccount) -> bool:
        return bool(slots_mod.uid_pids(slot.uid))

    # ---- lease supervisors (frenzyd.node.supervisor) ----------------------------------------
    async def _supervisor(self, run: str) -> asyncio.subprocess.Process:
        proc = self._supervisors.get(run)
        if proc is not None and proc.returncode is None:
            return proc
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-P", "-m", "frenzyd.node.supervisor",
            "--grace", str(min(self.term_grace_s, self.lease_s / 2)),
            "--lease", str(self.lease_s), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            cwd=self.dir, start_new_session=True, env={**os.environ, "PYTHONPATH": _pythonpath()},
        )
        self._supervisors[run] = proc
        self._write_pid(f"{run}.supervisor", proc.pid)
        return proc

    def _tell(self, run: str, line: str) -> bool:
        proc = self._supervisors.get(run)
        if proc is None or proc.returncode is not None or proc.stdin is None or proc.stdin.is_closing():
            return False
        proc.stdin.write(f"{line}\n".encode())
        return True

    def renew(self, job_id: str, attempt: int, seconds: float) -> bool:
        """Extend the lease of the attempt's ranks here to ``seconds`` from now (False: none)."""
        return self._tell(run_key(job_id, attempt), f"renew {seconds:.3f}")

    async def unsupervise(self, job_id: str, attempt: int) -> bool:
        """The attempt's ranks are gone: end its supervisor.  True when it had killed them because
        their lease ran out (the daemon could not renew it), even when a ``cancel`` (the stop of
        the other ranks after the first one died of the supervisor's SIGTERM) ended it first."""
        run = run_key(job_id, attempt)
        expired = await self._unsupervise(run)
        if run in self._expired:
            self._expired.discard(run)
            return True
        return expired

    async def _unsupervise(self, run: str) -> bool:
        proc = self._supervisors.get(run)  # popped only once it has exited: a concurrent call waits too
        if proc is None:
            return False
        if proc.stdin is not None and not proc.stdin.is_closing():
            if proc.returncode is None:
                proc.stdin.write(b"stop\n")
                with contextlib.suppress(ConnectionError):
                    await proc.stdin.drain()
            proc.stdin.close()  # also when it already exited (lease expired): no pipe is left open
        await _reap(proc, self.term_grace_s + 5.0)
        if self._supervisors.get(run) is proc:
            del self._supervisors[run]
        (self.pid_dir / f"{run}.supervisor.pid").unlink(missing_ok=True)
        if proc.returncode == supervisor.EXPIRED:
            self._expired.add(run)
        return proc.returncode == supervisor.EXPIRED

    # ---- rendezvous store -------------------------------------------------------------------
    async def start_store(self, job_id: str, attempt: int, bind_addr: str,
                          start_limit_s: float = 60.0) -> int:
        """Start the rendezvous store of the job's attempt on ``bind_addr`` only; return its port."""
        run = run_key(job_id, attempt)
        if run in self._stores:
            raise LaunchError(f"job {run}: rendezvous store already running")
        lo, hi = self.rendezvous_ports
        log_path = self.dir / f"{run}.store.log"
        with log_path.open("wb") as errlog:
            proc = await asyncio.create_subprocess_exec(
                # -P and a cwd of our own: a `frenzyd` directory in the daemon's cwd must not shadow ours
                sys.executable, "-P", "-m", "frenzyd.node.rendezvous_store", "--host", bind_addr,
                "--port-min", str(lo), "--port-max", str(hi), "--expected-parent", str(os.getpid()),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=errlog, cwd=self.dir,
                start_new_session=True, env={**os.environ, "PYTHONPATH": _pythonpath()},
            )
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), start_limit_s)
        except TimeoutError:
            line = b""
        text = line.decode(errors="replace").strip()
        if not text.startswith("PORT "):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            detail = text or _tail(log_path) or f"no answer within {start_limit_s:.0f}s"
            raise LaunchError(
                f"job {run}: rendezvous store did not start on {bind_addr}: {detail}; check that the "
                "address belongs to this host and [launcher] rendezvous_ports has a free port"
            )
        self._stores[run] = proc
        self._write_pid(f"{run}.store", proc.pid)
        return int(text.split()[1])

    async def stop_store(self, job_id: str, attempt: int) -> None:
        """Close the rendezvous store of the job's attempt (no-op when none)."""
        await self._stop_store(run_key(job_id, attempt))

    async def _stop_store(self, run: str) -> None:
        proc = self._stores.get(run)  # kept until it has exited: close() reaps one a cancel left behind
        if proc is None:
            return
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        await _reap(proc, 5.0)
        if self._stores.get(run) is proc:
            del self._stores[run]
        (self.pid_dir / f"{run}.store.pid").unlink(missing_ok=True)
        (self.dir / f"{run}.store.log").unlink(missing_ok=True)

    # ---- ranks -------------------------------------------------------------------------------
    async def launch(self, spec: RankSpec, on_output: OutputCallback | None = None) -> RankHandle:
        """Start one rank; its stdout/stderr go to ``on_output`` chunk by chunk as they come (and to
        its rotated log under ``data_dir/launcher/logs``).

        With slot accounts the attempt's first rank takes a free slot and hands the attempt's
        directory (:meth:`run_dir`) to it; every rank runs as that slot.  With a cgroup tree each
        rank gets its own cgroup under the attempt's before it runs any of the job's code."""
        if not spec.argv:
            raise LaunchError(f"job {spec.job_id}: empty command; give a script after `run --`")
        if not spec.workdir.is_dir():
            raise LaunchError(f"job {spec.job_id}: workdir {spec.workdir} does not exist")
        run = spec.run_key
        private_dir(spec.output_dir)
        argv = list(spec.argv)
        if argv[0].endswith(".py"):
            argv.insert(0, sys.executable)
        env = rank_env(spec, extra_allow=self.env_allow)
        ident = ""
        slot = self.isolation.take(run, self._slot_alive)
        if slot is not None:
            home = self._run_dirs.get(run)
            if home is None or not spec.workdir.is_relative_to(home):
                if run not in self._handed:
                    self.isolation.give_back(run)
                raise LaunchError(f"job {run}: its directory {spec.workdir} is not the one the launcher gave "
                                  "the attempt (Launcher.run_dir)")
            if run not in self._handed:
                (home / "tmp").mkdir(exist_ok=True)
                await asyncio.to_thread(slots_mod.hand_over, home, slot)
                self._handed.add(run)
            env.update(HOME=str(home), USER=slot.name, LOGNAME=slot.name, TMPDIR=str(home / "tmp"))
            ident = f"{slot.uid}:{slot.gid}:{','.join(str(g) for g in slot.groups)}"
        elif self.run_as:
            import pwd

            try:
                pw = pwd.getpwnam(self.run_as)
            except KeyError:
                raise LaunchError(f"[launcher] run_as = {self.run_as!r}: no such user") from None
            ident = f"{pw.pw_uid}:{pw.pw_gid}:{pw.pw_gid}"
        drop_caps = "1" if ident or os.geteuid() != 0 else "0"
        supervisor = await self._supervisor(run)
        cg_path: Path | None = None
        gate_r = gate_w = -1
        if self.cgroups is not None:
            try:
                cg_path = self.cgroups.create(run, f"rank{spec.rank}")
            except OSError as exc:
                raise LaunchError(f"job {run}: cannot make its cgroup under {self.cgroups.root}: "
                                  f"{exc}") from exc
            gate_r, gate_w = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _RANK_EXEC, str(os.getpid()), str(gate_r), ident, drop_caps, *argv,
                cwd=str(spec.workdir), env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, pass_fds=(gate_r,) if gate_r >= 0 else (),
            )
        except (OSError, ValueError) as exc:
            for fd in (gate_r, gate_w):
                if fd >= 0:
                    os.close(fd)
            raise LaunchError(f"job {spec.job_id} rank {spec.rank}: cannot start {argv[0]!r}: {exc}") from exc
        if gate_r >= 0:
            os.close(gate_r)
            assert cg_path is not None
            try:
                (cg_path / "cgroup.procs").write_text(f"{proc.pid}\n")
                os.write(gate_w, b"1")
            except OSError as exc:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise LaunchError(f"job {spec.job_id} rank {spec.rank}: cannot put it in its cgroup "
                                  f"{cg_path}: {exc}") from exc
            finally:
                os.close(gate_w)
        pid_file = self._write_pid(f"{run}.rank{spec.rank}", proc.pid)
        if supervisor.stdin is not None and not supervisor.stdin.is_closing():
            supervisor.stdin.write(f"watch {proc.pid}\n".encode())  # the rank leads its own group
            if cg_path is not None:
                supervisor.stdin.write(f"cgroup {cg_path.parent}\n".encode())
            elif slot is not None:
                supervisor.stdin.write(f"uid {slot.uid}\n".encode())
        handle = RankHandle(spec, proc, pid_file, launcher=self, cgroup=cg_path, slot=slot)
        rank_log = RankLog(self.log_dir / f"{run}.rank{spec.rank}.log", self.rank_log_bytes,
                           self.rank_log_keep)
        for stream_name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert stream is not None
            handle._pumps.append(asyncio.create_task(
                _pump(spec.rank, stream_name, stream, on_output, rank_log)))
        self._ranks.setdefault(run, []).append(handle)
        log.info("job %s attempt %d: rank %d started (pid %d%s)", spec.job_id, spec.attempt, spec.rank,
                 proc.pid, f", as {slot.name}" if slot is not None else "")
        return handle

    def ranks(self, job_id: str, attempt: int) -> list[RankHandle]:
        return list(self._ranks.get(run_key(job_id, attempt), []))

    def forget(self, job_id: str, attempt: int) -> None:
        """Drop the bookkeeping of a finished attempt."""
        self._ranks.pop(run_key(job_id, attempt), None)

    def all_exited(self, run: str) -> bool:
        """Whether every rank of the attempt started here has exited (its pipes may still be open)."""
        return all(h.exited for h in self._ranks.get(run, []))

    def own_pids(self) -> set[int]:
        """Every live process Frenzy started (ranks, their children, stores): for owner protection.
        With cgroups and slot accounts this needs no look at other users' /proc entries (systemd's
        ``ProtectProc=invisible`` hides them)."""
        groups = {h.pid for hs in self._ranks.values() for h in hs if not h.done}
        groups |= {p.pid for p in self._stores.values()}
        pids = _pgid_members(groups)
        if self.cgroups is not None:
            pids |= self.cgroups.all_pids()
        else:
            for slot in self.isolation.busy.values():
                pids |= slots_mod.uid_pids(slot.uid)
        return pids

    def _job_pids(self, run: str) -> set[int]:
        """The attempt's processes beyond its ranks' process groups (what a ``setsid`` took out)."""
        if self.cgroups is not None:
            return self.cgroups.pids(run)
        slot = self.isolation.busy.get(run)
        return slots_mod.uid_pids(slot.uid) if slot is not None else set()

    def _kill_job(self, run: str) -> None:
        """SIGKILL all of the attempt: its cgroup, or every process of its slot (blocking)."""
        if self.cgroups is not None:
            self.cgroups.kill(run)
        else:
            slot = self.isolation.busy.get(run)
            if slot is not None:
                slots_mod.kill_uid(slot.uid)

    async def cancel(self, job_id: str, attempt: int, grace_s: float | None = None) -> None:
        """Kill every rank of the job's attempt (whole process groups and its cgroup or slot account,
        TERM then KILL after ``grace_s``, default ``term_grace_s``) and its store."""
        await self._cancel(run_key(job_id, attempt), grace_s)

    async def _cancel(self, run: str, grace_s: float | None = None) -> None:
        handles = [h for h in self._ranks.get(run, []) if not h.done]
        for h in handles:
            _killpg(h.pid, signal.SIGTERM)
        if handles:
            for pid in await asyncio.to_thread(self._job_pids, run):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            waits = [asyncio.ensure_future(h.proc.wait()) for h in handles]
            _, pending = await asyncio.wait(waits, timeout=self.term_grace_s if grace_s is None else grace_s)
            for h in handles:
                _killpg(h.pid, signal.SIGKILL)  # the group may hold children even when the rank exited
            await asyncio.to_thread(self._kill_job, run)
            if pending:
                await asyncio.wait(pending, timeout=10.0)
            job_id, _, attempt = run.rpartition(".a")
            log.info("job %s attempt %s: cancelled %d rank(s)", job_id, attempt, len(handles))
        elif run in self._ranks:
            await asyncio.to_thread(self._kill_job, run)
        await self._stop_store(run)
        await self._unsupervise(run)

    async def close(self) -> None:
        """Cancel everything still running (daemon shutdown); remove the attempts' directories and
        this daemon's cgroups."""
        for run in list(self._ranks) + list(self._stores) + list(self._supervisors):
            await self._cancel(run)
        for run in list(self._run_dirs) + list(self.isolation.busy):
            await asyncio.to_thread(self._release, run)
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.close)

    # ---- leftovers ---------------------------------------------------------------------------
    def _write_pid(self, name: str, pid: int) -> Path:
        path = self.pid_dir / f"{name}.pid"
        path.write_text(json.dumps({"pid": pid, "start": _proc_start_time(pid)}))
        return path

    def reap_leftovers(self) -> list[int]:
        """Kill the process groups a previous daemon left behind (pid files); return the pids killed."""
        killed = []
        for path in sorted(self.pid_dir.glob("*.pid")):
            try:
                rec = json.loads(path.read_text())
                pid, start = int(rec["pid"]), rec.get("start")
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            now = _proc_start_time(pid)
            # The leader may be gone (parent-death signal) while its children live on in its group;
            # a pid that is still some group's id cannot have been reused, so the group is ours.
            if (start is not None and now == start) or (now is None and _pgid_members({pid})):
                _killpg(pid, signal.SIGKILL)
                killed.append(pid)
            path.unlink(missing_ok=True)
        if killed:
            log.warning("reaped %d leftover rank/store process group(s): %s", len(killed), killed)
        if self.cgroups is not None:
            for run in self.cgroups.leftovers():
                killed.extend(self.cgroups.pids(run))
                self.cgroups.kill(run)
        if self.isolation.mode == "slots":
            for slot in self.isolation.slots:
                if self.cgroups is None:
                    n = slots_mod.kill_uid(slot.uid)
                    if n:
                        log.warning("killed %d leftover process(es) of slot account %s", n, slot.name)
            with contextlib.suppress(OSError):
                for path in self.execute_dir.iterdir():
                    if path.is_dir() and not path.is_symlink():
                        slots_mod.remove_run_dir(path)
        self._prune_logs()
        return killed

    def _prune_logs(self) -> None:
        """Remove rank logs older than ``rank_log_retention_s``."""
        cutoff = time.time() - self.rank_log_retention_s
        with contextlib.suppress(OSError):
            for path in self.log_dir.iterdir():
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < cutoff:
                        path.unlink()


async def _reap(proc: asyncio.subprocess.Process, limit_s: float) -> None:
    """Wait for a helper process (store, supervisor) told to exit; kill it after ``limit_s``, or at
    once when the waiting task is cancelled (a daemon stopping must not leave it running)."""
    try:
        await asyncio.wait_for(proc.wait(), limit_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise


def _pythonpath() -> str:
    """Make ``frenzyd`` importable in the store child even when the daemon runs from a source tree."""
    root = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    return root if not old else f"{root}{os.pathsep}{old}"


def _tail(path: Path, limit: int = 400) -> str:
    """The last line(s) of a small log file, for error messages."""
    try:
        text = path.read_bytes()[-limit:].decode(errors="replace").strip()
    except OSError:
        return ""
    return " | ".join(text.splitlines()[-3:])


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class RankLog:
    """One rank's output on its host (``data_dir/launcher/logs/JOB.aN.rankR.log``), rotated when it
    would pass ``max_bytes`` (``.1`` is the newest old file; ``keep`` old files are kept), so a
    chatty job cannot fill the disk of the machine it runs on.  ``max_bytes = 0``: no log."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self.size: int | None = None

    def write(self, data: bytes) -> None:
        if self.max_bytes <= 0 or not data:
            return
        try:
            if self.size is None:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                self.size = self.path.stat().st_size if self.path.exists() else 0
            if self.size + len(data) > self.max_bytes and self.size > 0:
                self.rotate()
            data = data[-self.max_bytes:]
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as f:
                f.write(data)
            self.size += len(data)
        except OSError as exc:  # a full disk must not stop the rank's output from reaching its submitter
            log.warning("rank log %s: %s; not logging this rank here any more", self.path, exc)
            self.max_bytes = 0

    def rotate(self) -> None:
        old = self.path.with_name(f"{self.path.name}.{self.keep}")
        old.unlink(missing_ok=True)
        for i in range(self.keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                src.rename(self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self.keep > 0:
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink()
        self.size = 0


async def _pump(rank: int, name: str, stream: asyncio.StreamReader, cb: OutputCallback | None,
                rank_log: RankLog | None = None) -> None:
    while chunk := await stream.read(65536):
        if rank_log is not None:
            rank_log.write(chunk)
        if cb is None:
            continue
        try:
            res = cb(rank, name, chunk)
            if inspect.isawaitable(res):
                await res
        except Exception:  # a consumer bug must not stop draining the pipe (the rank would block)
            log.exception("output callback failed for rank %d", rank)
            cb = None


# ---- payloads ---------------------------------------------------------------------------------
# The archive format lives in frenzyd.payload (the client packs a job's directory with it too);
# pack_dir, private_dir and unpack stay importable from here.


RESULTS_COMPRESSLEVEL: Final = 0
"""gzip level of what a rank host packs while or after its ranks run (rank 0's results, a host's
checkpoint part): stored blocks.  Tensors hardly deflate: a tiny-llama checkpoint (82.6 MB of fp32
weights and AdamW state) shrank 26 % at level 6 for 2.8 CPU seconds, against 0.3 s stored; on the
shared 2-core bench machine that CPU came out of the ranks' steps (scripts/bench_trainer_overhead.py)."""


def collect_results(output_dir: Path, max_bytes: int) -> bytes:
    """Rank 0's output files (or a checkpoint directory) as an archive (:func:`pack_dir`, stored:
    ``RESULTS_COMPRESSLEVEL``), at most ``max_bytes``; an empty directory is fine."""
    out = Path(output_dir)
    if not out.exists():
        out.mkdir(parents=True)
    try:
        data, _ = pack_dir(out, max_bytes, compresslevel=RESULTS_COMPRESSLEVEL)
    except LaunchError as exc:
        raise LaunchError(f"job results too large: {exc}; raise [launcher] max_result_bytes") from exc
    return data
