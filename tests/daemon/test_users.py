"""Jobs belong to (node, user) (issue 16, DESIGN §8 "Users"), on a real frenzyd with throwaway users.

Two local accounts made for the test (removed after) reach the daemon's unix socket through a
group of their own.  Each runs ``frenzy-client`` (and raw aiohttp requests) as itself: a child of
this process that drops to the user's uid and gids, so the kernel's ``SO_PEERCRED`` names it.
Needs root (useradd, setuid); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, make_pool, wait_until  # noqa: E402

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: makes throwaway local users"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="needs useradd/userdel"),
]

SECRET = "the-secret-" + secrets.token_hex(8)
SHOW = textwrap.dedent(
    """
    import sys, time
    print(open("secret.txt").read().strip(), flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
    """
)


def _preload() -> None:
    """Everything the client imports, loaded before a child drops to a user who cannot read the
    interpreter's own directory (here under /root)."""
    import aiohttp  # noqa: F401

    from frenzy_client import cli

    cli.build_parser()
    for name in ("encodings.idna", "frenzy_client.daemon_client", "frenzy_client.trainer_job",
                 "frenzy_client.results", "frenzyd.payload", "aiohttp.web", "concurrent.futures.thread",
                 "tarfile", "gzip", "tempfile"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass
class Result:
    rc: int
    out: str
    err: str


def _as_user(user: User, fn: Any, cwd: Path) -> Result:
    """Run ``fn() -> int`` in a child process as ``user`` (its stdout/stderr captured)."""
    _preload()
    with tempfile.TemporaryFile() as out_f, tempfile.TemporaryFile() as err_f:
        return _fork_as(user, fn, cwd, out_f, err_f)


def _fork_as(user: User, fn: Any, cwd: Path, out_f: Any, err_f: Any) -> Result:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        rc = 99
        try:
            os.dup2(out_f.fileno(), 1)
            os.dup2(err_f.fileno(), 2)
            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
            os.setgroups([user.gid])
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.environ.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name)
            for k in [k for k in os.environ if k.startswith(("FRENZY_", "XDG_"))]:
                del os.environ[k]
            os.chdir(cwd)
            rc = int(fn())
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # the child reports anything and exits
            print(f"child failed: {exc!r}", file=sys.stderr)
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    out_f.seek(0)
    err_f.seek(0)
    return Result(os.waitstatus_to_exitcode(status), out_f.read().decode(errors="replace"),
                  err_f.read().decode(errors="replace"))


class Lab:
    def __init__(self, base: Path, daemon: Daemon, users: dict[str, User]) -> None:
        self.base, self.daemon, self.users = base, daemon, users

    def cli(self, who: str, *args: str, cwd: Path | None = None) -> Result:
        """``frenzy-client SUB --daemon SOCK ARGS`` as user ``who``."""
        from frenzy_client.cli import run_cli

        argv = [args[0], "--daemon", self.daemon.address, *args[1:]]
        user = self.users[who]
        return _as_user(user, lambda: run_cli(argv), cwd or user.home)

    def raw(self, who: str, method: str, path: str, body: Any = None) -> Result:
        """One HTTP request on the unix socket as ``who``: rc = HTTP status, out = the body."""
        import aiohttp

        sock = str(self.daemon.conf.socket)

        async def go() -> int:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s, \
                    s.request(method, "http://frenzyd" + path, json=body) as r:
                text = (await r.read()).decode(errors="replace")
                sys.stdout.write(json.dumps({"status": r.status, "body": text}))
                return 0

        user = self.users[who]
        return _as_user(user, lambda: asyncio.run(go()), user.home)

    def status_of(self, who: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(HTTP status, JSON body or text) of one request as ``who``."""
        res = self.raw(who, method, path, body)
        assert res.rc == 0, res.err
        got = json.loads(res.out)
        try:
            return got["status"], json.loads(got["body"])
        except ValueError:
            return got["status"], got["body"]

    def job_dir(self, who: str, script: str = SHOW) -> Path:
        """``~who/job`` (0700, the user's): ``show.py`` and a ``secret.txt`` only its owner may read."""
        user = self.users[who]
        d = user.home / "job"
        if d.exists():
            return d
        d.mkdir(mode=0o700)
        (d / "show.py").write_text(script)
        (d / "secret.txt").write_text(f"{SECRET}-{who}\n")
        for p in (d, d / "show.py", d / "secret.txt"):
            os.chown(p, user.uid, user.gid)
        (d / "secret.txt").chmod(0o600)
        return d


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    tag = "frzt" + secrets.token_hex(3)
    base = Path(tempfile.mkdtemp(prefix="frenzy-users-"))
    base.chmod(0o755)  # the users reach the socket under it
    made_users: list[str] = []
    made_group = False
    daemon: Daemon | None = None
    try:
        _run("groupadd", tag)
        made_group = True
        import grp
        import pwd

        gid = grp.getgrnam(tag).gr_gid
        users = {}
        for who in ("alice", "bob"):
            name = f"{tag}{who[0]}"
            home = base / "home" / who
            home.mkdir(parents=True, mode=0o700)
            _run("useradd", "-M", "-N", "-g", tag, "-d", str(home), "-s", "/usr/sbin/nologin", name)
            made_users.append(name)
            uid = pwd.getpwnam(name).pw_uid
            os.chown(home, uid, gid)
            home.chmod(0o700)
            users[who] = User(name, uid, gid, home)
        users["root"] = User("root", 0, 0, Path("/root"))  # an admin (uid 0)
        creds = make_pool(base / "pool", ["n0"])
        daemon = Daemon(NodeConf(name="n0", base=base / "n0", credentials=creds["n0"], devices=[("T4", 2)],
                                 listen="127.0.0.1:0", web="127.0.0.1:0", interfaces=["lo"], mdns=False,
                                 heartbeat_s=0.25, peer_timeout_s=1.0))
        daemon.start()
        wait_until(daemon.status, 60, "frenzyd to answer")
        (base / "n0").chmod(0o755)
        os.chown(daemon.conf.socket, 0, gid)  # the test users' group may connect (mode 0660)
        yield Lab(base, daemon, users)
    except BaseException:
        if daemon is not None:
            print(daemon.log_tail(80))
        raise
    finally:
        if daemon is not None:
            daemon.stop(deadline_s=15)
        for name in made_users:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        if made_group:
            subprocess.run(["groupdel", tag], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _jobs(lab: Lab, who: str) -> dict[str, dict[str, Any]]:
    res = lab.cli(who, "jobs", "--json")
    assert res.rc == 0, res.err
    return {j["id"]: j for j in json.loads(res.out)["jobs"]}


def _state(lab: Lab, job_id: str) -> str | None:
    state = _jobs(lab, "root").get(job_id, {}).get("state")
    return None if state is None else str(state)


def test_the_daemon_never_packs_another_users_directory(lab: Lab) -> None:
    """The finding: bob, in the socket's group, named alice's 0700 directory and got its secret."""
    d = lab.job_dir("alice")
    code, body = lab.status_of("bob", "POST", "/v1/jobs", {
        "workdir": str(d), "argv": ["show.py"], "name": "steal", "nproc": 1, "mem_per_rank": 1 << 30})
    job_id = (body.get("job") or {}).get("id") if isinstance(body, dict) else None
    leaked = ""
    if job_id:  # the daemon took it: see what the job printed
        wait_until(lambda: _state(lab, job_id) in ("succeeded", "failed", "cancelled"), 60, "the job to end")
        leaked = lab.cli("root", "logs", job_id).out
    assert SECRET not in leaked, f"bob read alice's secret through the daemon: {leaked!r}"
    assert code == 400, body
    assert "packs the job's directory" in body["error"]


def test_jobs_belong_to_their_user(lab: Lab) -> None:
    alice = lab.users["alice"]
    d = lab.job_dir("alice")
    res = lab.cli("alice", "run", "--detach", "--json", "--nproc", "1", "--mem-per-rank", "1GiB", "--",
                  "show.py", "600", cwd=d)
    assert res.rc == 0, res.err
    job_id = json.loads(res.out)["id"]
    try:
        wait_until(lambda: _state(lab, job_id) == "running", 60, "alice's job to run")
        wait_until(lambda: SECRET in lab.cli("alice", "logs", job_id).out, 30, "alice's job to print")

        assert job_id in _jobs(lab, "alice")
        wrong = []  # every way bob reached alice's job (all of them, not only the first)
        if job_id in _jobs(lab, "bob"):
            wrong.append("bob lists alice's job")
        res = lab.cli("bob", "logs", job_id)
        if SECRET in res.out or res.rc != 1 or f"job {job_id} belongs to {alice.name}" not in res.err:
            wrong.append(f"bob's 'logs': rc {res.rc}, out {res.out[:80]!r}, err {res.err[-200:]!r}")
        res = lab.cli("bob", "results", job_id, "--out", str(lab.users["bob"].home / "got"))
        if res.rc != 1 or "belongs to" not in res.err:
            wrong.append(f"bob's 'results': rc {res.rc}, err {res.err[-200:]!r}")
        res = lab.cli("bob", "cancel", job_id)
        if res.rc != 1 or "belongs to" not in res.err:
            wrong.append(f"bob's 'cancel': rc {res.rc}, out {res.out[-80:]!r}, err {res.err[-200:]!r}")
        time.sleep(0.5)
        if _state(lab, job_id) != "running":
            wrong.append(f"alice's job is {_state(lab, job_id)} after bob's cancel")
        for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/results", f"/v1/jobs/{job_id}/events"):
            code, body = lab.status_of("bob", "GET", path)
            if code != 403 or "belongs to" not in str(body):
                wrong.append(f"bob's GET {path}: HTTP {code} {str(body)[:100]!r}")
        assert not wrong, "\n".join(wrong)

        root_view = _jobs(lab, "root")  # an admin sees every job, with its owner
        assert root_view[job_id]["user"] == alice.name
        res = lab.cli("alice", "cancel", job_id)
        assert res.rc == 0, res.err
        wait_until(lambda: _state(lab, job_id) == "cancelled", 30, "alice's cancel")
    finally:
        lab.cli("root", "cancel", job_id)


def test_a_user_cannot_ship_a_directory_they_cannot_read(lab: Lab) -> None:
    """bob's own client packs the directory as bob: alice's 0700 directory cannot be read."""
    d = lab.job_dir("alice")
    bob_dir = lab.users["bob"].home
    (bob_dir / "run.py").write_text("print('hi')\n")
    os.chown(bob_dir / "run.py", lab.users["bob"].uid, lab.users["bob"].gid)
    before = set(_jobs(lab, "root"))
    res = lab.cli("bob", "run", "--nproc", "1", "--mem-per-rank", "1GiB", "--", str(d / "show.py"),
                  cwd=bob_dir)
    assert res.rc != 0
    assert SECRET not in res.out + res.err
    assert set(_jobs(lab, "root")) == before
