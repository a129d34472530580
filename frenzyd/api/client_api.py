"""The local client API: HTTP/JSON on a unix socket (file permissions) or 127.0.0.1 with a token.

Endpoints (all JSON unless noted; errors are ``{"error": message}`` with 4xx):

* ``GET /v1/status`` -- the status JSON of DESIGN.md §6
* ``GET /v1/jobs`` -- ``{"jobs": [...]}``, every job this node knows
* ``POST /v1/jobs`` -- submit (``workdir``, ``argv`` and the JobSpec fields) -> ``{"job": summary}``
* ``GET /v1/jobs/{id}`` -- the job's full record (jobs submitted here) or its summary
* ``GET /v1/jobs/{id}/events[?follow=1]`` -- NDJSON: state and output events, following until the end
* ``POST /v1/jobs/{id}/cancel`` -- ``{"job": summary}``
* ``GET /v1/jobs/{id}/results`` -- rank 0's output files as packed by the launcher (bytes), 404 if none

Over TCP every request needs ``Authorization: Bearer <token>``; the token is in
``data_dir/client.token`` (mode 0600, created at first start), so only users who can read
that file can submit.  A unix socket is created with mode 0660: access is whoever the file
system lets in (the daemon's user and group).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from frenzyd.errors import ConfigError, FrenzyError, JobStateError
from frenzyd.jobs.orchestrator import Orchestrator

log = logging.getLogger(__name__)

TOKEN_FILE = "client.token"
MAX_REQUEST_BYTES = 1 << 20

_ORCH: web.AppKey[Orchestrator] = web.AppKey("orch", Orchestrator)
_STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("status")
_TOKEN: web.AppKey[str | None] = web.AppKey("token")


def load_or_create_token(data_dir: Path) -> str:
    """The API token in ``data_dir/client.token``, created (0600) when missing."""
    path = data_dir / TOKEN_FILE
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


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
    token = request.app[_TOKEN]
    if token is not None:
        got = request.headers.get("Authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
            return web.json_response({"error": "missing or wrong API token (see data_dir/client.token)"},
                                     status=401)
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
    orch: Orchestrator, status: Callable[[], dict[str, Any]], token: str | None
) -> web.Application:
    """The aiohttp application of the local API (``token`` None = no token check: unix socket)."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_REQUEST_BYTES)
    app[_ORCH], app[_STATUS], app[_TOKEN] = orch, status, token
    app.router.add_get("/v1/status", _status)
    app.router.add_get("/v1/jobs", _jobs)
    app.router.add_post("/v1/jobs", _submit)
    app.router.add_get("/v1/jobs/{job_id}", _job)
    app.router.add_get("/v1/jobs/{job_id}/events", _events)
    app.router.add_post("/v1/jobs/{job_id}/cancel", _cancel)
    app.router.add_get("/v1/jobs/{job_id}/results", _results)
    return app


class ClientApi:
    """Serves the local API until ``stop()``."""

    def __init__(self, listen: str, data_dir: Path, orch: Orchestrator, status: Callable[[], dict[str, Any]]):
        self.kind, self.path, self.host, self.port = parse_listen(listen)
        if self.kind == "tcp" and self.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("client API on %s: reachable beyond this machine, protected only by the token",
                        self.host)
        self.token = load_or_create_token(data_dir) if self.kind == "tcp" else None
        self.app = build_client_app(orch, status, self.token)
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
