"""The checks of ``frenzy-client doctor``: each looks at one thing, says what is wrong and the fix.

Every check returns :class:`Finding` values (``ok``, ``warn``, ``fail`` or ``skip``); nothing here
raises for what it finds.  The checks read the node's config and credentials, its interfaces, the
network (an mDNS browse, TCP connects to static peers and the node's own ports) and the daemon's
status JSON (``GET /api/v1/status`` on the web port, read-only, or ``--daemon``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import json
import shutil
import socket
import struct
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from frenzyd.config import Config, interface_ipv4, load_config
from frenzyd.errors import AuthError, ConfigError, FrenzyError
from frenzyd.net import auth

MDNS_GROUP: Final = "224.0.0.251"
SKEW_WARN_S: Final = 1.0
SKEW_FAIL_S: Final = 30.0
CERT_WARN_DAYS: Final = 30
DISK_WARN_BYTES: Final = 10 * 1024**3
DISK_FAIL_BYTES: Final = 1024**3
CONNECT_TIMEOUT_S: Final = 2.0
TIME_SYNC_FIX: Final = ("turn on time sync on every node: timedatectl set-ntp true (systemd-timesyncd or "
                        "chrony)")
MULTICAST_FIX: Final = ("let mDNS through between the nodes (UDP 5353 to 224.0.0.251: the switch's IGMP "
                        "snooping, a firewall, a Wi-Fi 'client isolation'), or list the peers in "
                        "[network] peers")


@dataclass(frozen=True)
class Finding:
    """One check's verdict; ``fix`` says what to do when it is not ``ok``."""

    area: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def ok(area: str, detail: str) -> Finding:
    return Finding(area, "ok", detail)


def warn(area: str, detail: str, fix: str) -> Finding:
    return Finding(area, "warn", detail, fix)


def fail(area: str, detail: str, fix: str) -> Finding:
    return Finding(area, "fail", detail, fix)


def skip(area: str, detail: str) -> Finding:
    return Finding(area, "skip", detail)


# --- config and credentials ------------------------------------------------------------------------


def check_config(path: Path) -> tuple[Config | None, list[Finding]]:
    try:
        cfg = load_config(path)
    except ConfigError as exc:
        return None, [fail("config", str(exc), f"fix {path}, or pass --config FILE (scripts/install writes "
                                               "/etc/frenzy/frenzyd.toml)")]
    return cfg, [ok("config", f"{path}: node {cfg.node.name}, data in {cfg.node.data_dir}")]


def check_certificate(cred_dir: Path, node_name: str, now: dt.datetime) -> list[Finding]:
    """Validity dates, the key matching the certificate, the pool id, the enrolled name."""
    files: dict[str, bytes] = {}
    for f in (auth.CA_FILE, auth.NODE_CERT_FILE, auth.NODE_KEY_FILE):
        try:
            files[f] = (cred_dir / f).read_bytes()
        except FileNotFoundError:
            return [fail("certificate", f"{cred_dir / f} is missing",
                         "enrol the node: frenzy-client pool add-node POOL NAME --bundle FILE (admin), then "
                         "sudo frenzyd enroll FILE here")]
        except PermissionError:
            return [skip("certificate", f"cannot read {cred_dir / f}: run doctor as root or as the "
                         "daemon's user")]
    enrol_again = (f"enrol it again: frenzy-client pool add-node POOL {node_name} --bundle FILE on the "
                   "admin's machine, then here: sudo frenzyd enroll FILE --force; systemctl restart frenzyd")
    try:
        node_id, name = auth.verify_node_cert(files[auth.CA_FILE], files[auth.NODE_CERT_FILE])
        pool_id = auth.pool_id_of(files[auth.CA_FILE])
        not_before, not_after = auth.certificate_dates(files[auth.NODE_CERT_FILE])
        matches = auth.key_matches_cert(files[auth.NODE_KEY_FILE], files[auth.NODE_CERT_FILE])
    except AuthError as exc:
        return [fail("certificate", f"{cred_dir}: {exc}", enrol_again)]
    out: list[Finding] = []
    if not matches:
        out.append(fail("certificate", f"{cred_dir / auth.NODE_KEY_FILE} is not the key of "
                        f"{cred_dir / auth.NODE_CERT_FILE}", enrol_again))
    left = not_after - now
    where = f"node {name} ({node_id[:12]}) of pool {pool_id[:16]}"
    if now > not_after:
        out.append(fail("certificate", f"{where}: the certificate expired on {not_after:%Y-%m-%d %H:%M} UTC; "
                        "peers refuse it", enrol_again))
    elif now < not_before:
        out.append(fail("certificate", f"{where}: the certificate is valid only from "
                        f"{not_before:%Y-%m-%d %H:%M} UTC (is this clock wrong?)", TIME_SYNC_FIX))
    elif left < dt.timedelta(days=CERT_WARN_DAYS):
        out.append(warn("certificate", f"{where}: the certificate expires in {left.days} day(s), on "
                        f"{not_after:%Y-%m-%d}", enrol_again))
    else:
        out.append(ok("certificate", f"{where}: valid until {not_after:%Y-%m-%d}"))
    if name != node_name:
        out.append(warn("certificate", f"the certificate names the node {name!r} but [node] name is "
                        f"{node_name!r}", f"set [node] name = \"{name}\" (peers know it by its certificate)"))
    return out


# --- interfaces and multicast ----------------------------------------------------------------------

IFF_UP: Final = 0x1
IFF_MULTICAST: Final = 0x1000


def _interface_flags(name: str) -> int | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8913, struct.pack("256s", name.encode()[:15]))  # SIOCGIFFLAGS
    except OSError:
        return None
    return int(struct.unpack_from("H", packed, 16)[0])


def check_interfaces(cfg: Config) -> tuple[list[str], list[Finding]]:
    """Each configured interface exists, is up, has IPv4 and multicast, and can join the mDNS group.
    Returns the IPv4 addresses of the interfaces that passed."""
    names = list(cfg.network.interfaces)
    out: list[Finding] = []
    if not names:
        out.append(ok("interfaces", "[network] interfaces is empty: mDNS and rendezvous use every interface"))
        return [], out
    good: list[str] = []
    have = ", ".join(n for _, n in socket.if_nameindex())
    for name in names:
        flags = _interface_flags(name)
        if flags is None:
            out.append(fail("interfaces", f"{name}: no such interface (this host has {have})",
                            "set [network] interfaces to the LAN interface (ip -br addr)"))
            continue
        addr = interface_ipv4(name)
        if not flags & IFF_UP:
            out.append(fail("interfaces", f"{name} is down", f"ip link set {name} up (or fix its network "
                            "config)"))
            continue
        if addr is None:
            out.append(fail("interfaces", f"{name} has no IPv4 address", "give it one (DHCP), or choose "
                            "another interface in [network] interfaces"))
            continue
        if not flags & IFF_MULTICAST and cfg.network.mdns:
            out.append(fail("multicast", f"{name} ({addr}) has multicast off",
                            f"ip link set {name} multicast on, or set mdns = false and list [network] peers"))
            continue
        if cfg.network.mdns:
            err = _join_mdns(addr)
            if err:
                out.append(fail("multicast", f"cannot join {MDNS_GROUP} on {name} ({addr}): {err}",
                                f"check `ip maddr show {name}` and the firewall, or set mdns = false and "
                                "list [network] peers"))
                continue
        joined = f", joined {MDNS_GROUP}" if cfg.network.mdns else ""
        out.append(ok("interfaces", f"{name}: up, {addr}{joined}"))
        good.append(addr)
    return good, out


def _join_mdns(addr: str) -> str:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP) as s:
            mreq = socket.inet_aton(MDNS_GROUP) + socket.inet_aton(addr)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    except OSError as exc:
        return exc.strerror or str(exc)
    return ""


def browse_mdns(cfg: Config, seconds: float) -> list[tuple[str, dict[str, str]]] | str:
    """Frenzy services answering mDNS on the configured interfaces, or why the browse failed."""
    from frenzyd.net.discovery import browse

    try:
        return asyncio.run(browse(cfg, seconds))
    except FrenzyError as exc:
        return str(exc)


# --- the daemon's view --------------------------------------------------------------------------


def fetch_status(url: str, timeout: float = 5.0) -> dict[str, Any] | str:
    """The daemon's status JSON from ``url``, or why it could not be read."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            data = json.loads(r.read(64 << 20))
    except (OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))
    return data if isinstance(data, dict) else "the answer is not a JSON object"


def check_peers(cfg: Config, status: Mapping[str, Any], mdns: list[tuple[str, dict[str, str]]] | str | None,
                pool_id: str | None) -> list[Finding]:
    """Peers the daemon sees, how it found them, and whether multicast reaches them."""
    out: list[Finding] = []
    me = (status.get("node") or {}).get("id")
    peers = [p for p in status.get("peers") or () if isinstance(p, dict) and p.get("id") != me]
    alive = [p for p in peers if p.get("alive")]
    coord = status.get("coordinator")
    if coord:
        out.append(ok("pool", f"{len(alive) + 1} node(s) live, coordinator {coord.get('name')} (term "
                      f"{coord.get('term')})"))
    else:
        out.append(warn("pool", "no coordinator yet (alone, or the election is still running)",
                        "wait a few heartbeats; if it stays, the peers cannot reach each other (see below)"))
    for p in peers:
        if not p.get("alive"):
            out.append(warn("peers", f"{p.get('name')} at {p.get('address')} was seen but is silent now",
                            "is its frenzyd running? (systemctl status frenzyd on it; frenzy-client doctor "
                            "there)"))
    if not cfg.network.mdns:
        out.append(skip("mdns", "mdns = false: peers come only from [network] peers"))
    elif isinstance(mdns, str):
        out.append(fail("mdns", f"cannot browse mDNS: {mdns}", MULTICAST_FIX))
    elif mdns is not None:
        answered = {hints.get("id") for _, hints in mdns}
        foreign = sorted({addr for addr, hints in mdns
                          if pool_id and hints.get("pool") not in (None, pool_id)})
        if foreign:
            out.append(warn("mdns", f"nodes of another pool answer mDNS here: {', '.join(foreign)}",
                            "nothing to do unless they should be in this pool (enrol them with this CA)"))
        for p in alive:
            via = ", ".join(p.get("seen_by") or ()) or "?"
            who = f"{p.get('name')} ({p.get('address')})"
            if p.get("id") in answered:
                out.append(ok("mdns", f"{who} answers mDNS (the daemon found it by {via})"))
            else:
                out.append(fail("multicast", f"{who} is live (found by {via}) but did not answer mDNS: "
                                "multicast does not pass between this node and it", MULTICAST_FIX))
        if not alive and not mdns:
            out.append(warn("mdns", "no Frenzy node answered mDNS", MULTICAST_FIX))
    return out


def check_static_peers(cfg: Config, connect: Callable[[str, int], str] | None = None) -> list[Finding]:
    """Each ``[network] peers`` entry accepts a TCP connection."""
    connect = connect or tcp_connect
    out = []
    for hp in cfg.network.peers:
        err = connect(hp.host, hp.port)
        if err:
            out.append(fail("ports", f"static peer {hp.host}:{hp.port}: {err}",
                            f"is frenzyd running there, and is TCP {hp.port} open between the nodes "
                            "(firewall: README, Ports)?"))
        else:
            out.append(ok("ports", f"static peer {hp.host}:{hp.port} accepts connections"))
    return out


def tcp_connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return ""
    except OSError as exc:
        return exc.strerror or str(exc)


def check_own_ports(cfg: Config, daemon_up: bool) -> list[Finding]:
    """The node's peer port answers on the address peers dial (``advertise``)."""
    if not daemon_up:
        return [skip("ports", "the daemon is not running: its ports were not tried")]
    host = cfg.network.advertise or cfg.network.listen.host
    err = tcp_connect(host, cfg.network.listen.port)
    if err:
        return [fail("ports", f"this node's peer port {host}:{cfg.network.listen.port}: {err}",
                     f"[network] listen = {cfg.network.listen.host}:{cfg.network.listen.port} must be "
                     "reachable at [network] advertise; open the port in the firewall")]
    return [ok("ports", f"peer port {host}:{cfg.network.listen.port} accepts connections")]


def check_clocks(status: Mapping[str, Any]) -> list[Finding]:
    """Clock offsets of the live peers as this daemon measured them (their heartbeats' ``time``)."""
    me = (status.get("node") or {}).get("id")
    out: list[Finding] = []
    for p in status.get("peers") or ():
        if not isinstance(p, dict) or p.get("id") == me or not p.get("alive"):
            continue
        off = p.get("clock_offset_s")
        if not isinstance(off, int | float):
            out.append(skip("clock", f"{p.get('name')} does not report its time (an older Frenzy)"))
        elif abs(off) > SKEW_FAIL_S:
            out.append(fail("clock", f"{p.get('name')}'s clock is {off:+.1f} s from this one's "
                            "(certificates and job times go wrong)", TIME_SYNC_FIX))
        elif abs(off) > SKEW_WARN_S:
            out.append(warn("clock", f"{p.get('name')}'s clock is {off:+.1f} s from this one's",
                            TIME_SYNC_FIX))
        else:
            out.append(ok("clock", f"{p.get('name')}: {off:+.3f} s"))
    return out


def check_gpus(status: Mapping[str, Any]) -> list[Finding]:
    """Where this node's GPUs come from (NVML or declared devices) and which are not offered."""
    node = status.get("node") or {}
    backend = node.get("gpu_backend") or {}
    mine = next((p for p in status.get("peers") or ()
                 if isinstance(p, dict) and p.get("id") == node.get("id")), {})
    gpus = [g for g in mine.get("gpus") or () if isinstance(g, dict)]
    out: list[Finding] = []
    note = backend.get("note") or ""
    if backend.get("kind") == "nvml":
        out.append(ok("gpus", note or f"NVML: {len(gpus)} GPU(s)"))
    elif backend:
        out.append(warn("gpus", f"no real GPU in use ({note or 'NVML unavailable'}); offering "
                        f"{len(gpus)} declared simulated device(s)",
                        "on a GPU workstation: fix what the note says (frenzyd/node/README.md lists every "
                        "NVML failure); elsewhere nothing to do"))
    for g in gpus:
        if g.get("offered") is False:
            out.append(warn("gpus", f"GPU {g.get('index')} ({g.get('type')}) is not offered: "
                            f"{g.get('reason')}", "see frenzyd/node/README.md (reasons)"))
    return out


def check_disk(data_dir: Path) -> list[Finding]:
    p = data_dir
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
    except OSError as exc:
        return [skip("disk", f"cannot stat {p}: {exc}")]
    gib = free / 1024**3
    if free < DISK_FAIL_BYTES:
        return [fail("disk", f"{gib:.1f} GiB free under {data_dir}: jobs' directories and checkpoints "
                     "will not fit", "free space, or move [node] data_dir to a larger disk")]
    if free < DISK_WARN_BYTES:
        return [warn("disk", f"only {gib:.1f} GiB free under {data_dir}",
                     "free space, or move [node] data_dir to a larger disk")]
    return [ok("disk", f"{gib:.0f} GiB free under {data_dir}")]


# --- all of it ----------------------------------------------------------------------------------


def run_checks(config_path: Path, *, status_url: str | None = None, mdns_seconds: float = 3.0,
               now: dt.datetime | None = None) -> list[Finding]:
    """Every check, in the order a person would fix things."""
    now = now or dt.datetime.now(dt.UTC)
    cfg, out = check_config(config_path)
    if cfg is None:
        return out
    out += check_certificate(cfg.pool.credentials, cfg.node.name, now)
    pool_id = None
    with contextlib.suppress(OSError, AuthError):
        pool_id = auth.pool_id_of((cfg.pool.credentials / auth.CA_FILE).read_bytes())
    _, found = check_interfaces(cfg)
    out += found
    out += check_disk(cfg.node.data_dir)
    url = status_url or f"http://{_dial_host(cfg.web.listen.host)}:{cfg.web.listen.port}/api/v1/status"
    status = fetch_status(url)
    if isinstance(status, str):
        out.append(fail("daemon", f"no status from {url}: {status}",
                        "start it: systemctl start frenzyd (logs: journalctl -u frenzyd); or pass "
                        "--status-url"))
        out += check_static_peers(cfg)
        return out
    out.append(ok("daemon", f"{url}: node {status.get('node', {}).get('name')}"))
    mdns = browse_mdns(cfg, mdns_seconds) if cfg.network.mdns else None
    out += check_peers(cfg, status, mdns, pool_id)
    out += check_static_peers(cfg)
    out += check_own_ports(cfg, daemon_up=True)
    out += check_clocks(status)
    out += check_gpus(status)
    return out


def _dial_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host  # a wildcard: dial it locally
