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
from frenzyd.config import config_from_dict
from frenzyd.errors import ConfigError
from frenzyd.jobs.orchestrator import Orchestrator

from .orch_harness import Pool
from .test_cli_jobs import status_of

ROOT = Path(__file__).resolve().parents[2]


class Apis:
    def __init__(self, unix: ClientApi, tcp: ClientApi, data_dir: Path, orch: Orchestrator) -> None:
        self.unix, self.tcp_api, self.data_dir, self.orch = unix, tcp, data_dir, orch

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
        yield Apis(unix, tcp, tmp_path / "a", orch)
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


def test_admin_group_key(tmp_path: Path) -> None:
    raw: dict[str, Any] = {"node": {"name": "n", "data_dir": str(tmp_path)}, "pool": {"credentials": "c"},
                           "network": {"mdns": False, "listen": "127.0.0.1:0"}}
    assert config_from_dict(raw, {}, base=tmp_path).client.admin_group == "frenzy-admin"
    raw["client"] = {"admin_group": "gpu-admins"}
    assert config_from_dict(raw, {}, base=tmp_path).client.admin_group == "gpu-admins"
    raw["client"] = {"admin_group": "-rf /"}
    with pytest.raises(ConfigError, match="admin_group"):
        config_from_dict(raw, {}, base=tmp_path)


async def test_jobs_submitted_with_per_user_tokens_belong_to_their_user(apis: Apis, tmp_path: Path) -> None:
    """Over TCP the token says who submits: 'nobody' owns its job; 'daemon' (another user) neither
    lists, reads nor cancels it; the admin token does."""
    from frenzy_client.daemon_client import DaemonClient

    from .orch_harness import job_dir, request

    admin = (apis.data_dir / "client.token").read_text().strip()
    tok = {u: (await apis.tcp("POST", "/v1/tokens", admin, {"user": u}))[1]["token"]
           for u in ("nobody", "daemon")}
    d = job_dir(tmp_path, "import time\ntime.sleep(600)\n")
    async with DaemonClient(apis.tcp_api.address, tok["nobody"]) as c:
        job = await c.submit(request(d, nproc=1))  # packed here, sent as bytes
    assert job["user"] == "nobody"
    job_id = job["id"]
    status, body = await apis.tcp("GET", "/v1/jobs", tok["nobody"])
    assert [j["id"] for j in body["jobs"]] == [job_id]
    status, body = await apis.tcp("GET", "/v1/jobs", tok["daemon"])
    assert body["jobs"] == []
    for method, path in (("GET", f"/v1/jobs/{job_id}"), ("GET", f"/v1/jobs/{job_id}/events"),
                         ("GET", f"/v1/jobs/{job_id}/results"), ("POST", f"/v1/jobs/{job_id}/cancel")):
        status, body = await apis.tcp(method, path, tok["daemon"])
        assert status == 403, (path, body)
        assert f"job {job_id} belongs to nobody" in body["error"]
        assert "you are daemon" in body["error"]
    status, body = await apis.tcp("GET", "/v1/jobs", admin)
    assert {j["id"]: j["user"] for j in body["jobs"]} == {job_id: "nobody"}
    status, body = await apis.tcp("POST", f"/v1/jobs/{job_id}/cancel", tok["nobody"])
    assert status == 200, body
    assert body["job"]["state"] == "cancelled"


async def test_a_path_is_refused_and_the_payload_cap_holds_on_both_sides(apis: Apis, tmp_path: Path) -> None:
    from frenzy_client.daemon_client import DaemonClient, pack_request
    from frenzyd.errors import FrenzyError, LaunchError

    from .orch_harness import job_dir, request

    admin = (apis.data_dir / "client.token").read_text().strip()
    d = job_dir(tmp_path)
    status, body = await apis.tcp("POST", "/v1/jobs", admin, request(d, nproc=1))  # the old API: a path
    assert status == 400
    assert "the daemon does not read a path on a user's behalf" in body["error"]
    assert (await apis.tcp("GET", "/v1/jobs", admin))[1]["jobs"] == []

    (d / "big.bin").write_bytes(os.urandom(200_000))
    with pytest.raises(LaunchError, match="holds more than 100000 bytes"):
        pack_request(request(d, nproc=1), 100_000)  # the client refuses before sending
    # A client that ignores the daemon's cap is refused by the daemon (413), and nothing is kept.
    apis.orch.submitter.max_payload_bytes = 100_000

    class Careless(DaemonClient):
        async def whoami(self) -> dict[str, Any]:
            return {"max_payload_bytes": 1 << 30}

    async with Careless(apis.tcp_api.address, admin) as c:
        with pytest.raises(FrenzyError, match="over this node's cap of 100000 bytes"):
            await c.submit(request(d, nproc=1))
    assert not list((apis.data_dir / "jobs").glob(".incoming-*"))
    assert (await apis.tcp("GET", "/v1/jobs", admin))[1]["jobs"] == []


def test_a_record_carries_its_owner_only_when_it_has_one() -> None:
    from frenzyd.errors import WireError
    from frenzyd.jobs.model import JobRecord, JobSpec, new_record

    spec = JobSpec(argv=("t.py",), payload_sha256="0" * 64, payload_size=1, python_version="3.11.7",
                   torch_version="2.13.0", nproc=1, mem_per_rank=1)
    old = new_record("j-1", spec, "node", "n0", 1.0)
    assert "owner" not in old.to_dict()  # a record from before owners keeps its bytes
    assert JobRecord.from_dict(old.to_dict()).owner is None
    mine = new_record("j-2", spec, "node", "n0", 1.0, owner=("alice", 1001))
    assert mine.to_dict()["owner"] == {"user": "alice", "uid": 1001}
    back = JobRecord.from_dict(json.loads(json.dumps(mine.to_dict())))
    assert (back.owner, back.owner_uid) == ("alice", 1001)
    for bad in ("alice", {"user": "alice"}, {"user": "", "uid": 1}, {"user": "a", "uid": -1},
                {"user": "a", "uid": True}):
        with pytest.raises(WireError, match="owner"):
            JobRecord.from_dict(old.to_dict() | {"owner": bad})


async def test_token_commands_and_the_users_own_token_file(apis: Apis, tmp_path: Path) -> None:
    """'frenzy-client token issue USER' as an admin; the user's client finds ~/.config/frenzy/token."""
    import asyncio
    import sys

    root = ROOT
    admin_file = apis.data_dir / "client.token"

    async def cli(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith(("FRENZY_", "XDG_"))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "frenzy_client", args[0], "--daemon", apis.tcp_api.address, *args[1:],
            env=e | {"PYTHONPATH": str(root)} | env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode or 0, out.decode(), err.decode()

    home = tmp_path / "home"
    rc, _, err = await cli("whoami", env={"HOME": str(home)})
    assert rc == 1
    assert "needs your API token" in err
    assert str(home / ".config" / "frenzy" / "token") in err
    rc, out, err = await cli("token", "issue", "nobody", "--token-file", str(admin_file), env={})
    assert rc == 0, err
    (home / ".config" / "frenzy").mkdir(parents=True)
    (home / ".config" / "frenzy" / "token").write_text(out)
    rc, out, err = await cli("whoami", "--json", env={"HOME": str(home)})
    assert rc == 0, err
    assert json.loads(out)["user"] == "nobody"
    rc, _, err = await cli("token", "issue", "daemon", env={"HOME": str(home)})  # nobody is no admin
    assert rc == 1
    assert "only an admin may" in err
    rc, out, err = await cli("token", "revoke", "nobody", "--token-file", str(admin_file), env={})
    assert rc == 0, err
    rc, _, err = await cli("whoami", env={"HOME": str(home)})
    assert rc == 1
    assert "wrong API token" in err


async def test_a_payload_larger_than_a_request_body_streams_to_the_job(apis: Apis, tmp_path: Path) -> None:
    """Payloads are not request bodies (1 MiB cap): 3 MiB of random bytes arrive whole and hash-checked."""
    import hashlib

    from frenzy_client.daemon_client import DaemonClient

    from .orch_harness import job_dir, request

    admin = (apis.data_dir / "client.token").read_text().strip()
    d = job_dir(tmp_path, "import time\ntime.sleep(600)\n")
    (d / "big.bin").write_bytes(os.urandom(3 << 20))
    async with DaemonClient(apis.tcp_api.address, admin) as c:
        job = await c.submit(request(d, nproc=1))
        await c.cancel(job["id"])
    rec = apis.orch.store.get(job["id"])
    stored = (apis.orch.store.dir(job["id"]) / "payload.bin").read_bytes()
    assert rec.spec.payload_size == len(stored) > 3 << 20
    assert rec.spec.payload_sha256 == hashlib.sha256(stored).hexdigest()
    assert not list((apis.data_dir / "jobs").glob(".incoming-*"))


async def test_a_payload_that_does_not_match_its_spec_is_refused(apis: Apis, tmp_path: Path) -> None:
    from frenzy_client.daemon_client import pack_request

    from .orch_harness import job_dir, request

    admin = (apis.data_dir / "client.token").read_text().strip()
    spec, payload = pack_request(request(job_dir(tmp_path), nproc=1), 1 << 20)
    with payload:
        data = payload.read()
    for lie, key in (({"payload_sha256": "0" * 64}, "payload_sha256"), ({"payload_size": 1}, "payload_size")):
        form = aiohttp.FormData()
        form.add_field("spec", json.dumps(spec | lie), content_type="application/json")
        form.add_field("payload", data, filename="p", content_type="application/octet-stream")
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {admin}"}) as s, \
                s.post(f"http://{apis.tcp_api.address}/v1/jobs", data=form) as r:
            body = await r.json()
        assert r.status == 400, body
        assert f"does not match its {key}" in body["error"]
    assert apis.orch.store.all() == []
    assert not list((apis.data_dir / "jobs").glob(".incoming-*"))
