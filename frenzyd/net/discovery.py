"""mDNS discovery: announce this node as ``_frenzy._tcp.local.`` and feed peers' addresses to a callback.

TXT records carry hints only (``id`` node id, ``pool`` pool id = CA fingerprint,
``api`` peer API port, ``proto`` wire protocol version); mDNS is unauthenticated,
so a discovered peer is just an address until it proves pool membership over TLS
(``frenzyd.net.transport``).  Liveness never comes from here: zeroconf caches records for
long and does not notice a crashed peer.  Malformed announcements are dropped and
counted (``dropped`` by reason).

Only services of this node's pool are remembered (``[network] mdns_max_entries`` of them, the
least recently announced evicted first, each forgotten ``mdns_entry_ttl_s`` after its last
announcement); another pool's are counted and dropped.  An announcement whose records zeroconf
already holds is handled at once, without a lookup; lookups in flight are capped, and a name
that finds them all busy waits in a bounded queue for the next free one.  So a host that floods
the LAN with forged pool ids neither grows memory nor keeps a new member from being found.

A node that has no live peer (``lonely()``) announces itself again and browses afresh, after 5 s,
then at doubling intervals up to a minute while it stays alone.  zeroconf sends a new service's
announcements a few times at start and its browser backs its queries off towards an hour: when
40 daemons start together on a loaded host some multicast is dropped, and a node whose announcements
and queries were both lost was found by nobody and found nobody for as long as a bench waited.
This is the only module that imports zeroconf.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import re
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from zeroconf import (
    BadTypeInNameException,
    InterfaceChoice,
    IPVersion,
    NonUniqueNameException,
    ServiceStateChange,
    Zeroconf,
)
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from frenzyd.config import Config, interface_ipv4
from frenzyd.errors import FrenzyError
from frenzyd.net import wire
from frenzyd.net.auth import Credentials
from frenzyd.net.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

SERVICE_TYPE = "_frenzy._tcp.local."
MAX_LOOKUPS = 32
"""Lookups (zeroconf queries for a service's records) in flight at once."""
MAX_WAITING = 1024
"""Names waiting for a free lookup; past this the oldest waiting name is dropped."""
LOOKUP_TIMEOUT_MS = 3000
REFRESH_FIRST_S = 5.0
"""A lonely node's first re-announcement and fresh browse comes this long after start (jittered)."""
REFRESH_MAX_S = 60.0
"""The interval doubles while the node stays lonely, up to this."""

_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

OnFound = Callable[[str, dict[str, str]], None]


class DiscoveryError(FrenzyError):
    """mDNS could not start (no usable interface, socket errors)."""


def txt_hints(creds: Credentials, port: int) -> dict[str, str]:
    """The TXT record this node announces (each entry well under 255 bytes)."""
    return {"id": creds.node_id, "pool": creds.pool_id, "api": str(port), "proto": str(wire.PROTOCOL_VERSION)}


def parse_hints(properties: dict[bytes, bytes | None]) -> dict[str, str]:
    """Validate a TXT record from the network; raise ValueError naming what is wrong."""
    out: dict[str, str] = {}
    for k, v in properties.items():
        if v is None:
            continue
        try:
            out[k.decode("ascii")] = v.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError("non-ASCII TXT entry") from None
    if not _HEX32.match(out.get("id", "")):
        raise ValueError("no valid node id")
    if not _HEX64.match(out.get("pool", "")):
        raise ValueError("no valid pool id")
    if not out.get("api", "").isdigit() or not 0 < int(out["api"]) < 65536:
        raise ValueError("no valid api port")
    return {k: out[k] for k in ("id", "pool", "api", "proto") if k in out}


def _interface_addresses(config: Config) -> list[str]:
    """IPv4 addresses to bind mDNS to: the configured interfaces (names or literal IPs)."""
    addrs: list[str] = []
    for name in config.network.interfaces:
        try:
            addrs.append(str(ipaddress.IPv4Address(name)))
            continue
        except ValueError:
            pass
        addr = interface_ipv4(name)
        if addr is None:
            raise DiscoveryError(
                f"[network] interfaces: {name!r} has no IPv4 address (check `ip addr`, or set mdns = false "
                "and list static peers)"
            )
        addrs.append(addr)
    return addrs


class Discovery:
    """Announce this node and browse for peers with python-zeroconf (AsyncZeroconf)."""

    def __init__(
        self,
        config: Config,
        creds: Credentials,
        port: int,
        on_found: OnFound,
        *,
        lonely: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.creds = creds
        self.port = port
        self.on_found = on_found
        self.found: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.max_entries = config.network.mdns_max_entries
        self.entry_ttl_s = config.network.mdns_entry_ttl_s
        self._clock = clock
        self._azc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._announcing: object = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._seen: OrderedDict[str, tuple[tuple[str, ...], float]] = OrderedDict()
        """Services of this pool: name -> (addresses and port, when it is forgotten)."""
        self._ratelog = RateLimitedLog(log)
        self.instance_name = f"{creds.node_name[:50]}-{creds.node_id[:8]}.{SERVICE_TYPE}"
        self._lonely = lonely
        self._refresher: asyncio.Task[None] | None = None
        self.refreshes = 0
        """Re-announcements and fresh browses made because the node was lonely."""

    async def start(self) -> None:
        """Register this node's service and start browsing."""
        ifaces = _interface_addresses(self.config)
        try:
            self._azc = AsyncZeroconf(interfaces=ifaces or InterfaceChoice.All, ip_version=IPVersion.V4Only)
        except OSError as exc:
            raise DiscoveryError(f"cannot open mDNS sockets on {ifaces or 'all interfaces'}: {exc}") from exc
        adv = self.config.network.advertise or "127.0.0.1"
        addresses = [socket.inet_aton(a) for a in dict.fromkeys([adv, *ifaces]) if _is_ipv4(a)]
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            self.instance_name,
            port=self.port,
            properties=txt_hints(self.creds, self.port),
            addresses=addresses,
            server=f"{self.creds.node_name[:50]}-{self.creds.node_id[:8]}.local.",
        )
        try:
            # The returned awaitable finishes when the announcements are sent; zeroconf owns it.
            self._announcing = await self._azc.async_register_service(self._info, allow_name_change=True)
        except (NonUniqueNameException, BadTypeInNameException, OSError) as exc:
            await self._azc.async_close()
            self._azc = None
            raise DiscoveryError(f"cannot announce {self.instance_name}: {exc}") from exc
        self._browser = AsyncServiceBrowser(self._azc.zeroconf, SERVICE_TYPE, handlers=[self._on_change])
        if self._lonely is not None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_while_lonely(),
                                                                     name="mdns-refresh")
        log.info("mDNS: announcing %s on %s", self.instance_name, ifaces or "all interfaces")

    async def _refresh_while_lonely(self) -> None:
        assert self._lonely is not None
        delay = REFRESH_FIRST_S
        while True:
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            if not self._lonely():
                delay = REFRESH_FIRST_S
                continue
            await self.refresh()
            delay = min(2 * delay, REFRESH_MAX_S)

    async def refresh(self) -> None:
        """Announce this node again and browse afresh (every service of the pool is reported to
        ``on_found`` again, as it answers the new browser's query)."""
        if self._azc is None or self._info is None:
            return
        self.refreshes += 1
        log.info("mDNS: no live peer; announcing %s again and browsing afresh", self.instance_name)
        self._announcing = await self._azc.async_update_service(self._info)
        self._seen.clear()
        old, self._browser = self._browser, AsyncServiceBrowser(self._azc.zeroconf, SERVICE_TYPE,
                                                                handlers=[self._on_change])
        if old is not None:
            await old.async_cancel()

    async def stop(self) -> None:
        """Unregister, stop browsing and close the sockets (idempotent)."""
        self._waiting.clear()
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._browser is not None:
            await self._browser.async_cancel()
            self._browser = None
        if self._azc is not None:
            try:
                await self._azc.async_unregister_all_services()
            finally:
                await self._azc.async_close()
            self._azc = None

    @property
    def tracked(self) -> int:
        """Services remembered now (all of this pool)."""
        return len(self._seen)

    def _on_change(
        self, zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange
    ) -> None:
        # Called by zeroconf on its loop; never raise back into it.
        if state_change not in (ServiceStateChange.Added, ServiceStateChange.Updated):
            return
        if name == self.instance_name:
            return
        info = AsyncServiceInfo(service_type, name)
        if info.load_from_cache(zeroconf):  # the announcement carried its records: no lookup
            self._take(name, info)
            return
        self._lookup(zeroconf, service_type, name)

    def _lookup(self, zeroconf: Zeroconf, service_type: str, name: str) -> None:
        if len(self._tasks) >= MAX_LOOKUPS:
            self.dropped["busy"] += 1
            self._waiting[(service_type, name)] = None
            self._waiting.move_to_end((service_type, name))
            while len(self._waiting) > MAX_WAITING:
                self._waiting.popitem(last=False)
                self.dropped["too_many_waiting"] += 1
            return
        task = asyncio.get_running_loop().create_task(self._resolve(zeroconf, service_type, name))
        self._tasks.add(task)
        task.add_done_callback(lambda t: self._lookup_done(zeroconf, t))

    def _lookup_done(self, zeroconf: Zeroconf, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._waiting and self._azc is not None:
            (service_type, name), _ = self._waiting.popitem(last=False)
            self._lookup(zeroconf, service_type, name)

    async def _resolve(self, zeroconf: Zeroconf, service_type: str, name: str) -> None:
        try:
            info = AsyncServiceInfo(service_type, name)
            if not await info.async_request(zeroconf, LOOKUP_TIMEOUT_MS):
                self.dropped["no_answer"] += 1
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # zeroconf decode paths: an announcement must not break the browser
            self.dropped["lookup_failed"] += 1
            log.debug("mDNS: lookup of %s failed: %s", name, exc)
            return
        self._take(name, info)

    def _take(self, name: str, info: AsyncServiceInfo) -> None:
        """An announcement with its records: remember it when it is of this pool, tell ``on_found``
        when it is new or moved."""
        try:
            hints = parse_hints(dict(info.properties or {}))
            port = info.port
            addrs = tuple(a for a in info.parsed_addresses(IPVersion.V4Only) if _is_ipv4(a))
        except ValueError as exc:
            self.dropped["bad_txt"] += 1
            self._ratelog.warning("bad_txt", "mDNS: ignoring the announcement of %s: %s", name[:80], exc)
            return
        if hints["id"] == self.creds.node_id:
            return
        if hints["pool"] != self.creds.pool_id:  # another pool (or a forgery): never tracked
            self.found["other_pool"] += 1
            self.dropped["other_pool"] += 1
            self._seen.pop(name, None)
            return
        if not port or not addrs:
            self.dropped["no_address"] += 1
            return
        now = self._clock()
        key = (*addrs, str(port))
        old = self._seen.pop(name, None)
        self._expire(now)
        self._seen[name] = (key, now + self.entry_ttl_s)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)  # the least recently announced
            self.dropped["evicted"] += 1
        if old is not None and old[0] == key and old[1] > now:
            return
        for a in addrs:
            self.found["same_pool"] += 1
            try:
                self.on_found(f"{a}:{port}", dict(hints))
            except Exception:
                log.exception("discovery callback failed for %s", name)

    def _expire(self, now: float) -> None:
        while self._seen:
            name, (_, until) = next(iter(self._seen.items()))
            if until > now:
                return
            del self._seen[name]


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


async def browse(config: Config, seconds: float) -> list[tuple[str, dict[str, str]]]:
    """Listen for ``seconds`` on the configured interfaces and return every Frenzy service that
    answers: ``(address:port, hints)``, any pool (``frenzy-client doctor``: who multicast reaches).

    A service whose TXT record is malformed is returned with ``{"error": why}`` as its hints.
    Raises :class:`DiscoveryError` when the mDNS sockets cannot be opened.
    """
    ifaces = _interface_addresses(config)
    try:
        azc = AsyncZeroconf(interfaces=ifaces or InterfaceChoice.All, ip_version=IPVersion.V4Only)
    except OSError as exc:
        raise DiscoveryError(f"cannot open mDNS sockets on {ifaces or 'all interfaces'}: {exc}") from exc
    names: set[str] = set()

    def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        names.add(name)

    found: list[tuple[str, dict[str, str]]] = []
    browser = AsyncServiceBrowser(azc.zeroconf, SERVICE_TYPE, handlers=[on_change])
    try:
        await asyncio.sleep(seconds)
        for name in sorted(names):
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if not await info.async_request(azc.zeroconf, LOOKUP_TIMEOUT_MS):
                continue
            try:
                hints = parse_hints(dict(info.properties or {}))
            except ValueError as exc:
                hints = {"error": str(exc)}
            for a in info.parsed_addresses(IPVersion.V4Only):
                found.append((f"{a}:{info.port}", hints))
    finally:
        await browser.async_cancel()
        await azc.async_close()
    return found
