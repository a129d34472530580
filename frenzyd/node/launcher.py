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
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

from frenzyd.errors import LaunchError
from frenzyd.node import supervisor

# Re-exported (explicitly, for mypy): callers and tests import these from here.
from frenzyd.payload import pack_dir as pack_dir  # noqa: PLC0414
from frenzyd.payload import private_dir as private_dir  # noqa: PLC0414
from frenzyd.payload import unpack as unpack  # noqa: PLC0414

log = logging.getLogger(__name__)

OutputCallback = Callable[[int, str, bytes], Awaitable[None] | None]
"""``on_output(rank, stream ("stdout" | "stderr"), chunk)``; may be a coroutine function."""

TERM_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL on cancel."""

# Runs in the fresh rank process before the real command: arm the parent-death
# signal (it survives execve), give up if the daemon already died, then exec.
_RANK_EXEC = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(3)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
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
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun's default with several ranks per node
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

    def __init__(self, spec: RankSpec, proc: asyncio.subprocess.Process, pid_file: Path) -> None:
        self.spec = spec
        self.proc = proc
        self.pid = proc.pid
        self.pid_file = pid_file
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

        When the rank exits, whatever it left running in its process group is killed (a
        volunteer's machine keeps no strays, and they would hold the output pipes open).
        """
        if self.returncode is not None:
            return self.returncode
        await self._rank_exited()
        _killpg(self.pid, signal.SIGKILL)
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
    ) -> None:
        self.env_allow = tuple(env_allow)
        """Names of the daemon's environment ranks get besides ``ENV_ALLOW`` (``[launcher] env_allow``)."""
        self.dir = Path(data_dir) / "launcher"
        self.pid_dir = self.dir / "pids"
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        self.run_as = run_as
        self.rendezvous_ports = rendezvous_ports
        self.term_grace_s = term_grace_s
        self.lease_s = lease_s
        self._ranks: dict[str, list[RankHandle]] = {}
        self._stores: dict[str, asyncio.subprocess.Process] = {}
        self._supervisors: dict[str, asyncio.subprocess.Process] = {}
        self._expired: set[str] = set()  # attempts whose supervisor killed the ranks for the lease

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
        """Start one rank; its stdout/stderr go to ``on_output`` chunk by chunk as they come."""
        if not spec.argv:
            raise LaunchError(f"job {spec.job_id}: empty command; give a script after `run --`")
        if not spec.workdir.is_dir():
            raise LaunchError(f"job {spec.job_id}: workdir {spec.workdir} does not exist")
        private_dir(spec.output_dir)
        argv = list(spec.argv)
        if argv[0].endswith(".py"):
            argv.insert(0, sys.executable)
        kwargs: dict[str, object] = {}
        if self.run_as:
            kwargs.update(user=self.run_as, group=None, extra_groups=[])
        supervisor = await self._supervisor(spec.run_key)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _RANK_EXEC, str(os.getpid()), *argv,
                cwd=str(spec.workdir), env=rank_env(spec, extra_allow=self.env_allow),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True, **kwargs,  # type: ignore[arg-type]
            )
        except (OSError, ValueError) as exc:
            raise LaunchError(f"job {spec.job_id} rank {spec.rank}: cannot start {argv[0]!r}: {exc}") from exc
        pid_file = self._write_pid(f"{spec.run_key}.rank{spec.rank}", proc.pid)
        if supervisor.stdin is not None and not supervisor.stdin.is_closing():
            supervisor.stdin.write(f"watch {proc.pid}\n".encode())  # the rank leads its own group
        handle = RankHandle(spec, proc, pid_file)
        for stream_name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert stream is not None
            handle._pumps.append(asyncio.create_task(_pump(spec.rank, stream_name, stream, on_output)))
        self._ranks.setdefault(spec.run_key, []).append(handle)
        log.info("job %s attempt %d: rank %d started (pid %d)", spec.job_id, spec.attempt, spec.rank,
                 proc.pid)
        return handle

    def ranks(self, job_id: str, attempt: int) -> list[RankHandle]:
        return list(self._ranks.get(run_key(job_id, attempt), []))

    def forget(self, job_id: str, attempt: int) -> None:
        """Drop the bookkeeping of a finished attempt."""
        self._ranks.pop(run_key(job_id, attempt), None)

    def own_pids(self) -> set[int]:
        """Every live process Frenzy started (ranks, their children, stores): for owner protection."""
        groups = {h.pid for hs in self._ranks.values() for h in hs if not h.done}
        groups |= {p.pid for p in self._stores.values()}
        return _pgid_members(groups)

    async def cancel(self, job_id: str, attempt: int, grace_s: float | None = None) -> None:
        """Kill every rank of the job's attempt (whole process groups, TERM then KILL after
        ``grace_s``, default ``term_grace_s``) and its store."""
        await self._cancel(run_key(job_id, attempt), grace_s)

    async def _cancel(self, run: str, grace_s: float | None = None) -> None:
        handles = [h for h in self._ranks.get(run, []) if not h.done]
        for h in handles:
            _killpg(h.pid, signal.SIGTERM)
        if handles:
            waits = [asyncio.ensure_future(h.proc.wait()) for h in handles]
            _, pending = await asyncio.wait(waits, timeout=self.term_grace_s if grace_s is None else grace_s)
            for h in handles:
                _killpg(h.pid, signal.SIGKILL)  # the group may hold children even when the rank exited
            if pending:
                await asyncio.wait(pending, timeout=10.0)
            job_id, _, attempt = run.rpartition(".a")
            log.info("job %s attempt %s: cancelled %d rank(s)", job_id, attempt, len(handles))
        await self._stop_store(run)
        await self._unsupervise(run)

    async def close(self) -> None:
        """Cancel everything still running (daemon shutdown)."""
        for run in list(self._ranks) + list(self._stores) + list(self._supervisors):
            await self._cancel(run)

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
        return killed


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


async def _pump(rank: int, name: str, stream: asyncio.StreamReader, cb: OutputCallback | None) -> None:
    while chunk := await stream.read(65536):
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


def collect_results(output_dir: Path, max_bytes: int) -> bytes:
    """Rank 0's output files as an archive (:func:`pack_dir`), at most ``max_bytes``; empty dir is fine."""
    out = Path(output_dir)
    if not out.exists():
        out.mkdir(parents=True)
    try:
        data, _ = pack_dir(out, max_bytes)
    except LaunchError as exc:
        raise LaunchError(f"job results too large: {exc}; raise [launcher] max_result_bytes") from exc
    return data
