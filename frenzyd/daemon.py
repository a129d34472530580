"""frenzyd's composition root: builds every part from the config and runs them in one TaskGroup.

Start-up: credentials, data directory (0700), leftover ranks of a previous run reaped,
GPU inventory (NVML, else the declared simulated devices), the peer network (mutual TLS,
heartbeats, election), discovery, the orchestrator, the local client API and the web page.
Shutdown (``stop`` set, e.g. by SIGTERM): the orchestrator vacates this node's ranks and
reports them, then the servers close; everything within ``timing.shutdown_deadline_s``,
after which what is left is cancelled.  Identity (credentials), the highest election term,
job records and logs persist in the data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.metadata
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from frenzyd.api.client_api import ClientApi, Quota
from frenzyd.api.metrics import AUTH_REFUSALS, MESSAGES_DROPPED, MetricsRegistry
from frenzyd.api.web import WebServer, build_web_app
from frenzyd.config import Config
from frenzyd.errors import ConfigError, FrenzyError
from frenzyd.jobs.orchestrator import SIGNED_KINDS, ClusterView, Orchestrator, Versions
from frenzyd.jobs.status import PeerState, build_status
from frenzyd.jobs.store import keep_pruned
from frenzyd.net import auth
from frenzyd.net.election import Change, ElectionState, valid_stored_term
from frenzyd.net.network import PeerNetwork
from frenzyd.net.wire import Body
from frenzyd.node import launcher as launcher_mod
from frenzyd.node import slots
from frenzyd.node.inventory import Inventory, open_backend, withheld_reason
from frenzyd.node.launcher import Launcher, RankSpec
from frenzyd.node.owner import ALL_GPUS, OwnerPolicy, parse_windows

log = logging.getLogger(__name__)

STATE_FILE = "daemon-state.json"
LOCK_FILE = "frenzyd.lock"


def lock_data_dir(data_dir: Path) -> int:
    """Take the exclusive lock of ``data_dir`` for this process's life; return its descriptor.

    ``ConfigError`` (naming the holder's pid) when another process holds it.  ``flock`` locks die
    with their process, so a crashed daemon never leaves a stale lock behind.
    """
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(f"data directory {data_dir} is in use by another frenzyd (pid {holder}); each "
                          "daemon needs its own [node] data_dir, and one node identity runs once") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def torch_version() -> str:
    """The installed torch version, read from package metadata (the daemon never imports torch)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def python_version() -> str:
    return ".".join(str(v) for v in sys.version_info[:3])


class Daemon:
    """One frenzyd: call ``await Daemon(config).run(stop)``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.data_dir = config.node.data_dir
        self.creds = auth.load_credentials(config.pool.credentials)
        if self.creds.node_name != config.node.name:
            raise ConfigError(
                f"[node] name = {config.node.name!r} but the credentials in {config.pool.credentials} "
                f"belong to {self.creds.node_name!r}: enrol this name with `frenzy-client pool add-node` "
                "or fix the name"
            )
        self.node_id = self.creds.node_id
        self.started = time.monotonic()
        self.metrics = MetricsRegistry()
        self.launcher: Launcher | None = None
        self.inventory: Inventory | None = None
        self.net: PeerNetwork | None = None
        self.orch: Orchestrator | None = None
        self.client_api: ClientApi | None = None
        self.web: WebServer | None = None
        self.ready = asyncio.Event()
        owner = config.owner
        self.owner = OwnerPolicy(max_utilization=owner.max_utilization, idle_s=owner.idle_minutes * 60.0,
                                 windows=parse_windows(owner.windows))

    # --- persisted daemon state (highest term) ------------------------------------------------

    def _load_term(self) -> int:
        try:
            data = json.loads((self.data_dir / STATE_FILE).read_text())
            raw = data.get("term", 0)
        except (OSError, ValueError, TypeError, AttributeError):
            return 0
        term = valid_stored_term(raw)
        if term is None:  # e.g. 2^64-1 written before terms were bounded: no election reaches it
            log.warning("%s holds term %.40r, which is not a valid term; starting from term 0",
                        self.data_dir / STATE_FILE, raw)
            return 0
        return term

    def _save_term(self, term: int) -> None:
        path = self.data_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"term": term, "node_id": self.node_id}))
        os.replace(tmp, path)

    # --- views over the parts -----------------------------------------------------------------

    def _gpus(self) -> list[dict[str, Any]]:
        """This node's GPUs for its reports: the inventory's fields, ``offered`` and, when not
        offered, the ``reason`` (owner protection, an NVML answer it cannot trust, MIG)."""
        assert self.inventory is not None
        owner = self.config.owner
        now, local = time.time(), datetime.now()  # the owner's windows are local time
        out = []
        for g in self.inventory.last:
            reason = withheld_reason(g, 0, owner.min_free_fraction,
                                     protect_owner=owner.protect_foreign_processes)
            reason = reason or self.owner.reason(g.uuid, now=now, local=local)
            out.append({**g.to_json(), "offered": reason is None, "reason": reason})
        return out

    def _reclaimed(self) -> list[dict[str, Any]]:
        """The GPUs as owner protection sees them: a GPU the owner said is busy, or outside the
        hours the owner lends it, counts as the owner's (Frenzy's ranks there are stopped)."""
        assert self.inventory is not None
        local = datetime.now()  # the owner's windows are local time
        closed = bool(self.owner.windows) and not any(w.contains(local) for w in self.owner.windows)
        out = []
        for g in self._gpus():
            owners = closed or self.owner.said_busy(str(g["uuid"]))
            busy = max(1, int(g.get("foreign_processes") or 0))
            out.append({**g, "foreign_processes": busy} if owners else g)
        return out

    def _observe_owner(self) -> None:
        """Remember when each GPU's owner was last active on it (``OwnerPolicy.observe``)."""
        assert self.inventory is not None
        held = set(self.orch.leases.leased_gpus()) if self.orch is not None else set()
        now = time.time()
        for g in self.inventory.last:
            self.owner.observe(g.uuid, owner_process=g.foreign_processes > 0, utilization=g.utilization,
                               frenzy_holds=g.uuid in held, now=now)

    async def owner_signal(self, request: Any) -> Any:
        """``POST /v1/owner {"state": "busy"|"idle", "gpu": INDEX|null}``: the owner's word for a
        GPU (or all), from a user in ``[owner] users`` or an admin; busy stops Frenzy's ranks there
        at once (with the reclaim grace), idle offers the GPU again."""
        from aiohttp import web

        from frenzyd.api.identity import caller

        def refuse(why: str, status: int) -> web.Response:
            return web.json_response({"error": why}, status=status)

        who = caller(request)
        owners = ", ".join(self.config.owner.users) or "none"
        if not (who.admin or who.user in self.config.owner.users):
            return refuse(f"only this machine's owners ([owner] users: {owners}) and the pool's admins may "
                          f"say the owner is busy; you are {who.user}", 403)
        try:
            body = await request.json()
        except ValueError:
            body = None
        state = body.get("state") if isinstance(body, dict) else None
        gpu = body.get("gpu") if isinstance(body, dict) else None
        if state not in ("busy", "idle") or not (gpu is None or type(gpu) is int):
            return refuse('give {"state": "busy"|"idle", "gpu": INDEX or null}', 400)
        assert self.inventory is not None
        assert self.orch is not None
        gpus = self.inventory.last
        uuids = [ALL_GPUS] if gpu is None else [g.uuid for g in gpus if g.index == gpu]
        if not uuids:
            have = ", ".join(str(g.index) for g in gpus) or "none"
            return refuse(f"no GPU {gpu} on this node (it has {have})", 400)
        self.owner.signal(state == "busy", uuids)
        self._observe_owner()
        vacated = await self.orch.protect_owner(self._reclaimed()) if state == "busy" else []
        which = "every GPU" if gpu is None else f"GPU {gpu}"
        log.info("owner %s said %s for %s; vacated %s", who.user, state, which, vacated or "nothing")
        shown = [{"index": g["index"], "offered": g["offered"], "reason": g["reason"]} for g in self._gpus()]
        return web.json_response({"state": state, "gpu": gpu, "by": who.user, "vacated": vacated,
                                  "gpus": shown})

    def _self_report(self) -> dict[str, Any]:
        assert self.orch is not None
        assert self.net is not None
        assert self.launcher is not None
        return {**self.orch.report(), "name": self.creds.node_name, "address": self.net.address,
                "launcher": self.launcher.report()}

    def view(self) -> ClusterView:
        """The election's coordinator/term and the live peers' latest reports (this node included)."""
        assert self.net is not None
        election = self.net.election
        peers: dict[str, dict[str, Any]] = {self.node_id: self._self_report()}
        now = time.monotonic()
        for rec in self.net.table.records():
            if rec.node_id != self.node_id and self.net.table.is_alive(rec.node_id, now):
                peers[rec.node_id] = {**rec.report.to_dict(), "name": rec.name, "address": rec.address}
        return ClusterView(election.coordinator, election.term, peers)

    async def refresh_status(self) -> None:
        """Before a status is read: under swim, bring the coordinator's view of the other members'
        GPUs and jobs up to date (at most once per max(``heartbeat_s``, 1 s), waiting at most
        ``request_timeout_s``)."""
        if self.net is not None and self.net.members is not None:
            t = self.config.timing
            await self.net.members.refresh_pool_view(max_age_s=max(t.heartbeat_s, 1.0),
                                                     wait_s=t.request_timeout_s)

    def status(self) -> dict[str, Any]:
        """The status JSON of DESIGN.md §6 (served by the web page and ``frenzy-client status``)."""
        if self.net is None or self.orch is None:
            return build_status(node_id=self.node_id, node_name=self.creds.node_name, term=0,
                                coordinator=None, peers=[], jobs=[])
        election = self.net.election
        now, wall = time.monotonic(), time.time()
        peers = [PeerState(self.node_id, self.creds.node_name, self.net.address, True, self._self_report(),
                           clock_offset_s=0.0)]
        names = {self.node_id: self.creds.node_name}
        # Under swim this node hears full reports only from the coordinator and its jobs' peers; the
        # others' GPUs and jobs come from the coordinator's view (refresh_status, when someone looks).
        view = self.net.members.pool_view if self.net.members is not None else {}
        base = self.view()
        job_peers = dict(base.peers)
        for rec in self.net.table.records():
            if rec.node_id == self.node_id:
                continue
            names[rec.node_id] = rec.name
            alive = self.net.table.is_alive(rec.node_id, now)
            report = rec.report.to_dict()
            their = report.get("time")
            offset = None if not isinstance(their, int | float) or isinstance(their, bool) else \
                float(their) - (wall - (now - rec.last_seen))
            if (theirs := view.get(rec.node_id)) is not None and not self.net.table.heard_lately(rec, now):
                report, offset = theirs.report.to_dict(), None
                if alive:
                    job_peers[rec.node_id] = {**report, "name": rec.name, "address": rec.address}
            # A member the protocol holds live whose report has reached neither this node nor the
            # coordinator's view is still joining: listed, not alive, until its GPUs are known.
            alive = alive and bool(report)
            peers.append(PeerState(rec.node_id, rec.name, rec.address, alive, report,
                                   seen_by=self.net.book.sources(rec.node_id), clock_offset_s=offset))
        coord = election.coordinator
        backend = self.inventory.backend if self.inventory is not None else None
        return build_status(
            node_id=self.node_id, node_name=self.creds.node_name, term=election.term,
            coordinator=None if coord is None else (coord, names.get(coord, coord[:12])),
            peers=peers, jobs=self.orch.jobs_view(ClusterView(base.coordinator, base.term, job_peers)),
            other_versions=self.net.counters.other_versions, now=wall,
            gpu_backend=None if backend is None else
            {"kind": "declared" if backend.simulated else "nvml", "note": backend.note},
            scheduler=self.orch.coordinator.restart_costs(),
        )

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down within the configured deadline.

        The data directory is locked for the daemon's life: a second frenzyd on it refuses to start
        (before it could reap the first one's ranks or answer for its jobs).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # at every start, not only when created: it holds job records, logs and run directories
            self.data_dir.chmod(0o700)
        except PermissionError as exc:
            raise ConfigError(f"cannot make the data directory {self.data_dir} private (mode 0700): "
                              f"{exc.strerror}; make it owned by the user frenzyd runs as") from exc
        # Jobs' code runs as other users here: the daemon's secrets must be out of their reach.
        cred = self.creds.node_key.parent
        slots.check_secrets([self.creds.node_key, cred / "ca.key", self.data_dir / "client.token",
                             self.data_dir / "client-tokens.json"])
        lock = lock_data_dir(self.data_dir)
        try:
            await self._run(stop)
        finally:
            os.close(lock)

    async def _run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        la = cfg.launcher
        self.launcher = Launcher(self.data_dir, la.run_as, la.rendezvous_ports,
                                 la.term_grace_s, lease_s=cfg.timing.lease_timeout_s,
                                 env_allow=la.env_allow,
                                 isolation=slots.isolation(la.slot_prefix, want_slots=la.slots,
                                                           accept=la.accept),
                                 cgroups=la.cgroups, execute_dir=la.execute_dir,
                                 rank_log_bytes=la.rank_log_bytes, rank_log_keep=la.rank_log_keep,
                                 rank_log_retention_s=la.rank_log_retention_s)
        log.info("ranks run as %s%s; %s", self.launcher.isolation.mode,
                 f" ({self.launcher.isolation.reason})" if self.launcher.isolation.reason else "",
                 self.launcher.isolation.kill)
        self.launcher.reap_leftovers()
        self.inventory = Inventory(open_backend(cfg.devices, cfg.node.name), self.launcher.own_pids,
                                   cfg.owner.ignore_processes)
        await self.inventory.refresh()
        term = self._load_term()
        election = ElectionState(self.node_id, cfg.node.priority, started_at=time.monotonic(),
                                 grace_s=cfg.timing.election_grace_s, term=term)
        self.net = PeerNetwork(cfg, self.creds, election, report_provider=self._report,
                               on_change=self._on_change, on_peer=lambda rec, revived: self._wake())
        net = self.net

        async def send(node: str, msg: Body, limit_s: float) -> dict[str, Any]:
            return (await net.send(node, msg.KIND, msg.to_body(), limit_s)).body

        async def send_order(node: str, msg: Body, limit_s: float) -> dict[str, Any]:
            return (await net.send_signed(node, msg.KIND, msg.to_body(), limit_s)).body

        self.orch = orch = Orchestrator(
            node_id=self.node_id, node_name=self.creds.node_name, data_dir=self.data_dir,
            send=send, send_order=send_order,
            view=self.view, gpus=self._gpus, launcher=self.launcher, rank_spec=RankSpec,
            pack_dir=launcher_mod.pack_dir, unpack=launcher_mod.unpack,
            collect_results=launcher_mod.collect_results,
            versions=Versions(python_version(), torch_version()),
            max_payload_bytes=cfg.launcher.max_payload_bytes, max_result_bytes=cfg.launcher.max_result_bytes,
            heartbeat_s=cfg.timing.heartbeat_s, lease_timeout_s=cfg.timing.lease_timeout_s,
            retention_s=cfg.jobs.retention_s, unplaceable_after_s=cfg.jobs.unplaceable_after_s,
            min_run_s=cfg.jobs.min_run_s, policy=cfg.jobs.policy, vacate_grace_s=cfg.owner.vacate_grace_s,
            restart_costs=(cfg.jobs.restart_start_s, cfg.jobs.restart_stop_s),
            socket_ifname=cfg.network.interfaces[0] if cfg.network.interfaces else None,
        )
        for kind, handler in self.orch.handlers().items():
            net.on(kind, handler, signed=kind in SIGNED_KINDS)
        # One family per counter (the README's names): the network's own counting dicts feed them.
        self.metrics.add_count_source(MESSAGES_DROPPED, "Peer frames dropped, by reason", "reason",
                                      lambda: net.dropped)
        self.metrics.add_count_source(AUTH_REFUSALS, "Peers, connections and orders refused by "
                                      "authentication, by reason", "reason", lambda: net.auth_refusals)
        self.metrics.add_count_source(
            "frenzy_peer_send_failures", "Frames this node could not deliver to a peer (heartbeats, "
            "membership probes, orders), by reason", "reason", lambda: net.send_failures)
        self.metrics.add_count_source(
            "frenzy_stale_attempts_refused", "Messages refused because they were about an attempt of a job "
            "that is not its current one, by message kind", "kind", lambda: orch.ctx.fenced)
        self.metrics.add_count_source(
            "frenzy_job_records_quarantined", "Unreadable job records moved to data_dir/quarantine/jobs",
            "store", lambda: {"jobs": orch.store.quarantined})
        orch_stop = asyncio.Event()
        discovery: Any = None
        try:
            # Bind every port before the task group (an error in its body would come out wrapped in an
            # ExceptionGroup) and before mDNS announces this node: a node that dies on a taken port
            # must not have told the pool it exists.
            await net.start()  # ConfigError naming [network] listen when the port is taken
            app = build_web_app(self.status, self.metrics, self.refresh_status)
            w = cfg.web
            self.web = WebServer(app, w.listen.host, w.listen.port, idle_timeout_s=w.idle_timeout_s,
                                 max_connections=w.max_connections)
            await _bind(self.web.start, "the status page", str(cfg.web.listen), "[web] listen",
                        "FRENZY_WEB_LISTEN")
            async with asyncio.TaskGroup() as tg:
                orch_task = tg.create_task(self.orch.run(orch_stop), name="orchestrator")
                inv_task = tg.create_task(self._inventory_loop(), name="inventory")
                keep_task = tg.create_task(keep_pruned(
                    self.orch.store, self.data_dir / "runs", keep_finished_days=cfg.jobs.keep_finished_days,
                    keep_unfetched_days=cfg.jobs.keep_unfetched_days,
                    live=lambda: {lease.job_id for lease in orch.leases.leases()}
                    | {r.id for r in orch.store.all() if not r.terminal}), name="retention")
                self.client_api = ClientApi(cfg.client.listen, self.data_dir, self.orch, self.status,
                                           admin_group=cfg.client.admin_group,
                                           quota=Quota(cfg.jobs.max_queued_per_user,
                                                       cfg.jobs.max_active_per_user),
                                           revocations=net.accept_revocations,
                                           refresh=self.refresh_status)
                self.client_api.app.router.add_post("/v1/owner", self.owner_signal)
                await _bind(self.client_api.start, "the client API", cfg.client.listen, "[client] listen",
                            "FRENZY_CLIENT_LISTEN")
                if cfg.network.mdns:
                    from frenzyd.net.discovery import Discovery

                    assert net.port is not None
                    discovery = Discovery(cfg, self.creds, net.port,
                                          lambda addr, hints: net.add_address(addr, hints, "mdns"),
                                          lonely=lambda: not net.live_peers())
                    await discovery.start()
                log.info("frenzyd %s (%s) ready: peers %s, client %s, web http://%s:%d/, %d GPU(s)%s",
                         self.creds.node_name, self.node_id[:12], net.address, self.client_api.address,
                         cfg.web.listen.host, self.web.port, len(self.inventory.last),
                         " (simulated)" if self.inventory.simulated else "")
                self.ready.set()
                await stop.wait()
                log.info("stopping (deadline %.0fs)", cfg.timing.shutdown_deadline_s)
                try:
                    async with asyncio.timeout(cfg.timing.shutdown_deadline_s):
                        await self._graceful(orch_stop, orch_task, discovery)
                except TimeoutError:
                    log.warning("shutdown deadline passed; cancelling what is left")
                orch_task.cancel()
                inv_task.cancel()
                keep_task.cancel()
        finally:
            await self._close(discovery)
            self._save_term(net.election.term)
            log.info("stopped")

    async def _graceful(
        self, orch_stop: asyncio.Event, orch_task: asyncio.Task[None], discovery: Any
    ) -> None:
        if self.client_api is not None:
            await self.client_api.stop()
        orch_stop.set()
        await orch_task  # vacates this node's ranks and reports them to their submitters
        await self._close(discovery)

    async def _close(self, discovery: Any) -> None:
        steps: list[Callable[[], Awaitable[None]]] = []
        if self.client_api is not None:
            steps.append(self.client_api.stop)
        if self.web is not None:
            steps.append(self.web.stop)
        if discovery is not None:
            steps.append(discovery.stop)
        if self.net is not None:
            steps.append(self.net.stop)
        if self.launcher is not None:
            steps.append(self.launcher.close)
        for step in steps:
            try:
                await asyncio.wait_for(step(), 5.0)
            except (TimeoutError, FrenzyError, OSError) as exc:
                log.warning("shutdown step %s: %s", getattr(step, "__qualname__", step), exc)
        self.client_api = self.web = None
        if self.inventory is not None:
            with contextlib.suppress(Exception):
                self.inventory.close()

    async def _inventory_loop(self) -> None:
        assert self.inventory is not None
        while True:
            await asyncio.sleep(self.config.timing.inventory_refresh_s)
            try:
                await self.inventory.refresh()
            except FrenzyError as exc:
                log.warning("inventory refresh failed: %s", exc)
                continue
            self._observe_owner()
            if self.orch is not None:
                gpus = self._reclaimed()
                if not self.config.owner.protect_foreign_processes:  # only the owner's word and hours
                    gpus = [g for g in gpus if self.owner.said_busy(str(g["uuid"])) or self.owner.windows]
                await self.orch.protect_owner(gpus)

    def _report(self) -> dict[str, Any]:
        assert self.orch is not None
        assert self.launcher is not None
        return {**self.orch.report(), "time": time.time(),  # peers see our clock: doctor's skew check
                "launcher": self.launcher.report()}  # accept, who ranks run as (placement reads accept)

    def _on_change(self, change: Change) -> None:
        with contextlib.suppress(OSError):
            self._save_term(change.after.term)
        self._wake()

    def _wake(self) -> None:
        if self.orch is not None:
            self.orch.wake()


async def _bind(start: Callable[[], Awaitable[Any]], what: str, address: str, key: str, env: str) -> None:
    """Run a server's ``start``; a port or socket it cannot take becomes one ConfigError naming the
    config key to change (instead of an OSError traceback)."""
    try:
        await start()
    except OSError as exc:
        raise ConfigError(
            f"cannot serve {what} on {address}: {os.strerror(exc.errno) if exc.errno else exc}; another "
            "process (another frenzyd?) "
            f"holds it: change {key} (or {env}) or stop that process"
        ) from exc


async def run_daemon(config: Config, stop: asyncio.Event) -> None:
    """Build a daemon from ``config`` and run it until ``stop`` is set."""
    await Daemon(config).run(stop)


__all__ = ["Daemon", "run_daemon"]
