"""The local client API: HTTP/JSON on a unix socket or 127.0.0.1, knowing who calls.

Endpoints (all JSON unless noted; errors are ``{"error": message}`` with 4xx):

* ``GET /v1/status`` -- the status JSON of DESIGN.md §6
* ``GET /v1/whoami`` -- the caller as the daemon sees it (``frenzyd.api.identity.Caller``)
* ``GET /v1/jobs`` -- ``{"jobs": [...]}``: for an admin every job this node knows, for anyone else
  their own jobs submitted here (each with ``user``, its owner)
* ``POST /v1/jobs`` -- submit: multipart/form-data, a ``spec`` part (JSON: ``argv`` and the JobSpec
  fields, optionally ``payload_sha256``/``payload_size`` to check) then a ``payload`` part (the job's
  directory as ``frenzyd.payload`` packs it, at most ``[launcher] max_payload_bytes``, else 413)
  -> ``{"job": summary}``.  A ``workdir`` is refused (400): the daemon never reads a path for a user
* ``GET /v1/jobs/{id}`` -- the job's full record (jobs submitted here) or its summary
* ``GET /v1/jobs/{id}/events[?follow=1]`` -- NDJSON: state and output events, following until the end
* ``POST /v1/jobs/{id}/cancel`` -- ``{"job": summary}``
* ``GET /v1/jobs/{id}/results`` -- rank 0's output files as packed by the launcher (bytes), 404 if none
* ``POST /v1/tokens`` ``{"user": NAME}`` (admins) -> ``{"user", "uid", "token"}``: a per-user TCP token
* ``DELETE /v1/tokens/{user}`` (admins) -- forget that user's token
* ``POST /v1/revocations`` (anyone identified: the list is signed by the pool CA) -- a revocation list
  (``revocations.json``'s JSON, from ``frenzy-client pool remove-node``); the daemon keeps it if it is
  newer and passes it to every member -> ``{"version", "adopted", "nodes"}``; 403 for a forged list

A user may have at most ``[jobs] max_queued_per_user`` jobs of this node waiting to be placed and
``[jobs] max_active_per_user`` unfinished (queued or running); a submission past either is refused
(429) with the limit, the count and what to do.  Admins are not limited.

Every request is identified first (``frenzyd.api.identity``): on the unix socket by the kernel
(``SO_PEERCRED``), over TCP by ``Authorization: Bearer <token>`` -- a user's own token, or the
admin token ``data_dir/client.token`` (mode 0600, created at first start).  A request that
cannot be identified gets 401.  A job belongs to the user who submitted it (DESIGN.md §8): only
its owner or an admin reads its record, output and results or cancels it (403 otherwise, saying
why); jobs recorded before jobs had owners belong to the daemon's user.  ``/v1/status`` stays
what the read-only status page shows anyone.  The unix socket is created with mode 0660: who may connect at
all is whoever the file system lets in (the daemon's user and group).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import BodyPartReader, web

from frenzyd.api.identity import (
    ADMIN_TOKEN_FILE,
    DEFAULT_ADMIN_GROUP,
    IDENTIFY,
    Caller,
    Identify,
    UserTokens,
    caller,
    load_or_create_admin_token,
    user_name,
)
from frenzyd.errors import AuthError, ConfigError, FrenzyError, JobStateError
from frenzyd.jobs.model import JobRecord
from frenzyd.jobs.orchestrator import Orchestrator
from frenzyd.jobs.submitter import ReceivedPayload

log = logging.getLogger(__name__)

TOKEN_FILE = ADMIN_TOKEN_FILE
MAX_REQUEST_BYTES = 1 << 20

_ORCH: web.AppKey[Orchestrator] = web.AppKey("orch", Orchestrator)
_STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("status")
_REFRESH: web.AppKey[Callable[[], Awaitable[None]] | None] = web.AppKey("refresh")
_TOKENS: web.AppKey[UserTokens] = web.AppKey("tokens", UserTokens)


@dataclass(frozen=True)
class Quota:
    """Per-user limits on this node's jobs (``[jobs] max_queued_per_user``, ``max_active_per_user``;
    0: no limit).  Admins are not limited."""

    max_queued_per_user: int = 0
    max_active_per_user: int = 0


AcceptRevocations = Callable[[Mapping[str, Any]], dict[str, Any]]
"""``accept(doc)``: a revocation list's JSON -> ``{"version", "adopted", ...}`` (the peer layer's)."""

_QUOTA: web.AppKey[Quota] = web.AppKey("quota", Quota)
_REVOCATIONS: web.AppKey[AcceptRevocations | None] = web.AppKey("revocations")


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
    if (refresh := request.app[_REFRESH]) is not None:
        await refresh()
    return web.json_response(request.app[_STATUS]())


async def _whoami(request: web.Request) -> web.Response:
    """The caller, and the daemon's payload cap (the client checks it before sending)."""
    return web.json_response(caller(request).to_dict()
                             | {"max_payload_bytes": request.app[_ORCH].submitter.max_payload_bytes})


def _admin(request: web.Request, what: str) -> Caller:
    who = caller(request)
    if not who.admin:
        group = request.app[IDENTIFY].admin_group
        raise Refused(403, f"{what}: only an admin may (uid 0, the daemon's user, or a member of "
                           f"the group {group!r}); you are {who.user}")
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


class Refused(web.HTTPException):
    """An HTTP refusal with a JSON ``{"error": message}`` body."""

    def __init__(self, status: int, message: str) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


def _owner_name(rec: JobRecord) -> str:
    return rec.owner or user_name(os.geteuid())


def _may_see(request: web.Request, rec: JobRecord) -> bool:
    return caller(request).owns(rec.owner_uid, request.app[IDENTIFY].daemon_uid)


def _check_owner(request: web.Request, job_id: str, what: str) -> JobRecord | None:
    """The job's record (None: a job of another node, which only admins see); ``Refused`` 403
    when the caller is neither its owner nor an admin.  Unknown jobs are left to the handler (404)."""
    who = caller(request)
    rec = request.app[_ORCH].store.find(job_id)
    if rec is None:
        if not who.admin and any(j["id"] == job_id for j in request.app[_ORCH].jobs_view()):
            raise Refused(403, f"job {job_id} was submitted on another node: {what} it there "
                               "(a job belongs to the user who submitted it, on that node)")
        return None
    if not _may_see(request, rec):
        group = request.app[IDENTIFY].admin_group
        raise Refused(403, f"job {job_id} belongs to {_owner_name(rec)}: only its owner or an admin "
                           f"(root, the daemon's user, members of the group {group!r}) may {what} it; "
                           f"you are {who.user}")
    return rec


async def _jobs(request: web.Request) -> web.Response:
    """Every job this node knows for an admin; a user's own jobs of this node for anyone else."""
    orch = request.app[_ORCH]
    out = []
    admin = caller(request).admin
    for j in orch.jobs_view():
        rec = orch.store.find(j["id"])
        if rec is None and not admin:
            continue
        if rec is not None:
            if not _may_see(request, rec):
                continue
            out.append({**j, "user": _owner_name(rec)})
        else:
            out.append(j)
    return web.json_response({"jobs": out})


NOT_A_PATH = ("the daemon does not read a path on a user's behalf: frenzy-client packs the job's directory "
              "itself, as you, and sends the bytes (POST /v1/jobs as multipart/form-data: a 'spec' JSON "
              "part, then a 'payload' part); upgrade frenzy-client")


async def _submit(request: web.Request) -> web.Response:
    """A job from the caller: multipart ``spec`` (JSON) then ``payload`` (the packed directory)."""
    if request.content_type != "multipart/form-data":
        return web.json_response({"error": NOT_A_PATH}, status=400)
    who = caller(request)
    orch = request.app[_ORCH]
    _check_quota(request, who)
    reader = await request.multipart()
    part = await reader.next()
    if not isinstance(part, BodyPartReader) or part.name != "spec":
        return web.json_response({"error": "the first part must be 'spec' (the job's JSON)"}, status=400)
    raw = await _read_capped(part, MAX_REQUEST_BYTES, "the job's spec")
    try:
        spec = json.loads(raw)
    except ValueError:
        return web.json_response({"error": "the 'spec' part is not JSON"}, status=400)
    if not isinstance(spec, dict):
        return web.json_response({"error": "the 'spec' part must be a JSON object"}, status=400)
    if "workdir" in spec:
        return web.json_response({"error": NOT_A_PATH}, status=400)
    part = await reader.next()
    if not isinstance(part, BodyPartReader) or part.name != "payload":
        return web.json_response({"error": "the second part must be 'payload' (the packed directory)"},
                                 status=400)
    path = await asyncio.to_thread(orch.store.incoming)
    try:
        payload = await _receive(part, path, orch.submitter.max_payload_bytes)
        rec = await orch.submitter.submit(spec, payload=payload, owner=(who.user, who.uid))
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # moved into the job when it was accepted
    return web.json_response({"job": rec.summary() | {"user": _owner_name(rec)}}, status=201)


def quota_refusal(quota: Quota, records: Iterable[JobRecord], who: Caller, daemon_uid: int) -> str | None:
    """Why ``who`` may not submit one more job now (the limit, the count, what to do), or None.
    ``records`` are this node's jobs; a record without an owner is the daemon user's."""
    if who.admin or not (quota.max_queued_per_user or quota.max_active_per_user):
        return None
    mine = [r for r in records
            if not r.terminal and (daemon_uid if r.owner_uid is None else r.owner_uid) == who.uid]
    queued = sum(1 for r in mine if r.state == "queued")
    limits = (("max_active_per_user", quota.max_active_per_user, len(mine), "unfinished (queued or running)"),
              ("max_queued_per_user", quota.max_queued_per_user, queued, "queued"))
    for key, limit, have, what in limits:
        if limit and have >= limit:
            return (f"quota: {who.user} has {have} {what} jobs on this node and the limit is {limit} ([jobs] "
                    f"{key} in frenzyd's config): wait for one to finish or cancel one "
                    "('frenzy-client jobs', 'frenzy-client cancel JOB'), or ask an admin to raise "
                    f"[jobs] {key} and restart frenzyd")
    return None


def _check_quota(request: web.Request, who: Caller) -> None:
    """Refuse (429) a submission past the caller's quota, before the payload is read."""
    why = quota_refusal(request.app[_QUOTA], request.app[_ORCH].store.all(), who,
                        request.app[IDENTIFY].daemon_uid)
    if why is not None:
        log.info("client API: refused a job of %s: %s", who.user, why)
        raise Refused(429, why)


async def _revocations(request: web.Request) -> web.Response:
    accept = request.app[_REVOCATIONS]
    if accept is None:
        return web.json_response({"error": "this daemon takes no revocation lists here"}, status=404)
    try:
        body = await request.json()
    except ValueError:
        return web.json_response({"error": "request body is not JSON (give revocations.json)"}, status=400)
    if not isinstance(body, dict):
        return web.json_response({"error": "give the revocation list's JSON object"}, status=400)
    who = caller(request)
    try:
        out = accept(body)
    except AuthError as exc:
        status = {"forged_revocation": 403, "stale_revocation": 409}.get(exc.reason, 400)
        log.warning("client API: %s gave a revocation list that was refused: %s", who.user, exc)
        return web.json_response({"error": f"revocation list refused: {exc}"}, status=status)
    log.info("client API: %s gave revocation list version %s (adopted: %s)", who.user, out.get("version"),
             out.get("adopted"))
    return web.json_response(out)


async def _read_capped(part: BodyPartReader, cap: int, what: str) -> bytes:
    buf = bytearray()
    while chunk := await part.read_chunk(1 << 16):
        buf += chunk
        if len(buf) > cap:
            raise Refused(413, f"{what} is over {cap} bytes")
    return bytes(buf)


async def _receive(part: BodyPartReader, path: Path, cap: int) -> ReceivedPayload:
    """Stream the payload part into ``path`` (hashing it, refusing it past ``cap``)."""
    sha, size, buf = hashlib.sha256(), 0, bytearray()
    f = await asyncio.to_thread(path.open, "wb")
    try:
        while chunk := await part.read_chunk(1 << 20):
            size += len(chunk)
            if size > cap:
                raise Refused(413, f"the payload is over this node's cap of {cap} bytes "
                                   "([launcher] max_payload_bytes): ship a smaller directory")
            sha.update(chunk)
            buf += chunk
            if len(buf) >= 8 << 20:
                await asyncio.to_thread(f.write, bytes(buf))
                buf.clear()
        await asyncio.to_thread(f.write, bytes(buf))
    finally:
        await asyncio.to_thread(f.close)
    return ReceivedPayload(path, size, sha.hexdigest())


async def _job(request: web.Request) -> web.Response:
    orch, job_id = request.app[_ORCH], request.match_info["job_id"]
    rec = _check_owner(request, job_id, "read")
    if rec is not None:
        return web.json_response({"job": rec.summary() | {"user": _owner_name(rec)}, "record": rec.to_dict()})
    for s in orch.jobs_view():
        if s["id"] == job_id:
            return web.json_response({"job": s})
    raise JobStateError(f"no job {job_id!r} is known here")


async def _events(request: web.Request) -> web.StreamResponse:
    orch, job_id = request.app[_ORCH], request.match_info["job_id"]
    follow = request.query.get("follow", "0") not in ("0", "", "false")
    _check_owner(request, job_id, "read the output of")
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
    job_id = request.match_info["job_id"]
    _check_owner(request, job_id, "cancel")
    rec = await request.app[_ORCH].cancel(job_id)
    return web.json_response({"job": rec.summary()})


async def _results(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    _check_owner(request, job_id, "fetch the results of")
    data = request.app[_ORCH].store.results(job_id)
    if data is None:
        return web.json_response({"error": "no result files (yet)"}, status=404)
    request.app[_ORCH].store.mark_fetched(job_id)  # retention: may go after [jobs] keep_finished_days
    return web.Response(body=data, content_type="application/octet-stream")


def build_client_app(
    orch: Orchestrator, status: Callable[[], dict[str, Any]], identify: Identify, tokens: UserTokens,
    *, quota: Quota | None = None, revocations: AcceptRevocations | None = None,
    refresh: Callable[[], Awaitable[None]] | None = None,
) -> web.Application:
    """The aiohttp application of the local API; ``identify`` tells who calls."""
    app = web.Application(middlewares=[_errors], client_max_size=MAX_REQUEST_BYTES)
    app[_ORCH], app[_STATUS], app[IDENTIFY], app[_TOKENS] = orch, status, identify, tokens
    app[_QUOTA], app[_REVOCATIONS], app[_REFRESH] = quota or Quota(), revocations, refresh
    app.router.add_post("/v1/revocations", _revocations)
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
                 *, admin_group: str = DEFAULT_ADMIN_GROUP, quota: Quota | None = None,
                 revocations: AcceptRevocations | None = None,
                 refresh: Callable[[], Awaitable[None]] | None = None):
        self.kind, self.path, self.host, self.port = parse_listen(listen)
        if self.kind == "tcp" and self.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("client API on %s: reachable beyond this machine, protected only by the token",
                        self.host)
        self.token = load_or_create_admin_token(data_dir) if self.kind == "tcp" else None
        """The admin token (TCP only)."""
        self.tokens = UserTokens(data_dir)
        self.identify = Identify(admin_group=admin_group, daemon_uid=os.geteuid(), admin_token=self.token,
                                 tokens=self.tokens)
        self.app = build_client_app(orch, status, self.identify, self.tokens, quota=quota,
                                    revocations=revocations, refresh=refresh)
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
