"""frenzyd's configuration: TOML into nested frozen dataclasses, env overrides once, fix-it errors.

Every key is listed in ``KEYS`` (section, key, default, meaning); ``CONFIG_REFERENCE``
renders it as the README's table.  ``load_config`` is the only place that reads the
environment (``ENV_OVERRIDES``); relative paths are resolved against the config file's
directory.  Unknown sections or keys are errors (a typo must not silently fall back to
a default).
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Final

from frenzyd.errors import ConfigError
from frenzyd.gpu_types import GPU_TYPES
from frenzyd.net.auth import NODE_NAME_RE

DEFAULT_IGNORE_PROCESSES: Final = (
    "Xorg", "Xwayland", "gnome-shell", "kwin_wayland", "kwin_x11", "plasmashell", "mutter", "sway",
    "weston", "gdm-x-session", "cinnamon", "xfwm4", "compiz",
)
"""``[owner] ignore_processes``' default: a desktop session's display servers and compositors."""


# (section, key, default shown in the reference, meaning)
KEYS: Final[tuple[tuple[str, str, str, str], ...]] = (
    (
        "node",
        "name",
        "required",
        "this node's name, as enrolled with `pool add-node` (letters, digits, . _ -)",
    ),
    ("node", "data_dir", "required", "directory for identity, job records, job logs and pid files"),
    (
        "node",
        "priority",
        "0",
        "election preference: the live node with the highest priority coordinates (ties: smallest node id)",
    ),
    ("network", "listen", '"0.0.0.0:7470"', "peer API (mutual TLS) `host:port`; `[::]:7470` for IPv6"),
    ("network", "interfaces", "[]", 'interfaces for mDNS and job rendezvous, e.g. `["eth0"]`; empty = all'),
    ("network", "peers", "[]", "static peers `host:port`, for networks where multicast does not pass"),
    ("network", "mdns", "true", "announce and browse `_frenzy._tcp.local.` with zeroconf"),
    (
        "network",
        "advertise",
        "auto",
        "address peers use to reach this node; default: first IPv4 of the first "
        "interface, else the listen host (else the first non-loopback IPv4)",
    ),
    (
        "network",
        "handshake_timeout_s",
        "5.0",
        "a connection to the peer port that has not completed its TLS handshake within this is closed",
    ),
    (
        "network",
        "max_unauthenticated",
        "256",
        "connections to the peer port still in their TLS handshake, in total; more are closed at once "
        "(members' established connections are not counted)",
    ),
    (
        "network",
        "max_unauthenticated_per_ip",
        "16",
        "the same, per source address (one host cannot fill the total)",
    ),
    (
        "network",
        "frame_caps",
        "{}",
        "per message kind, the largest frame accepted (bytes), overriding the built-in caps "
        "(SECURITY.md), e.g. `{heartbeat = 2097152}`",
    ),
    (
        "network",
        "mdns_max_entries",
        "256",
        "mDNS services of this pool remembered at once (other pools' are never tracked); the oldest go first",
    ),
    ("network", "mdns_entry_ttl_s", "900.0", "an mDNS service not re-announced for this long is forgotten"),
    (
        "network",
        "membership",
        '"mesh"',
        '`"mesh"`: every member heartbeats every other (its full report to all); `"swim"`: liveness by the '
        "SWIM protocol (bounded fan-out, piggybacked gossip; `peers` are its seeds) and the full report "
        "only to the coordinator and the peers of this node's jobs: a member's work stays flat in pool size",
    ),
    (
        "pool",
        "credentials",
        "required",
        "directory written by `frenzy-client pool add-node` (ca.pem, node.pem, node.key)",
    ),
    (
        "client",
        "listen",
        '"unix:DATA_DIR/client.sock"',
        "local client API: `unix:/path` (file permissions) or "
        "`127.0.0.1:PORT` (per-user token file in data_dir)",
    ),
    (
        "client",
        "admin_group",
        '"frenzy-admin"',
        "members of this local group are admins of the client API (see, read and cancel every user's jobs, "
        "issue tokens), besides root and the daemon's own user; a missing group has no members",
    ),
    ("web", "listen", '"127.0.0.1:7480"', "read-only status page, JSON and /metrics"),
    (
        "web",
        "idle_timeout_s",
        "15.0",
        "a web connection that has not sent a complete request (headers) within this, from connecting or "
        "from its last response, is closed",
    ),
    ("web", "max_connections", "64", "open web connections at once; more are closed at once"),
    (
        "election",
        "max_term_jump",
        "1000",
        "a heartbeat or order whose term is more than this above the highest term seen is refused "
        "(counted, never persisted); the first term heard after start is taken as it is",
    ),
    (
        "log",
        "format",
        '"text"',
        '`"text"` (lines for a person) or `"json"` (one object per event: ts, level, logger, msg, job_id, '
        'attempt, exc) for a log pipeline',
    ),
    ("log", "level", '"info"', '`"debug"`, `"info"`, `"warning"` or `"error"`; `frenzyd -v` means `"debug"`'),
    (
        "devices",
        "type",
        "required",
        "[[devices]] declared (simulated) GPUs, used when NVML finds none: canonical "
        "type name (e.g. `A100-80GB`)",
    ),
    ("devices", "count", "1", "[[devices]] how many GPUs of this type"),
    (
        "devices",
        "memory_gib",
        "type's memory",
        "[[devices]] memory per GPU; required for a type not in the canonical table",
    ),
    ("timing", "heartbeat_s", "1.0", "interval between heartbeats to each peer"),
    ("timing", "peer_timeout_s", "4.0", "a peer is dead after this long without a heartbeat"),
    (
        "timing",
        "election_grace_s",
        "peer_timeout_s",
        "after start-up, wait this long to learn a sitting coordinator before claiming the role",
    ),
    ("timing", "request_timeout_s", "5.0", "timeout of one peer request"),
    (
        "timing",
        "lease_timeout_s",
        "30.0",
        "a node that cannot renew its jobs' leases this long (frozen, cut off) has its ranks killed by "
        "their supervisor; the coordinator re-places a silent node's jobs only after lease_timeout_s + "
        "peer_timeout_s + 2 x heartbeat_s",
    ),
    (
        "timing",
        "shutdown_deadline_s",
        "25.0",
        "SIGTERM: stop gracefully within this, then cancel; at least launcher.stop_grace_s + 5, so the "
        "ranks get their whole grace first (the systemd unit's TimeoutStopSec covers it)",
    ),
    ("timing", "inventory_refresh_s", "2.0", "interval between GPU inventory refreshes"),
    (
        "launcher",
        "run_as",
        "none",
        "old: run every job's ranks as this one user (daemon must be root); slot accounts replace it "
        "(launcher.slots) and win when they exist",
    ),
    (
        "launcher",
        "accept",
        "\"any\"",
        "\"trainer-only\": this machine runs no foreign code, only the built-in trainer (frenzyd.trainer) "
        "on a job's data: it advertises so, placement puts no script job here and a script launch is "
        "refused; \"any\": scripts too",
    ),
    (
        "launcher",
        "slots",
        "true",
        "run each job's ranks as a slot account of its own (slot_prefix + 1, 2, ...: scripts/install "
        "--slots N makes them), one per job running here; needs root or CAP_SETUID/CAP_SETGID/CAP_KILL. "
        "A daemon without those capabilities runs ranks as its own user and only its own user's jobs; "
        "without slot accounts (or false) every job runs as the daemon's user (a warning at start); the "
        "status says which and why",
    ),
    ("launcher", "slot_prefix", "\"frenzy-slot\"", "name prefix of the slot accounts"),
    (
        "launcher",
        "execute_dir",
        "DATA_DIR-execute",
        "where each job gets its own 0700 directory owned by its slot (removed when the job ends "
        "here); made 0711; every directory above it must be searchable by others",
    ),
    (
        "launcher",
        "cgroups",
        "true",
        "each job's ranks in their own cgroup v2 (found through /proc/mounts; under systemd the unit's "
        "Delegate=yes), ended with cgroup.kill; false or no cgroup v2: every process of the job's slot "
        "account is killed instead",
    ),
    (
        "launcher",
        "rank_log_bytes",
        "16777216",
        "each rank's output is also kept on the machine it runs on (data_dir/launcher/logs), rotated "
        "past this size (16 MiB); 0: not kept",
    ),
    ("launcher", "rank_log_keep", "2", "rotated files kept per rank log"),
    ("launcher", "rank_log_retention_s", "604800.0", "rank logs older than this are removed (7 days)"),
    (
        "launcher",
        "max_payload_bytes",
        "268435456",
        "cap on a job's shipped directory (256 MiB); never below max_data_bytes + 16 MiB, so a built-in "
        "trainer job's data file always fits its payload",
    ),
    (
        "launcher",
        "max_data_bytes",
        "4294967296",
        "cap on a built-in trainer job's data file (run --data; 4 GiB); the client refuses larger files",
    ),
    ("launcher", "max_result_bytes", "67108864", "cap on rank 0's returned output files (64 MiB)"),
    (
        "launcher",
        "rendezvous_ports",
        "[29400, 29499]",
        "inclusive TCP port range for the per-job rendezvous store (MASTER_PORT); open it between peers. "
        "gloo/NCCL rank-to-rank links use ephemeral ports on the pool interface",
    ),
    (
        "launcher",
        "stop_grace_s",
        "10.0",
        "every stop of a job's ranks (cancel, preemption, daemon shutdown): SIGTERM to the rank process "
        "group, SIGKILL after this; ranks read the shortest grace they can get, min(stop_grace_s, "
        "owner.vacate_grace_s), in FRENZY_STOP_GRACE_S",
    ),
    ("launcher", "term_grace_s", "10.0", "old name of stop_grace_s (read when stop_grace_s is not set)"),
    (
        "launcher",
        "env_allow",
        "[]",
        "names of the daemon's environment variables ranks also get, besides PATH, HOME, LANG, LC_*, "
        "TZ, TMPDIR, USER, LOGNAME, TERM, PYTHONPATH, VIRTUAL_ENV, LD_LIBRARY_PATH, CUDA_*, NCCL_*, GLOO_*, "
        "TORCH_*, PYTORCH_*, OMP_* (e.g. `[\"WANDB_MODE\"]`; a name ending in `*` is a prefix); everything "
        "else (SSH_AUTH_SOCK, tokens) stays with the daemon",
    ),
    (
        "owner",
        "min_free_fraction",
        "0.5",
        "a GPU with less free memory than this fraction of its total is not offered (the owner is using it)",
    ),
    (
        "owner",
        "protect_foreign_processes",
        "true",
        "a GPU running any process that is not Frenzy's is not offered, and Frenzy's ranks there are vacated",
    ),
    (
        "owner",
        "ignore_processes",
        "display servers",
        "processes that are not the owner's work (executable names, e.g. `[\"Xorg\", \"gnome-shell\"]`): "
        "they do not withhold a GPU and their memory is subtracted from its free memory; default: "
        + ", ".join(DEFAULT_IGNORE_PROCESSES) + "; `[]` counts every process",
    ),
    ("owner", "vacate_grace_s", "30.0", "owner reclaimed a GPU: ranks get SIGTERM, then SIGKILL after this"),
    (
        "owner",
        "users",
        "[]",
        "local users who may say 'frenzy-client owner busy|idle' on this node (besides the admins of "
        "[client] admin_group): busy withholds the GPU and stops Frenzy's ranks on it",
    ),
    (
        "owner",
        "windows",
        "[]",
        "hours the owner lends the GPUs, e.g. [\"Mon-Fri 19:00-08:00\", \"Sat,Sun 00:00-24:00\"] "
        "(local time; empty: always); outside them the GPUs are withheld and Frenzy's ranks stopped",
    ),
    (
        "owner",
        "max_utilization",
        "0.5",
        "a GPU busier than this (0..1) while no Frenzy rank holds it counts as the owner's work",
    ),
    (
        "owner",
        "idle_minutes",
        "5.0",
        "after the owner last used a GPU (a process, utilisation, 'owner busy') it is offered again only "
        "once it has been idle this long",
    ),
    (
        "jobs",
        "unplaceable_after_s",
        "3600.0",
        "the submitter fails a queued job after this long in which no GPU type it has seen in the pool "
        "(remembered across restarts) could hold it; until then it waits with the reason shown",
    ),
    (
        "jobs",
        "policy",
        "frenzy",
        "the coordinator's scheduling policy: frenzy (HAS), fifo, srtf, srtf-wide, tiresias, sia or gavel "
        "(the simulator's policies, run live; frenzyd.has)",
    ),
    (
        "jobs",
        "min_run_s",
        "120.0",
        "least progress a checkpointable job (the built-in trainer) makes on a placement, counted from its "
        "first step there, before the scheduler may preempt, shrink or move it (each change costs a "
        "checkpoint and a restart); a job whose first step has not come is not changed, nor grown",
    ),
    (
        "jobs",
        "restart_start_s",
        "60.0",
        "what the coordinator assumes a re-placed job's start costs (placement to its first step) until it "
        "has measured its own; its measurements then take over (status `scheduler`)",
    ),
    (
        "jobs",
        "restart_stop_s",
        "36.0",
        "what it assumes a stop costs (stop order to every rank's exit: checkpoint write and copy) until "
        "measured",
    ),
    (
        "jobs",
        "retention_s",
        "604800.0",
        "how long a rank host keeps a finished attempt's exit status and results for a submitter "
        "that has not acknowledged them (7 days)",
    ),
    (
        "jobs",
        "max_queued_per_user",
        "50",
        "a user's jobs of this node waiting to be placed; a submission past it is refused (429) saying so; "
        "admins are not limited; 0: no limit",
    ),
    (
        "jobs",
        "max_active_per_user",
        "100",
        "a user's unfinished jobs (queued or running) of this node; past it a submission is refused (429); "
        "admins are not limited; 0: no limit",
    ),
    (
        "jobs",
        "keep_finished_days",
        "30.0",
        "a finished job's record, log, payload and results (data_dir/jobs/ID) are deleted this long after "
        "it finished, once its results were fetched (or it has none), and a rank host's leftover "
        "data_dir/runs/JOB of a job no longer leased there once unchanged this long; checked at start and "
        "hourly; 0: keep forever. Queued and running jobs are never deleted",
    ),
    (
        "jobs",
        "keep_unfetched_days",
        "90.0",
        "the same for a finished job whose results were never fetched; 0: keep forever",
    ),
)

ENV_OVERRIDES: Final[Mapping[str, tuple[str, str]]] = {
    "FRENZY_NODE_NAME": ("node", "name"),
    "FRENZY_DATA_DIR": ("node", "data_dir"),
    "FRENZY_PRIORITY": ("node", "priority"),
    "FRENZY_LISTEN": ("network", "listen"),
    "FRENZY_INTERFACES": ("network", "interfaces"),
    "FRENZY_PEERS": ("network", "peers"),
    "FRENZY_MDNS": ("network", "mdns"),
    "FRENZY_ADVERTISE": ("network", "advertise"),
    "FRENZY_CREDENTIALS": ("pool", "credentials"),
    "FRENZY_CLIENT_LISTEN": ("client", "listen"),
    "FRENZY_WEB_LISTEN": ("web", "listen"),
}
"""Environment variables that override one key each (lists: comma-separated; booleans: 1/0/true/false)."""


def _render_reference() -> str:
    lines = ["| key | default | meaning |", "| --- | --- | --- |"]
    for section, key, default, doc in KEYS:
        lines.append(f"| `{section}.{key}` | `{default}` | {doc} |")
    lines.append("")
    lines.append(
        "Environment overrides (applied once at load): "
        + ", ".join(f"`{env}` → `{s}.{k}`" for env, (s, k) in ENV_OVERRIDES.items())
    )
    return "\n".join(lines)


# --- value types --------------------------------------------------------------------------


@dataclass(frozen=True)
class HostPort:
    """An address ``host:port`` (IPv6 hosts written ``[::1]:7470``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str, what: str = "address") -> HostPort:
        """Parse ``host:port``; ConfigError with an example when it is not one."""
        text = text.strip()
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or not rest.startswith(":"):
                raise ConfigError(f"{what} {text!r}: write an IPv6 address as [::1]:7470")
            port_s = rest[1:]
        else:
            host, sep, port_s = text.rpartition(":")
            if not sep or ":" in host:
                raise ConfigError(f"{what} {text!r} is not host:port (e.g. 10.0.0.5:7470)")
        if not host:
            raise ConfigError(f"{what} {text!r} has no host (e.g. 0.0.0.0:7470)")
        try:
            port = int(port_s)
        except ValueError:
            raise ConfigError(f"{what} {text!r}: port {port_s!r} is not a number") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"{what} {text!r}: port must be 0..65535")
        return cls(host, port)


@dataclass(frozen=True)
class NodeSection:
    name: str
    data_dir: Path
    priority: int = 0


@dataclass(frozen=True)
class NetworkSection:
    listen: HostPort
    interfaces: tuple[str, ...] = ()
    peers: tuple[HostPort, ...] = ()
    mdns: bool = True
    advertise: str | None = None
    """The host peers should dial; ``load_config`` fills it in (never None after loading)."""
    handshake_timeout_s: float = 5.0
    max_unauthenticated: int = 256
    max_unauthenticated_per_ip: int = 16
    frame_caps: tuple[tuple[str, int], ...] = ()
    """Per-kind frame cap overrides ``(kind, bytes)``."""
    mdns_max_entries: int = 256
    mdns_entry_ttl_s: float = 900.0
    membership: str = "swim"
    """``swim`` (frenzyd.net.membership: a member's work flat in pool size) or ``mesh`` (heartbeats to
    every member)."""

    @property
    def advertise_address(self) -> str:
        """``host:port`` peers use to reach this node's peer API."""
        return str(HostPort(self.advertise or self.listen.host, self.listen.port))


@dataclass(frozen=True)
class PoolSection:
    credentials: Path


@dataclass(frozen=True)
class ClientSection:
    listen: str
    admin_group: str = "frenzy-admin"

    @property
    def unix_path(self) -> Path | None:
        return Path(self.listen[5:]) if self.listen.startswith("unix:") else None


@dataclass(frozen=True)
class WebSection:
    listen: HostPort = HostPort("127.0.0.1", 7480)
    idle_timeout_s: float = 15.0
    max_connections: int = 64


@dataclass(frozen=True)
class ElectionSection:
    max_term_jump: int = 1000


@dataclass(frozen=True)
class LogSection:
    format: str = "text"
    level: str = "info"


@dataclass(frozen=True)
class DeviceDecl:
    type: str
    count: int = 1
    memory_gib: float | None = None


@dataclass(frozen=True)
class TimingSection:
    heartbeat_s: float = 1.0
    peer_timeout_s: float = 4.0
    election_grace_s: float = 4.0
    request_timeout_s: float = 5.0
    lease_timeout_s: float = 30.0
    shutdown_deadline_s: float = 25.0
    inventory_refresh_s: float = 2.0


DATA_SLACK_BYTES: Final = 16 * 1024 * 1024
"""What packing a data file may add to it (tar headers, gzip of incompressible tokens)."""


@dataclass(frozen=True)
class LauncherSection:
    run_as: str | None = None
    max_payload_bytes: int = 4 * 1024**3 + DATA_SLACK_BYTES  # the loader keeps it >= max_data_bytes + slack
    max_result_bytes: int = 64 * 1024 * 1024
    max_data_bytes: int = 4 * 1024**3
    rendezvous_ports: tuple[int, int] = (29400, 29499)
    term_grace_s: float = 10.0
    """``stop_grace_s`` (config key; ``term_grace_s`` is its old name)."""
    env_allow: tuple[str, ...] = ()
    accept: str = "any"
    """``any`` or ``trainer-only`` (no foreign code: only frenzyd.trainer on data)."""
    slots: bool = True
    slot_prefix: str = "frenzy-slot"
    execute_dir: Path | None = None
    """None: ``DATA_DIR-execute`` beside the data directory."""
    cgroups: bool = True
    rank_log_bytes: int = 16 * 1024 * 1024
    rank_log_keep: int = 2
    rank_log_retention_s: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class OwnerSection:
    min_free_fraction: float = 0.5
    protect_foreign_processes: bool = True
    ignore_processes: tuple[str, ...] = DEFAULT_IGNORE_PROCESSES
    vacate_grace_s: float = 30.0
    users: tuple[str, ...] = ()
    windows: tuple[str, ...] = ()
    max_utilization: float = 0.5
    idle_minutes: float = 5.0


@dataclass(frozen=True)
class JobsSection:
    unplaceable_after_s: float = 3600.0
    retention_s: float = 7 * 24 * 3600.0
    min_run_s: float = 120.0
    restart_start_s: float = 60.0
    restart_stop_s: float = 36.0
    max_queued_per_user: int = 50
    max_active_per_user: int = 100
    keep_finished_days: float = 30.0
    keep_unfetched_days: float = 90.0
    policy: str = "frenzy"


@dataclass(frozen=True)
class Config:
    node: NodeSection
    network: NetworkSection
    pool: PoolSection
    client: ClientSection
    web: WebSection
    devices: tuple[DeviceDecl, ...]
    timing: TimingSection
    launcher: LauncherSection
    owner: OwnerSection
    jobs: JobsSection = JobsSection()
    election: ElectionSection = ElectionSection()
    log: LogSection = LogSection()
    source: Path | None = None


# --- loading --------------------------------------------------------------------------------

_SECTIONS: Final = ("node", "network", "pool", "client", "web", "devices", "timing", "launcher", "owner",
                    "jobs", "election", "log")


class _Section:
    """Typed access to one TOML table, with errors naming ``section.key`` and what to write."""

    def __init__(self, name: str, table: Mapping[str, Any]) -> None:
        self.name = name
        self.table = table
        known = [k for s, k, _, _ in KEYS if s == name]
        for key in table:
            if key not in known:
                hint = get_close_matches(key, known, n=1)
                did = f"; did you mean {hint[0]!r}?" if hint else f"; known keys: {', '.join(known)}"
                raise ConfigError(f"unknown key [{name}] {key!r}{did}")

    def _bad(self, key: str, want: str) -> ConfigError:
        return ConfigError(f"[{self.name}] {key} = {self.table[key]!r}: expected {want}")

    def has(self, key: str) -> bool:
        return key in self.table

    def str_(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if key not in self.table:
            if required:
                raise ConfigError(f"[{self.name}] {key} is required (see the config reference in README)")
            return default
        v = self.table[key]
        if not isinstance(v, str) or not v.strip():
            raise self._bad(key, "a non-empty string")
        return v.strip()

    def int_(self, key: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        v = self.table.get(key, default)
        if isinstance(v, str):
            try:
                v = int(v)
            except ValueError:
                raise self._bad(key, "an integer") from None
        if not isinstance(v, int) or isinstance(v, bool):
            raise self._bad(key, "an integer")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise self._bad(key, f"an integer in [{lo}, {hi}]")
        return v

    def float_(
        self, key: str, default: float, lo: float = 0.0, hi: float | None = None, *, open_lo: bool = True
    ) -> float:
        v = self.table.get(key, default)
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                raise self._bad(key, "a number") from None
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise self._bad(key, "a number")
        v = float(v)
        if (v <= lo if open_lo else v < lo) or (hi is not None and v > hi):
            raise self._bad(
                key, f"a number {'>' if open_lo else '>='} {lo}" + (f" and <= {hi}" if hi else "")
            )
        return v

    def bool_(self, key: str, default: bool) -> bool:
        v = self.table.get(key, default)
        if isinstance(v, str) and v.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return v.lower() in ("1", "true", "yes", "on")
        if not isinstance(v, bool):
            raise self._bad(key, "true or false")
        return v

    def str_list(self, key: str) -> tuple[str, ...]:
        v = self.table.get(key, [])
        if isinstance(v, str):
            v = [p for p in (s.strip() for s in v.split(",")) if p]
        if not isinstance(v, list) or not all(isinstance(s, str) and s.strip() for s in v):
            raise self._bad(key, 'a list of strings, e.g. ["a", "b"]')
        return tuple(s.strip() for s in v)


LIVE_POLICIES = ("frenzy", "fifo", "srtf", "srtf-wide", "tiresias", "sia", "gavel")
"""``[jobs] policy`` values: the built-in policies of ``frenzyd.has.registry`` (a test keeps them equal)."""


def _policy_name(name: str) -> str:
    if name not in LIVE_POLICIES:
        raise ConfigError(f"[jobs] policy {name!r}: use one of {', '.join(LIVE_POLICIES)}")
    return name


ACCEPT: Final = ("any", "trainer-only")
"""``[launcher] accept`` values."""


def _accept(value: str) -> str:
    if value not in ACCEPT:
        raise ConfigError(f"[launcher] accept = {value!r}: use \"any\" (scripts and the built-in trainer) "
                          "or \"trainer-only\" (no foreign code on this machine)")
    return value


def _slot_prefix(value: str) -> str:
    allowed = set("abcdefghijklmnopqrstuvwxyz0123456789_-")
    if not (0 < len(value) <= 25 and set(value) <= allowed and value[0] not in "0123456789-"):
        raise ConfigError(f"[launcher] slot_prefix = {value!r}: a user name prefix of lowercase letters, "
                          "digits, '_' and '-' (at most 25), e.g. \"frenzy-slot\"")
    return value


def _path(base: Path, text: str) -> Path:
    if "\0" in text:  # Path.resolve() would raise ValueError("embedded null byte")
        raise ConfigError(f"path {text[:200]!r} holds a NUL character: write the path without it")
    p = Path(text).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def _is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def interface_ipv4(ifname: str) -> str | None:
    """The first IPv4 address of network interface ``ifname`` (Linux SIOCGIFADDR), or None."""
    import fcntl
    import socket
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(packed[20:24])


def _default_advertise(
    listen: HostPort, interfaces: tuple[str, ...], lookup: Callable[[str], str | None]
) -> str:
    if interfaces:
        first = lookup(interfaces[0])
        if first:
            return first
    if not _is_wildcard(listen.host):
        return listen.host
    import socket

    for _, name in socket.if_nameindex():
        addr = lookup(name)
        if addr and not ipaddress.ip_address(addr).is_loopback:
            return addr
    return "127.0.0.1"


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    for var, (section, key) in ENV_OVERRIDES.items():
        if var in env:
            table = raw.setdefault(section, {})
            if not isinstance(table, dict):
                raise ConfigError(f"[{section}] must be a table to apply {var}")
            table[key] = env[var]


def load_config(
    path: Path, env: Mapping[str, str] | None = None, *, ifaddr: Callable[[str], str | None] = interface_ipv4
) -> Config:
    """Read ``path`` (TOML), apply ``env`` overrides (``ENV_OVERRIDES``), validate, return a Config.

    ``env`` defaults to ``os.environ``.  Raises ConfigError with a message saying
    what to change.  ``ifaddr`` looks up an interface's IPv4 (injected for tests).
    """
    path = Path(path)
    env = os.environ if env is None else env
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found (see systemd/frenzyd.toml.example)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return config_from_dict(raw, env, base=path.resolve().parent, source=path, ifaddr=ifaddr)


def config_from_dict(
    raw: dict[str, Any],
    env: Mapping[str, str],
    *,
    base: Path,
    source: Path | None = None,
    ifaddr: Callable[[str], str | None] = interface_ipv4,
) -> Config:
    """Validate an already-parsed TOML document (``load_config`` minus the file read)."""
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for key in raw:
        if key not in _SECTIONS:
            hint = get_close_matches(key, _SECTIONS, n=1)
            raise ConfigError(f"unknown section [{key}]" + (f"; did you mean [{hint[0]}]?" if hint else ""))
    _apply_env(raw, env)
    tables = {}
    for name in _SECTIONS:
        if name == "devices":
            continue
        t = raw.get(name, {})
        if not isinstance(t, dict):
            raise ConfigError(f"[{name}] must be a table")
        tables[name] = _Section(name, t)

    n = tables["node"]
    node_name = n.str_("name", required=True) or ""
    if not NODE_NAME_RE.match(node_name):
        raise ConfigError(f"[node] name = {node_name!r}: use letters, digits, '.', '_' or '-' (e.g. 'ws-01')")
    data_dir = _path(base, n.str_("data_dir", required=True) or "")
    node = NodeSection(name=node_name, data_dir=data_dir, priority=n.int_("priority", 0, -(2**31), 2**31 - 1))

    w = tables["network"]
    listen = HostPort.parse(w.str_("listen", "0.0.0.0:7470") or "", "[network] listen")
    interfaces = w.str_list("interfaces")
    peers = tuple(HostPort.parse(p, "[network] peers entry") for p in w.str_list("peers"))
    advertise = w.str_("advertise")
    if advertise is None:
        advertise = _default_advertise(listen, interfaces, ifaddr)
    network = NetworkSection(
        listen=listen, interfaces=interfaces, peers=peers, mdns=w.bool_("mdns", True), advertise=advertise,
        handshake_timeout_s=w.float_("handshake_timeout_s", 5.0),
        max_unauthenticated=w.int_("max_unauthenticated", 256, 1, 1 << 20),
        max_unauthenticated_per_ip=w.int_("max_unauthenticated_per_ip", 16, 1, 1 << 20),
        frame_caps=_frame_caps(w),
        mdns_max_entries=w.int_("mdns_max_entries", 256, 1, 1 << 20),
        mdns_entry_ttl_s=w.float_("mdns_entry_ttl_s", 900.0),
        membership=_choice(w, "membership", ("mesh", "swim"), "swim"),
    )

    creds = tables["pool"].str_("credentials", required=True)
    pool = PoolSection(credentials=_path(base, creds or ""))

    client_listen = tables["client"].str_("listen") or f"unix:{data_dir / 'client.sock'}"
    if client_listen.startswith("unix:"):
        client_listen = f"unix:{_path(base, client_listen[5:])}"
    else:
        hp = HostPort.parse(client_listen, "[client] listen")
        if not _is_loopback(hp.host):
            raise ConfigError(
                f"[client] listen = {client_listen!r}: the client API binds to loopback only "
                "(127.0.0.1:PORT) or a unix socket (unix:/run/frenzy/client.sock)"
            )
    admin_group = tables["client"].str_("admin_group", "frenzy-admin") or ""
    if len(admin_group) > 32 or admin_group[0] in "-." or not all(c.isalnum() or c in "_.-"
                                                                  for c in admin_group):
        raise ConfigError(f"[client] admin_group = {admin_group!r}: give a local group name "
                          "(e.g. 'frenzy-admin')")
    client = ClientSection(listen=client_listen, admin_group=admin_group)

    wb = tables["web"]
    web = WebSection(
        listen=HostPort.parse(wb.str_("listen", "127.0.0.1:7480") or "", "[web] listen"),
        idle_timeout_s=wb.float_("idle_timeout_s", 15.0),
        max_connections=wb.int_("max_connections", 64, 1, 1 << 20),
    )
    election = ElectionSection(max_term_jump=tables["election"].int_("max_term_jump", 1000, 1, 1 << 40))
    log = LogSection(format=_choice(tables["log"], "format", ("text", "json"), "text"),
                     level=_choice(tables["log"], "level", ("debug", "info", "warning", "error"), "info"))

    devices = _devices(raw.get("devices", []))

    t = tables["timing"]
    hb = t.float_("heartbeat_s", 1.0)
    pt = t.float_("peer_timeout_s", 4.0)
    if pt < 2 * hb:
        raise ConfigError(
            f"[timing] peer_timeout_s = {pt} must be at least twice heartbeat_s = {hb}, "
            "or one late heartbeat declares a live peer dead"
        )
    timing = TimingSection(
        heartbeat_s=hb,
        peer_timeout_s=pt,
        election_grace_s=t.float_("election_grace_s", pt, open_lo=False),
        request_timeout_s=t.float_("request_timeout_s", 5.0),
        lease_timeout_s=t.float_("lease_timeout_s", 30.0),
        shutdown_deadline_s=t.float_("shutdown_deadline_s", 25.0),
        inventory_refresh_s=t.float_("inventory_refresh_s", 2.0),
    )

    la = tables["launcher"]
    ports = la.table.get("rendezvous_ports", [29400, 29499])
    if (
        not isinstance(ports, list)
        or len(ports) != 2
        or not all(isinstance(p, int) and not isinstance(p, bool) and 1024 <= p <= 65535 for p in ports)
        or ports[0] > ports[1]
    ):
        raise ConfigError(
            f"[launcher] rendezvous_ports = {ports!r}: expected [LOW, HIGH] with "
            "1024 <= LOW <= HIGH <= 65535, e.g. [29400, 29499]"
        )
    max_data = la.int_("max_data_bytes", 4 * 1024**3, 1)
    launcher = LauncherSection(
        run_as=la.str_("run_as"),
        # One cap moves every payload, a trainer job's data file included (tar/gzip adds < 16 MiB to it).
        max_payload_bytes=max(la.int_("max_payload_bytes", 256 * 1024 * 1024, 1),
                              max_data + DATA_SLACK_BYTES),
        max_data_bytes=max_data,
        max_result_bytes=la.int_("max_result_bytes", 64 * 1024 * 1024, 1),
        rendezvous_ports=(ports[0], ports[1]),
        term_grace_s=la.float_("stop_grace_s", la.float_("term_grace_s", 10.0)),
        env_allow=la.str_list("env_allow"),
        accept=_accept(la.str_("accept", "any") or "any"),
        slots=la.bool_("slots", True),
        slot_prefix=_slot_prefix(la.str_("slot_prefix", "frenzy-slot") or "frenzy-slot"),
        execute_dir=_path(base, ex) if (ex := la.str_("execute_dir")) else None,
        cgroups=la.bool_("cgroups", True),
        rank_log_bytes=la.int_("rank_log_bytes", 16 * 1024 * 1024, 0, 1 << 40),
        rank_log_keep=la.int_("rank_log_keep", 2, 0, 100),
        rank_log_retention_s=la.float_("rank_log_retention_s", 7 * 24 * 3600.0),
    )
    if timing.shutdown_deadline_s < launcher.term_grace_s + 5:
        raise ConfigError(
            f"[timing] shutdown_deadline_s = {timing.shutdown_deadline_s} must be at least "
            f"[launcher] stop_grace_s + 5 = {launcher.term_grace_s + 5}: on shutdown the ranks get their "
            "whole grace to checkpoint before the daemon reports them"
        )

    o = tables["owner"]
    owner = OwnerSection(
        min_free_fraction=o.float_("min_free_fraction", 0.5, 0.0, 1.0, open_lo=False),
        protect_foreign_processes=o.bool_("protect_foreign_processes", True),
        ignore_processes=o.str_list("ignore_processes") if o.has("ignore_processes")
        else DEFAULT_IGNORE_PROCESSES,
        vacate_grace_s=o.float_("vacate_grace_s", 30.0),
        users=o.str_list("users"),
        windows=o.str_list("windows"),  # parsed (fix-it errors) by frenzyd.node.owner at start
        max_utilization=o.float_("max_utilization", 0.5, 0.0, 1.0, open_lo=False),
        idle_minutes=o.float_("idle_minutes", 5.0, open_lo=False),
    )
    jb = tables["jobs"]
    jobs = JobsSection(
        unplaceable_after_s=jb.float_("unplaceable_after_s", 3600.0),
        retention_s=jb.float_("retention_s", 7 * 24 * 3600.0),
        min_run_s=jb.float_("min_run_s", 120.0),
        restart_start_s=jb.float_("restart_start_s", 60.0, 0.0, 86400.0, open_lo=False),
        restart_stop_s=jb.float_("restart_stop_s", 36.0, 0.0, 86400.0, open_lo=False),
        max_queued_per_user=jb.int_("max_queued_per_user", 50, 0, 1 << 20),
        max_active_per_user=jb.int_("max_active_per_user", 100, 0, 1 << 20),
        keep_finished_days=jb.float_("keep_finished_days", 30.0, 0.0, 36500.0, open_lo=False),
        keep_unfetched_days=jb.float_("keep_unfetched_days", 90.0, 0.0, 36500.0, open_lo=False),
        policy=_policy_name(jb.str_("policy", "frenzy") or "frenzy"),
    )
    return Config(
        node=node,
        network=network,
        pool=pool,
        client=client,
        web=web,
        devices=devices,
        timing=timing,
        launcher=launcher,
        owner=owner,
        jobs=jobs,
        election=election,
        log=log,
        source=source,
    )


def _choice(section: _Section, key: str, allowed: tuple[str, ...], default: str) -> str:
    value = section.str_(key, default) or default
    if value not in allowed:
        raise ConfigError(f"[{section.name}] {key} = {value!r}: expected one of "
                          + ", ".join(f'"{a}"' for a in allowed))
    return value


def _frame_caps(section: _Section) -> tuple[tuple[str, int], ...]:
    """``[network] frame_caps``: a table of message kind -> bytes (1 KiB .. 4 MiB)."""
    from frenzyd.net.wire import DEFAULT_MAX

    table = section.table.get("frame_caps", {})
    if not isinstance(table, dict):
        raise ConfigError(f"[network] frame_caps = {table!r}: expected a table, e.g. {{heartbeat = 2097152}}")
    out = []
    for kind, cap in sorted(table.items()):
        if not isinstance(cap, int) or isinstance(cap, bool) or not 1024 <= cap <= DEFAULT_MAX:
            raise ConfigError(
                f"[network] frame_caps.{kind} = {cap!r}: expected a number of bytes in [1024, {DEFAULT_MAX}]"
            )
        out.append((kind, cap))
    return tuple(out)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _devices(value: Any) -> tuple[DeviceDecl, ...]:
    if not isinstance(value, list):
        raise ConfigError(
            "devices must be an array of tables: write [[devices]] with type = ... and count = ..."
        )
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise ConfigError(f"[[devices]] entry {i + 1} must be a table with type and count")
        s = _Section("devices", entry)
        typ = s.str_("type", required=True)
        assert typ is not None
        count = s.int_("count", 1, 1, 1024)
        mem: float | None = s.float_("memory_gib", 1.0) if s.has("memory_gib") else None
        if typ not in GPU_TYPES and mem is None:
            hint = get_close_matches(typ, list(GPU_TYPES), n=1)
            raise ConfigError(
                f"[[devices]] type = {typ!r} is not a canonical GPU type"
                + (f" (did you mean {hint[0]!r}?)" if hint else f" ({', '.join(GPU_TYPES)})")
                + "; for another type also give memory_gib"
            )
        out.append(DeviceDecl(type=typ, count=count, memory_gib=mem))
    return tuple(out)


CONFIG_REFERENCE: Final = _render_reference()
"""Markdown table of every key, its default and meaning (for the README)."""
