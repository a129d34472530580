"""Network-namespace lab for multi-host tests: N host namespaces on a bridge in a namespace of its own.

Per lab: one bridge namespace holding ``br0`` (multicast snooping off, so mDNS
floods), N host namespaces each with ``lo`` up and one veth end renamed
``eth0`` carrying 10.77.X.(i+2)/24 (X random per run; the subnet exists only
inside the lab's namespaces) plus a multicast route.  Names carry the pid and a
random tag, so parallel runs never collide.  :meth:`NetnsLab.close` (also run by
the context manager on any failure) kills every process the lab started, by
pid, then deletes the namespaces, which destroys their veths.

The kernel's neighbour tables (ARP, NDP) are one per host, shared by every
namespace, with one garbage-collection limit (``gc_thresh3``, 1,024 by
default): N hosts that all talk to each other need N x (N - 1) entries, so at
40 hosts (1,560) new entries fail with "neighbor table overflow" and
connections to some hosts time out although every one is up.  A lab raises the
limits to fit while it runs (a real pool's workstations each have their own
table) and puts back what it changed.

Needs root and iproute2; :func:`skip_reason` says why a test cannot run.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any


def skip_reason() -> str | None:
    """Why namespace tests cannot run here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed (scripts/test installs it when root)"
    probe = f"fzprobe{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


NEIGH_SYSCTL = "/proc/sys/net/{family}/neigh/default/gc_thresh{k}"
NEIGH_SPARE = 512
"""Entries left for everything else on the host (other labs, the host's own neighbours)."""


def _raise_neighbour_limits(entries: int) -> dict[Path, tuple[int, int]]:
    """Make room for ``entries`` more neighbours in the host's ARP and NDP tables (soft limit
    ``gc_thresh2``, hard ``gc_thresh3``); return ``{path: (old, new)}`` for each value changed."""
    changed: dict[Path, tuple[int, int]] = {}
    for family in ("ipv4", "ipv6"):
        soft = entries + NEIGH_SPARE
        for k, want in ((2, soft), (3, 2 * soft)):
            path = Path(NEIGH_SYSCTL.format(family=family, k=k))
            try:
                old = int(path.read_text())
                if old < want:
                    path.write_text(f"{want}\n")
                    changed[path] = (old, want)
            except (OSError, ValueError):
                continue  # not this kernel's knob, or not ours to set: a small lab does not need it
    return changed


def _restore_neighbour_limits(changed: dict[Path, tuple[int, int]]) -> None:
    """Put back each limit still at the value this lab set (another lab may have raised it since)."""
    for path, (old, new) in changed.items():
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text()) == new:
                path.write_text(f"{old}\n")


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=30)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")


@dataclass
class Host:
    """One host namespace: its name, interface and address."""

    ns: str
    ifname: str
    address: str


@dataclass
class NetnsLab:
    """A bridge and ``n`` hosts; use as a context manager (teardown in ``finally``)."""

    n: int
    tag: str = field(default_factory=lambda: f"fz{os.getpid() % 100000}{uuid.uuid4().hex[:3]}")
    subnet: int = field(default_factory=lambda: random.randint(1, 254))
    hosts: list[Host] = field(default_factory=list)
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)
    _namespaces: list[str] = field(default_factory=list)
    _neigh_limits: dict[Path, tuple[int, int]] = field(default_factory=dict)

    @property
    def bridge_ns(self) -> str:
        return f"{self.tag}-br"

    def __enter__(self) -> NetnsLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        self._neigh_limits = _raise_neighbour_limits(self.n * (self.n - 1))
        br = self.bridge_ns
        _ip("netns", "add", br)
        self._namespaces.append(br)
        _ip("link", "set", "lo", "up", ns=br)
        _ip("link", "add", "br0", "type", "bridge", "mcast_snooping", "0", ns=br)
        _ip("link", "set", "br0", "up", ns=br)
        for i in range(self.n):
            ns = f"{self.tag}-h{i}"
            _ip("netns", "add", ns)
            self._namespaces.append(ns)
            outer, inner = f"{self.tag}b{i}"[-15:], f"{self.tag}h{i}"[-15:]
            # create the pair directly across the two namespaces: nothing lands in the root namespace
            _ip("link", "add", outer, "netns", br, "type", "veth", "peer", "name", inner, "netns", ns)
            _ip("link", "set", outer, "master", "br0", ns=br)
            _ip("link", "set", outer, "up", ns=br)
            _ip("link", "set", inner, "name", "eth0", ns=ns)
            addr = f"10.77.{self.subnet}.{i + 2}"
            _ip("addr", "add", f"{addr}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "multicast", "on", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("route", "add", "224.0.0.0/4", "dev", "eth0", ns=ns)
            self.hosts.append(Host(ns, "eth0", addr))

    def popen(
        self,
        host: int,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        stdout: int | IO[Any] | None = subprocess.PIPE,
        stderr: int | IO[Any] | None = subprocess.STDOUT,
        text: bool = True,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside host ``host``'s namespace (``ip netns exec`` execs it: the pid is argv's)."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[host].ns, *argv],
            env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=text, start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def run(
        self, host: int, argv: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 60.0,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in a host namespace to completion (bounded by ``timeout``)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.hosts[host].ns, *argv],
            env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
        )

    def close(self) -> None:
        """Kill the lab's processes (their whole sessions) and delete its namespaces; idempotent."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        self.procs.clear()
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=30)
        self._namespaces.clear()
        _restore_neighbour_limits(self._neigh_limits)
        self._neigh_limits = {}


def list_lab_namespaces(tag: str) -> list[str]:
    """Namespaces whose names start with ``tag`` (for the teardown test)."""
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.startswith(tag)]
