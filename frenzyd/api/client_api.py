"""The local client API: HTTP/JSON on a unix socket or 127.0.0.1, knowing who calls.

Endpoints (all JSON unless noted; errors are ``{"error": message}`` with 4xx):

* ``GET /v1/status`` -- the status JSON of DESIGN.md §6
* ``GET /v1/whoami`` -- the caller as the daemon sees it (``frenzyd.api.identity.Caller``)
* ``GET /v1/jobs`` -- ``{"jobs": [...]}``, every job this node knows
* ``POST /v1/jobs`` -- submit (``workdir``, ``argv`` and the JobSpec fields) -> ``{"job": summary}``
* ``GET /v1/jobs/{id}`` -- the job's full record (jobs submitted here) or its summary
* ``GET /v1/jobs/{id}/events[?follow=1]`` -- NDJSON: state and output events, following until the end
* ``POST /v1/jobs/{id}/cancel`` -- ``{"job": summary}``
* ``GET /v1/jobs/{id}/results`` -- rank 0's output files as packed by the launcher (bytes), 404 if none
* ``POST /v1/tokens`` ``{"user": NAME}`` (admins) -> ``{"user", "uid", "token"}``: a per-user TCP token
* ``DELETE /v1/tokens/{user}`` (admins) -- forget that user's token

Every request is identified first (``frenzyd.api.identity``): on the unix socket by the kernel
(``SO_PEERCRED``), over TCP by ``Authorization: Bearer <token>`` -- a user's own token, or the
admin token ``data_dir/client.token`` (mode 0600, created at first start).  A request that
cannot be identified gets 401.  The unix socket is created with mode 0660: who may connect at
all is whoever the file system lets in (the daemon's user and group).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from frenzyd.api.identity import (
    ADMIN_TOKEN_FILE,
    DEFAULT_ADMIN_GROUP,
    IDENTIFY,
    Caller,
    Identify,
    UserTokens,
    caller,
    load_or_create_admin_token,
)
from frenzyd.errors import AuthError, ConfigError, FrenzyError, JobStateError
from frenzyd.jobs.orchestrator import Orchestrator

log = logging.getLogger(__name__)

TOKEN_FILE = ADMIN_TOKEN_FILE
MAX_REQUEST_BYTES = 1 << 20

_ORCH: web.AppKey[Orchestrator] = web.AppKey("orch", Orchestrator)
_STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("status")
_TOKENS: web.AppKey[UserTokens] = web.AppKey("tokens", UserTokens)


def parse_listen(listen: str) -> tuple[str, Path | None, str | None, int | None]:
    """``unix:/path`` -> ("unix", path, None, None); ``127.0.0.1:7471`` -> ("tcp", None, host, port)."""
    if listen.startswith("unix:"):
        path = Path(listen[5:])
        if not path.is_absolute():
            raise ConfigError(f"[client] listen = {listen!r}: the socket path must be absolute")
        return "unix", path, None, None
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"[client] listen = {listen!r}: use 'unix:/path/to.sock' or '127.0.0.1:PORT'")
    return "tcp", None, host.strip("[]"), int(port)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        caller(request)
    except AuthError as exc:
        log.info("client API: refused an unidentified request (%s)", exc.reason)
        return web.json_response({"error": str(exc).removeprefix(f"{exc.reason}: ")}, status=401)
    try:
        resp: web.StreamResponse = await handler(request)
    except JobStateError as exc:
        status = 404 if "no job" in str(exc) else 409
        return web.json_response({"error": str(exc)}, status=status)
    except FrenzyError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    return resp


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app[_STATUS]())


async def _whoami(request: web.Request) -> web.Response:
    return web.json_response(caller(request).to_dict())


def _admin(request: web.Request, what: str) -> Caller:
    who = caller(request)
    if not who.admin:
        group = request.app[IDENTIFY].admin_group
        raise web.HTTPForbidden(
            text=json.dumps({"error": f"{what}: only an admin may (uid 0, the daemon's user, or a member of "
                                      f"the group {group!r}); you are {who.user}"}),
            content_type="application/json")
    return who


async def _issue_token(request: web.Request) -> web.Response:
    _admin(request, "issuing a token")
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": "request body is not JSON"}, status=400)
    user = body.get("user") if isinstance(body, dict) else None
    if not isinstance(user, str) or not user:
        return web.json_response({"error": "give the user: {\"user\": NAME}"}, status=400)
    token, uid = request.app[_TOKENS].issue(user)
    return web.json_response({"user": user, "uid": uid, "token": token}, status=201)


async def _revoke_token(request: web.Request) -> web.Response:
    _admin(request, "revoking a token")
    user = request.match_info["user"]
    if not request.app[_TOKENS].revoke(user):
        return web.json_response({"error": f"user {user!r} has no token"}, status=404)
    return web.json_response({"user": user, "revoked": True})


async def _jobs(request: web.Request) -> web.Response:
    return web.json_response({"jobs": request.app[_ORCH].jobs_view()})


async def _submit(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": "request body is not JSON"}, status=400)
    if not isinstance(body, dict):
        return web.json_response({"error": "request body must be a JSON object"}, status=400)
    rec = await request.app[_ORCH].submit(body)
    return web.json_response({"job": rec.summary()}, status=201)


async def _job(request: web.Request) -> web.Response:
    orch, job_id = request.app[_ORCH], request.match_info["job_id"]
    rec = orch.store.find(job_id)
    if rec is not None:
        return web.json_response({"job": rec.summary(), "record": rec.to_dict()})
    for s in orch.jobs_view():
        if s["id"] == job_id:
            return web.json_response({"job": s})
    raise JobStateError(f"no job {job_id!r} is known here")


async def _events(request: web.Request) -> web.StreamResponse:
    orch, job_id = request.app[_ORCH], request.match_info["job_id"]
    follow = request.query.get("follow", "0") not in ("0", "", "false")
    orch.store.get(job_id)  # 404 before the stream starts
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    try:
        if follow:
            events = orch.store.follow(job_id)
            try:
                async for ev in events:
                    await resp.write(json.dumps(ev).encode() + b"\n")
            finally:  # unregister the follower now, not when the generator is collected
                close = getattr(events, "aclose", None)
                if close is not None:
                    await close()
        else:
            first = {"type": "state", "job": orch.store.get(job_id).summary()}
            await resp.write(json.dumps(first).encode() + b"\n")
            for ev in orch.store.read_output(job_id):
                await resp.write(json.dumps(ev).encode() + b"\n")
        await resp.write_eof()
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError too: the client went away
        # `run` detached (Ctrl-C) or `logs -f | head` ended: the job goes on; nothing is wrong here.
        log.debug("client left the event stream of job %s", job_id)
    return resp


async def _cancel(request: web.Request) -> web.Response:
    rec = await request.app[_ORCH].cancel(request.match_info["job_id"])
    return web.json_response({"job": rec.summary()})


async def _results(request: web.Request) -> web.Response:
    data = request.app[_ORCH].store.results(request.match_info["job_id"])
    if data is None:
        return web.json_response({"error": "no result files (yet)"}, status=404)
    return web.Response(body=data, content_type="application/octet-stream")


def build_client_app(
    orch: Orchestrator, status: Callable[[], dict[str, Any]], identify: Identify, tokens: UserTokens
) -> web.Application:
    """The aiohttp application of the local API; ``identify`` tells who calls."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_REQUEST_BYTES)
    app[_ORCH], app[_STATUS], app[IDENTIFY], app[_TOKENS] = orch, status, identify, tokens
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/v1/whoami", _whoami)
    app.router.add_post("/v1/tokens", _issue_token)
    app.router.add_delete("/v1/tokens/{user}", _revoke_token)
    app.router.add_get("/v1/jobs", _jobs)
    app.router.add_post("/v1/jobs", _submit)
    app.router.add_get("/v1/jobs/{job_id}", _job)
    app.router.add_get("/v1/jobs/{job_id}/events", _events)
    app.router.add_post("/v1/jobs/{job_id}/cancel", _cancel)
    app.router.add_get("/v1/jobs/{job_id}/results", _results)
    return app


class ClientApi:
    """Serves the local API until ``stop()``."""

    def __init__(self, listen: str, data_dir: Path, orch: Orchestrator, status: Callable[[], dict[str, Any]],
                 *, admin_group: str = DEFAULT_ADMIN_GROUP):
        self.kind, self.path, self.host, self.port = parse_listen(listen)
        if self.kind == "tcp" and self.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("client API on %s: reachable beyond this machine, protected only by the token",
                        self.host)
        self.token = load_or_create_admin_token(data_dir) if self.kind == "tcp" else None
        """The admin token (TCP only)."""
        self.tokens = UserTokens(data_dir)
        self.identify = Identify(admin_group=admin_group, daemon_uid=os.geteuid(), admin_token=self.token,
                                 tokens=self.tokens)
        self.app = build_client_app(orch, status, self.identify, self.tokens)
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        """What ``--daemon`` / ``FRENZY_DAEMON`` should be set to."""
        if self.kind == "unix":
            return f"unix:{self.path}"
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site: web.BaseSite
        if self.kind == "unix":
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # a stale socket of a previous run
            site = web.UnixSite(self._runner, str(self.path))
            await site.start()
            os.chmod(self.path, 0o660)
        else:
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            if self.port == 0:
                server = site._server
                sockets = getattr(server, "sockets", None) or []
                if sockets:
                    self.port = int(sockets[0].getsockname()[1])
        log.info("client API on %s", self.address)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.shutdown()
            await self._runner.cleanup()
            self._runner = None
        if self.kind == "unix" and self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
