"""Helpers to stand up a pool of frenzyd daemons through the CLI contract (demo, bench, e2e test).

Everything goes through the public commands: ``frenzy-client pool init / add-node``
for credentials, ``frenzyd --config FILE`` for daemons, ``frenzy-client ... --daemon
unix:SOCK`` for the client.  Daemons may be spawned in the current network
namespace or through a spawner (``tests/netns.py``'s ``NetnsLab.popen``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def env() -> dict[str, str]:
    """The environment for daemons and clients: the source tree importable, output unbuffered."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e["PYTHONUNBUFFERED"] = "1"
    for k in [k for k in e if k.startswith("FRENZY_")]:
        del e[k]  # a developer's FRENZY_DAEMON etc. must not leak into the pool under test
    return e


def cli(*args: str, check: bool = True, timeout: float = 120.0, cwd: Path | None = None) -> str:
    """Run ``frenzy-client ARGS`` in this namespace; return stdout (raise with stderr on failure)."""
    res = subprocess.run([PY, "-m", "frenzy_client", *args], capture_output=True, text=True, env=env(),
                         timeout=timeout, check=False, cwd=cwd)
    if check and res.returncode != 0:
        raise RuntimeError(
            f"frenzy-client {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        )
    return res.stdout


def make_pool(pool_dir: Path, names: Sequence[str]) -> dict[str, Path]:
    """Create a pool CA in ``pool_dir`` and enrol ``names``; return each node's credentials directory."""
    cli("pool", "init", str(pool_dir))
    out = {}
    for name in names:
        creds = pool_dir / "nodes" / name
        cli("pool", "add-node", str(pool_dir), name, "--out", str(creds))
        out[name] = creds
    return out


def toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


@dataclass
class NodeConf:
    """What differs between the daemons of a test pool."""

    name: str
    base: Path
    credentials: Path
    devices: list[tuple[str, int]]
    listen: str = "0.0.0.0:7470"
    web: str = "127.0.0.1:7480"
    peers: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    mdns: bool = True
    advertise: str | None = None
    priority: int = 0
    heartbeat_s: float = 0.5
    peer_timeout_s: float = 2.0
    lease_timeout_s: float = 30.0
    rendezvous_ports: tuple[int, int] = (29400, 29499)
    term_grace_s: float = 2.0
    """``[launcher] term_grace_s``: SIGTERM to SIGKILL (a trainer's checkpoint must fit in it)."""
    shutdown_deadline_s: float | None = None
    """``[timing] shutdown_deadline_s`` (None: the default; at least ``term_grace_s`` + 5)."""
    extra_toml: str = ""
    """More tables appended to the config as they are (e.g. ``[jobs]``)."""

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    @property
    def socket(self) -> Path:
        return self.base / "client.sock"

    @property
    def config_path(self) -> Path:
        return self.base / "frenzyd.toml"

    def write(self) -> Path:
        self.base.mkdir(parents=True, exist_ok=True)
        lines = [
            "[node]", f"name = {json.dumps(self.name)}", f"data_dir = {json.dumps(str(self.data_dir))}",
            f"priority = {self.priority}", "",
            "[network]", f"listen = {json.dumps(self.listen)}", f"interfaces = {toml_list(self.interfaces)}",
            f"peers = {toml_list(self.peers)}", f"mdns = {'true' if self.mdns else 'false'}",
        ]
        if self.advertise:
            lines.append(f"advertise = {json.dumps(self.advertise)}")
        lines += [
            "", "[pool]", f"credentials = {json.dumps(str(self.credentials))}", "",
            "[client]", f"listen = {json.dumps('unix:' + str(self.socket))}", "",
            "[web]", f"listen = {json.dumps(self.web)}", "",
            "[timing]", f"heartbeat_s = {self.heartbeat_s}", f"peer_timeout_s = {self.peer_timeout_s}",
            f"lease_timeout_s = {self.lease_timeout_s}",
            *([f"shutdown_deadline_s = {self.shutdown_deadline_s}"] if self.shutdown_deadline_s else []), "",
            "[launcher]", f"rendezvous_ports = [{self.rendezvous_ports[0]}, {self.rendezvous_ports[1]}]",
            f"term_grace_s = {self.term_grace_s}", "",
        ]
        for gtype, count in self.devices:
            lines += ["[[devices]]", f"type = {json.dumps(gtype)}", f"count = {count}", ""]
        if self.extra_toml:
            lines.append(self.extra_toml)
        self.config_path.write_text("\n".join(lines))
        return self.config_path


Spawner = Callable[..., "subprocess.Popen[Any]"]


class Daemon:
    """One frenzyd process, started from its config; its log goes to ``base/frenzyd.log``."""

    def __init__(self, conf: NodeConf, spawn: Spawner | None = None) -> None:
        self.conf = conf
        self.spawn = spawn
        self.proc: subprocess.Popen[Any] | None = None
        self.log_path = conf.base / "frenzyd.log"
        self._log: Any = None

    def start(self) -> None:
        self.conf.write()
        self._log = self.log_path.open("ab")
        argv = [PY, "-m", "frenzyd", "--config", str(self.conf.config_path)]
        if self.spawn is None:
            self.proc = subprocess.Popen(argv, env=env(), stdout=self._log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        else:
            self.proc = self.spawn(argv, env=env(), stdout=self._log, stderr=subprocess.STDOUT, text=False)

    @property
    def address(self) -> str:
        return f"unix:{self.conf.socket}"

    def client(self, sub: str, *args: str, check: bool = True, timeout: float = 120.0) -> str:
        """``frenzy-client SUB --daemon this ARGS`` (``--daemon`` before any ``--``)."""
        return cli(sub, "--daemon", self.address, *args, check=check, timeout=timeout)

    def status(self) -> dict[str, Any] | None:
        """``frenzy-client status --json`` or None while the daemon does not answer."""
        if not self.conf.socket.exists():
            return None
        try:
            out = self.client("status", "--json", check=True, timeout=30)
        except (RuntimeError, subprocess.TimeoutExpired):
            return None
        try:
            return dict(json.loads(out))
        except ValueError:
            return None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def stop(self, deadline_s: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``deadline_s``, then SIGKILL; return the exit code."""
        if self.proc is None:
            return None
        self.kill(signal.SIGTERM)
        try:
            code = self.proc.wait(deadline_s)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            code = self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def wait_until(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll ``pred`` until it returns something truthy (returned) or ``timeout`` passes (TimeoutError)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def alive_ids(st: dict[str, Any] | None) -> set[str]:
    """The node ids a status JSON lists as alive."""
    if not st:
        return set()
    return {p["id"] for p in st.get("peers", []) if p.get("alive")}


def full_mesh(daemons: Sequence[Daemon], statuses: dict[str, dict[str, Any]] | None = None) -> bool:
    """Every daemon sees every other alive and all agree on one coordinator."""
    sts = [d.status() for d in daemons]
    if any(s is None for s in sts):
        return False
    ids = {s["node"]["id"] for s in sts if s}
    coords = {(s.get("coordinator") or {}).get("id") for s in sts if s}
    ok = all(alive_ids(s) >= ids for s in sts) and len(coords) == 1 and None not in coords
    if ok and statuses is not None:
        statuses.update({s["node"]["name"]: s for s in sts if s})
    return ok
