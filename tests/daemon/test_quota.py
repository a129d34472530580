"""Per-user job quota (issue 16): ``[jobs] max_queued_per_user`` / ``max_active_per_user``, refused at
submit with the limit and how to change it; admins are not limited."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from frenzy_client.daemon_client import DaemonClient
from frenzyd.api.client_api import Quota, quota_refusal
from frenzyd.api.identity import Caller
from frenzyd.errors import FrenzyError
from frenzyd.jobs.model import JobSpec, new_record
from frenzyd.net import auth

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, wait_until  # noqa: E402

SPEC = JobSpec(argv=("t.py",), payload_sha256="ab" * 32, payload_size=1, python_version="3.11.7",
               torch_version="2.13.0", nproc=1, mem_per_rank=1 << 30)
ALICE = Caller(uid=1001, user="alice", groups=frozenset(), admin=False, how="peercred")
ADMIN = dataclasses.replace(ALICE, uid=0, user="root", admin=True)


def _rec(i: int, state: str, uid: int | None) -> Any:
    rec = new_record(f"j{i}", SPEC, "n" * 32, "n0", 1.0, owner=None if uid is None else ("u", uid))
    return dataclasses.replace(rec, state=state)


def test_the_quota_counts_a_users_unfinished_jobs_only() -> None:
    records = [_rec(1, "queued", 1001), _rec(2, "running", 1001), _rec(3, "succeeded", 1001),
               _rec(4, "queued", 1002), _rec(5, "queued", None)]
    daemon_uid = 4242
    assert quota_refusal(Quota(2, 3), records, ALICE, daemon_uid) is None  # 1 queued, 2 unfinished
    why = quota_refusal(Quota(1, 3), records, ALICE, daemon_uid)
    assert why is not None
    assert "1 queued jobs" in why
    assert "[jobs] max_queued_per_user" in why
    why = quota_refusal(Quota(5, 2), records, ALICE, daemon_uid)
    assert why is not None
    assert "2 unfinished (queued or running) jobs" in why
    assert "the limit is 2 ([jobs] max_active_per_user" in why
    assert quota_refusal(Quota(0, 0), records, ALICE, daemon_uid) is None  # 0: no limit
    assert quota_refusal(Quota(1, 1), records, ADMIN, daemon_uid) is None  # admins are not limited
    # A record without an owner is the daemon user's.
    daemon_user = dataclasses.replace(ALICE, uid=daemon_uid)
    assert quota_refusal(Quota(1, 0), records, daemon_user, daemon_uid) is not None


class TcpNodeConf(NodeConf):
    """A test daemon whose client API is on 127.0.0.1 (per-user tokens) instead of a unix socket."""

    client_port: int = 0

    def write(self) -> Path:
        path = super().write()
        text = path.read_text().replace(f'listen = "unix:{self.socket}"',
                                        f'listen = "127.0.0.1:{self.client_port}"')
        path.write_text(text)
        return path


@pytest.mark.timeout(120)
def test_a_user_past_the_quota_is_refused_at_submit_and_admins_are_not(tmp_path: Path) -> None:
    auth.create_pool(tmp_path / "pool")  # what `pool init` / `pool add-node` do, in this process
    creds = {"n0": auth.add_node(tmp_path / "pool", "n0").out_dir}
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    peer, web, client = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    conf = TcpNodeConf(name="n0", base=tmp_path / "n0", credentials=creds["n0"], devices=[],
                       listen=f"127.0.0.1:{peer}", web=f"127.0.0.1:{web}", mdns=False,
                       extra_toml="[jobs]\nmax_queued_per_user = 2\nmax_active_per_user = 3\n")
    conf.client_port = client
    daemon = Daemon(conf)
    address = f"127.0.0.1:{client}"
    job = tmp_path / "job"
    job.mkdir()
    (job / "t.py").write_text("print('hi')\n")
    request = {"workdir": str(job), "argv": ["t.py"], "name": "q", "nproc": 1, "mem_per_rank": 1 << 30}

    async def scenario() -> None:
        token_file = conf.data_dir / "client.token"
        admin = DaemonClient(address, token_file.read_text().strip())
        async with admin:
            nobody = DaemonClient(address, (await admin.issue_token("nobody"))["token"])
            async with nobody:
                assert not (await nobody.whoami())["admin"]
                first = [await nobody.submit(request) for _ in range(2)]
                assert {j["state"] for j in first} == {"queued"}  # no GPUs: they wait
                with pytest.raises(FrenzyError) as info:
                    await nobody.submit(request)
                msg = str(info.value)
                assert "quota: nobody has 2 queued jobs on this node and the limit is 2" in msg
                assert "[jobs] max_queued_per_user" in msg
                assert len([j for j in await admin.jobs() if j.get("user") == "nobody"]) == 2  # nothing made
                for _ in range(3):  # an admin is not limited
                    await admin.submit(request)
                await nobody.cancel(first[0]["id"])  # a cancelled job no longer counts
                await nobody.submit(request)

    try:
        daemon.start()
        wait_until(lambda: (conf.data_dir / "client.token").exists() and _answers(client), 30, "frenzyd")
        asyncio.run(scenario())
    except BaseException:
        print(daemon.log_tail(60))
        raise
    finally:
        daemon.kill()
        daemon.stop(deadline_s=5)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True

