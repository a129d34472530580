"""HTTP client of the local frenzyd API (unix socket or 127.0.0.1 + token); errors mapped to FrenzyError."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import aiohttp

from frenzyd.errors import ConfigError, DaemonUnreachable, FrenzyError

DEFAULT_DAEMON = "unix:/run/frenzy/client.sock"
REQUEST_TIMEOUT_S = 30.0
UPLOAD_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
"""A payload may be GiBs: no total limit, but the daemon must keep answering."""


def resolve_address(arg: str | None, env: Mapping[str, str]) -> str:
    """``--daemon`` wins, then ``FRENZY_DAEMON``, then the default local socket."""
    return arg or env.get("FRENZY_DAEMON") or DEFAULT_DAEMON


def resolve_token(address: str, arg: str | None, env: Mapping[str, str]) -> str | None:
    """The API token for a TCP address: ``--token-file``, ``FRENZY_TOKEN``, ``FRENZY_TOKEN_FILE``,
    then your own ``~/.config/frenzy/token`` (``$XDG_CONFIG_HOME/frenzy/token``; an admin issues it
    with ``frenzy-client token issue USER``), then the admin token ``$FRENZY_DATA_DIR/client.token``.
    None for a unix socket (the daemon asks the kernel who you are)."""
    if address.startswith("unix:"):
        return None
    if env.get("FRENZY_TOKEN") and not arg:
        return env["FRENZY_TOKEN"].strip()
    candidates = [arg, env.get("FRENZY_TOKEN_FILE")]
    own = user_token_path(env)
    if own is not None and own.exists():
        candidates.append(str(own))
    if env.get("FRENZY_DATA_DIR"):
        candidates.append(str(Path(env["FRENZY_DATA_DIR"]) / "client.token"))
    for c in candidates:
        if c:
            try:
                return Path(c).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read the API token {c}: {exc.strerror}") from None
    raise ConfigError(
        f"the daemon at {address} needs your API token: ask an admin for one ('frenzy-client token issue "
        f"USER') and keep it in {own or '~/.config/frenzy/token'} (mode 0600), or pass --token-file PATH"
    )


def user_token_path(env: Mapping[str, str]) -> Path | None:
    """Where a user keeps their own API token: ``$XDG_CONFIG_HOME/frenzy/token`` or
    ``~/.config/frenzy/token`` (None without a home directory)."""
    base = env.get("XDG_CONFIG_HOME") or (str(Path(env["HOME"]) / ".config") if env.get("HOME") else "")
    return Path(base) / "frenzy" / "token" if base else None


def pack_request(request: Mapping[str, Any], max_bytes: int) -> tuple[dict[str, Any], IO[bytes]]:
    """The job's spec and its payload, packed here, as the user running the client (the daemon
    never reads a path for a user): ``request['workdir']`` (a directory) or ``request['data_file']``
    (one file: a built-in trainer job's data) becomes a gzip'd tar in a temporary file (the caller
    closes it), at most ``max_bytes`` (the daemon checks again); the spec gets its
    ``payload_sha256``/``payload_size``.  ``LaunchError`` (a FrenzyError) when a file cannot be
    read or the archive is over the cap."""
    from frenzyd.payload import pack_to

    spec = {k: v for k, v in request.items() if k not in ("workdir", "data_file")}
    if not request.get("data_file") and not request.get("workdir"):
        raise ConfigError("nothing to ship: the job needs its directory (workdir) or data file")
    f = tempfile.TemporaryFile(prefix="frenzy-payload-")  # noqa: SIM115 - returned open to the caller
    try:
        if request.get("data_file"):
            data = Path(str(request["data_file"]))
            size, sha = pack_to(f, data.parent, max_bytes, only=data.name)
        else:
            size, sha = pack_to(f, Path(str(request["workdir"])), max_bytes)
        f.seek(0)
    except BaseException:
        f.close()
        raise
    spec.update(payload_sha256=sha, payload_size=size)
    return spec, f


class DaemonClient:
    """``async with DaemonClient(address, token) as c: await c.status()``."""

    def __init__(self, address: str, token: str | None = None) -> None:
        self.address = address
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        if address.startswith("unix:"):
            self._connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=address[5:])
            self._base = "http://frenzyd"
        else:
            _, sep, port = address.rpartition(":")
            if not sep or not port.isdigit():
                raise ConfigError(f"daemon address {address!r}: use 'unix:/path' or 'HOST:PORT'")
            self._connector = aiohttp.TCPConnector()
            self._base = f"http://{address}"
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> DaemonClient:
        self._session = aiohttp.ClientSession(connector=self._connector, headers=self._headers)
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()

    def _s(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise FrenzyError("DaemonClient used outside 'async with'")
        return self._session

    def _unreachable(self, exc: BaseException) -> DaemonUnreachable:
        return DaemonUnreachable(
            f"cannot reach frenzyd at {self.address} ({exc}): is it running? "
            "choose another with --daemon ADDRESS or FRENZY_DAEMON"
        )

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        try:
            async with self._s().request(method, self._base + path, json=body,
                                         timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as r:
                try:
                    data = await r.json(content_type=None)
                except (ValueError, aiohttp.ContentTypeError):
                    data = None
                if r.status >= 400:
                    msg = data.get("error") if isinstance(data, dict) else None
                    raise FrenzyError(msg or f"frenzyd answered HTTP {r.status}")
                return data
        except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from None

    async def status(self) -> dict[str, Any]:
        data: dict[str, Any] = await self._json("GET", "/v1/status")
        return data

    async def owner(self, state: str, gpu: int | None) -> dict[str, Any]:
        """Say the owner is ``busy`` or ``idle`` on GPU ``gpu`` (None: every GPU of the node)."""
        data: dict[str, Any] = await self._json("POST", "/v1/owner", {"state": state, "gpu": gpu})
        return data

    async def jobs(self) -> list[dict[str, Any]]:
        data = await self._json("GET", "/v1/jobs")
        return list(data["jobs"])

    async def whoami(self) -> dict[str, Any]:
        """Who the daemon takes you for (``uid``, ``user``, ``admin``, ...) and its ``max_payload_bytes``."""
        data: dict[str, Any] = await self._json("GET", "/v1/whoami")
        return data

    async def submit(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a job: its directory (``workdir``) or data file (``data_file``) is packed here, as
        you, capped by the daemon's ``max_payload_bytes``, and sent with the spec (multipart)."""
        cap = (await self.whoami()).get("max_payload_bytes")
        if not isinstance(cap, int):
            from frenzyd.config import LauncherSection

            cap = LauncherSection().max_payload_bytes
        spec, payload = await asyncio.to_thread(pack_request, request, cap)
        with payload:
            form = aiohttp.FormData()
            form.add_field("spec", json.dumps(spec), content_type="application/json")
            form.add_field("payload", payload, filename="payload.tar.gz",
                           content_type="application/octet-stream")
            try:
                async with self._s().post(self._base + "/v1/jobs", data=form, timeout=UPLOAD_TIMEOUT) as r:
                    try:
                        data = await r.json(content_type=None)
                    except (ValueError, aiohttp.ContentTypeError):
                        data = None
                    if r.status >= 400:
                        msg = data.get("error") if isinstance(data, dict) else None
                        raise FrenzyError(msg or f"frenzyd answered HTTP {r.status}")
            except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
                raise self._unreachable(exc) from None
        return dict(data["job"])

    async def issue_token(self, user: str) -> dict[str, Any]:
        """A new API token for local user ``user`` (admins only): ``{"user", "uid", "token"}``."""
        data: dict[str, Any] = await self._json("POST", "/v1/tokens", {"user": user})
        return data

    async def revoke_token(self, user: str) -> dict[str, Any]:
        data: dict[str, Any] = await self._json("DELETE", f"/v1/tokens/{user}")
        return data

    async def push_revocations(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        """Give the daemon a revocation list (``revocations.json``'s JSON); it keeps it if newer."""
        data: dict[str, Any] = await self._json("POST", "/v1/revocations", dict(doc))
        return data

    async def job(self, job_id: str) -> dict[str, Any]:
        data: dict[str, Any] = await self._json("GET", f"/v1/jobs/{job_id}")
        return data

    async def cancel(self, job_id: str) -> dict[str, Any]:
        data = await self._json("POST", f"/v1/jobs/{job_id}/cancel")
        return dict(data["job"])

    async def results(self, job_id: str) -> bytes | None:
        try:
            async with self._s().get(self._base + f"/v1/jobs/{job_id}/results",
                                     timeout=aiohttp.ClientTimeout(total=300)) as r:
                if r.status == 404:
                    return None
                if r.status >= 400:
                    try:
                        msg = (await r.json(content_type=None)).get("error")
                    except (ValueError, AttributeError):
                        msg = None
                    raise FrenzyError(msg or f"results of {job_id}: HTTP {r.status}")
                return await r.read()
        except (aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from None

    async def events(self, job_id: str, follow: bool) -> AsyncIterator[dict[str, Any]]:
        """The job's state and output events (NDJSON), following until the job ends when asked."""
        try:
            async with self._s().get(self._base + f"/v1/jobs/{job_id}/events",
                                     params={"follow": "1" if follow else "0"},
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as r:
                if r.status >= 400:
                    try:
                        msg = (await r.json(content_type=None)).get("error")
                    except (ValueError, AttributeError):
                        msg = None
                    raise FrenzyError(msg or f"events of {job_id}: HTTP {r.status}")
                async for line in r.content:
                    if line.strip():
                        try:
                            yield json.loads(line)
                        except ValueError:
                            continue
        except (aiohttp.ClientConnectionError, OSError) as exc:
            raise self._unreachable(exc) from None


def client_from_args(daemon: str | None, token_file: str | None) -> DaemonClient:
    """A client for ``--daemon``/``--token-file`` (or their environment defaults)."""
    env = dict(os.environ)
    address = resolve_address(daemon, env)
    return DaemonClient(address, resolve_token(address, token_file, env))
