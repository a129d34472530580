"""Who calls the client API (issue 16, DESIGN §8 "Users"): SO_PEERCRED on the unix socket, the
admin token and per-user tokens over TCP, on real listeners with aiohttp's client."""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from frenzyd.api.client_api import ClientApi

from .orch_harness import Pool
from .test_cli_jobs import status_of


class Apis:
    def __init__(self, unix: ClientApi, tcp: ClientApi, data_dir: Path) -> None:
        self.unix, self.tcp_api, self.data_dir = unix, tcp, data_dir

    async def unix_get(self, path: str) -> tuple[int, Any]:
        assert self.unix.path is not None
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(self.unix.path))) as s, \
                s.get("http://frenzyd" + path) as r:
            return r.status, await r.json(content_type=None)

    async def tcp(self, method: str, path: str, token: str | None, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with aiohttp.ClientSession(headers=headers) as s, \
                s.request(method, f"http://{self.tcp_api.address}{path}", json=body) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
async def apis(tmp_path: Path) -> AsyncIterator[Apis]:
    pool = Pool(tmp_path)
    pool.add("a", 1)
    pool.coordinator = "a"
    pool.start()
    orch = pool.nodes["a"].orch
    unix = ClientApi(f"unix:{tmp_path}/a/client.sock", tmp_path / "a", orch, status_of(pool, "a"))
    tcp = ClientApi("127.0.0.1:0", tmp_path / "a", orch, status_of(pool, "a"), admin_group="frenzy-test-none")
    await unix.start()
    await tcp.start()
    try:
        yield Apis(unix, tcp, tmp_path / "a")
    finally:
        await unix.stop()
        await tcp.stop()
        await pool.close()


async def test_the_unix_socket_knows_the_caller_from_the_kernel(apis: Apis) -> None:
    status, who = await apis.unix_get("/v1/whoami")
    assert status == 200
    assert who["uid"] == os.geteuid()
    assert who["pid"] == os.getpid()  # the connecting process, as the kernel saw it
    assert who["user"] == pwd.getpwuid(os.geteuid()).pw_name
    assert who["how"] == "peercred"
    assert who["admin"] is True  # the daemon's own user


async def test_tcp_admin_token_and_per_user_tokens(apis: Apis) -> None:
    admin = (apis.data_dir / "client.token").read_text().strip()
    assert (await apis.tcp("GET", "/v1/whoami", None))[0] == 401
    status, body = await apis.tcp("GET", "/v1/whoami", "not-a-token")
    assert status == 401
    assert "wrong API token" in body["error"]
    status, who = await apis.tcp("GET", "/v1/whoami", admin)
    assert status == 200
    assert (who["how"], who["admin"], who["uid"]) == ("admin-token", True, os.geteuid())

    status, body = await apis.tcp("POST", "/v1/tokens", admin, {"user": "no-such-user-xyz"})
    assert status == 400
    assert "no local user 'no-such-user-xyz'" in body["error"]
    status, issued = await apis.tcp("POST", "/v1/tokens", admin, {"user": "nobody"})
    assert status == 201, issued
    nobody = pwd.getpwnam("nobody")
    assert issued["uid"] == nobody.pw_uid
    tokens = apis.data_dir / "client-tokens.json"
    assert tokens.stat().st_mode & 0o777 == 0o600
    assert issued["token"] not in tokens.read_text()  # only its hash is kept

    status, who = await apis.tcp("GET", "/v1/whoami", issued["token"])
    assert status == 200
    assert (who["user"], who["uid"], who["how"], who["admin"]) == ("nobody", nobody.pw_uid, "token", False)
    status, body = await apis.tcp("POST", "/v1/tokens", issued["token"], {"user": "nobody"})
    assert status == 403
    assert "only an admin may" in body["error"]
    assert "frenzy-test-none" in body["error"]

    # A new token replaces the old one; a revoked one is refused.
    status, again = await apis.tcp("POST", "/v1/tokens", admin, {"user": "nobody"})
    assert status == 201
    assert (await apis.tcp("GET", "/v1/whoami", issued["token"]))[0] == 401
    assert (await apis.tcp("GET", "/v1/whoami", again["token"]))[0] == 200
    status, _ = await apis.tcp("DELETE", "/v1/tokens/nobody", admin)
    assert status == 200
    assert (await apis.tcp("GET", "/v1/whoami", again["token"]))[0] == 401
    assert json.loads(tokens.read_text())["users"] == {}

