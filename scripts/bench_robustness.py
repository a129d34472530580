#!/usr/bin/env python3
"""Robustness benchmark (issue 16's proof): who is refused, what never crashes, how a flood hurts.

Real daemons (``frenzyd --config``), real TLS, real network namespaces, throwaway local users:

* **client API** -- every route of the real client router (``frenzyd.api.client_api``, read from
  the aiohttp router, not a hand list) x {no credentials, another user, owner, admin}, on the unix
  socket (a daemon in a namespace; callers are child processes that drop to throwaway accounts,
  so ``SO_PEERCRED`` names them; "no credentials" is an account outside the socket's group) and
  on TCP (a second daemon on 127.0.0.1; "no credentials" is no token and a wrong token, "another
  user" and "owner" are per-user tokens issued to the throwaway accounts, admin the admin token).
  The job the routes name belongs to the owner.  Counted: requests **accepted where they must be
  refused** (target 0; listing counts as accepted when it shows the owner's job) and **legitimate
  requests refused** (401/403 or no connection; target 0).
* **peer messages** -- every registered wire kind (``frenzyd.net.messages`` and the job kinds that
  share ``wire.KINDS``) x {foreign CA, revoked, stale term, stale attempt, wrong addressee, replay},
  sent from another namespace at the daemon that submitted, coordinates and runs a live job:
  ``foreign_ca`` by another pool's node; ``revoked`` by a member removed with ``frenzy-client pool
  remove-node`` (n/a when that command fails); ``stale_term``, ``stale_attempt`` and
  ``wrong_addressee`` (a job or GPU this node does not have, a heartbeat in another node's name) by
  the node that legitimately sends the kind, so only that field is wrong; ``replay`` a copy of the
  legitimate sender's frame (orders keep the coordinator's signature over the exact bytes) re-sent
  by another member.  Verdicts: *refused* (TLS refusal, an ``error`` frame, ``ok: false``),
  *acknowledged* (a bare ``ok`` and nothing changed) and **accepted** (target 0): the answer gave
  something away (payload bytes, an attempt number) or the job or node changed (state, attempt,
  files under its directory, leases, term, coordinator, rank processes).  After a change the live
  job is replaced, so one acceptance does not hide the next.  Cells whose column does not apply
  are n/a with the reason (``NOT_APPLICABLE``).
* **fuzz** -- seeded inputs per surface: wire frames (sent over mutual TLS to the daemon),
  ``predict`` model configs, ``simulate`` traces and clusters, and frenzyd config files (each through
  the real CLI/loader in a worker process).  Crashes (target 0): the process exited, a traceback
  (an exception that is not a documented ``FrenzyError``/usage error, or ``Traceback`` in the
  daemon's log), an HTTP 500, or the daemon's event loop blocked over 1 s (a probe thread asks
  the daemon's unix socket every 50 ms; its slowest answer is reported).
* **flood** -- latency of legitimate requests (a member's heartbeat on a fresh and on a kept-alive
  TLS connection, from its own namespace; ``GET /v1/status`` on the unix socket) idle vs under 1,000 idle
  connections to the TLS port (from 64 addresses in another namespace, each reopened a second
  after the daemon closes it) plus 100 handshakes/s with another pool's certificate (a third
  namespace), in one run (target p50 and p95 <= 2x idle); the daemon's RSS before, at peak and
  after the flood.

Prints the table and writes JSON (``--out``).  ``--tiny`` (CI) uses fewer cases and a shorter
flood.  Namespaces and users need root and iproute2: without them the parts that need them are
reported as skipped (a failure when ``FRENZY_REQUIRE_NETNS=1``) and the in-process fuzz still runs.

    python scripts/bench_robustness.py [--tiny] [--out FILE.json] [--seed S] [--fuzz N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.client
import io
import json
import math
import os
import random
import resource
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
for _p in (str(SCRIPTS), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _pool import Daemon, NodeConf, env, make_pool, wait_until  # noqa: E402
from benchmeta import provenance, write_results  # noqa: E402

PY = sys.executable
PEER_PORT = 7470
HANG_S = 10
"""An in-process fuzz input still running after this many seconds is stopped and counted as a crash
(a hang); one over ``SLOW_S`` is reported as slow."""
SLOW_S = 1.0
"""An answer slower than this means the daemon's event loop was blocked (a crash by the issue's rule)."""
COLUMNS = ("foreign_ca", "revoked", "stale_term", "stale_attempt", "wrong_addressee", "replay")
IDENTITIES = ("none", "other", "owner", "admin")

# ----------------------------------------------------------------------------- HTTP on unix and TCP


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("frenzyd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self._path)
        except OSError:
            s.close()
            raise
        self.sock = s


def http_call(
    target: str,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    timeout: float = 20.0,
) -> tuple[int, bytes]:
    """One request to ``unix:/path`` or ``host:port``; status -1 when no connection could be made."""
    if target.startswith("unix:"):
        conn: http.client.HTTPConnection = _UnixConnection(target[5:], timeout)
    else:
        host, _, port = target.rpartition(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        try:
            conn.connect()
        except OSError:
            return -1, b""
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def multipart(spec: dict[str, Any], payload: bytes) -> tuple[str, bytes]:
    """A ``spec`` + ``payload`` multipart body as ``frenzy-client run`` sends it."""
    b = "rb" + secrets.token_hex(8)
    parts = [
        f'--{b}\r\nContent-Disposition: form-data; name="spec"\r\n'.encode()
        + b"Content-Type: application/json\r\n\r\n"
        + json.dumps(spec).encode()
        + b"\r\n",
        f'--{b}\r\nContent-Disposition: form-data; name="payload"; filename="payload.tar.gz"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + payload
        + b"\r\n",
        f"--{b}--\r\n".encode(),
    ]
    return f"multipart/form-data; boundary={b}", b"".join(parts)


# ----------------------------------------------------------------------------- throwaway accounts


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {res.stderr.strip()}")
    return res


@contextlib.contextmanager
def throwaway_users(base: Path, tag: str) -> Iterator[tuple[dict[str, User], int]]:
    """Accounts ``owner`` and ``other`` in a new group (which may open the socket) and ``stranger``
    outside it; removed afterwards.  Yields (users, the group's gid)."""
    import grp
    import pwd

    made: list[str] = []
    group = False
    try:
        _sh("groupadd", tag)
        group = True
        gid = grp.getgrnam(tag).gr_gid
        users = {}
        for role, letter in (("owner", "o"), ("other", "b"), ("stranger", "s")):
            name = f"{tag}{letter}"
            home = base / "home" / role
            home.mkdir(parents=True)
            argv = ["useradd", "-M", "-N", "-d", str(home), "-s", "/usr/sbin/nologin", name]
            if role != "stranger":
                argv[1:1] = ["-g", tag]
            _sh(*argv)
            made.append(name)
            pw = pwd.getpwnam(name)
            os.chown(home, pw.pw_uid, pw.pw_gid)
            home.chmod(0o700)
            users[role] = User(name, pw.pw_uid, pw.pw_gid, home)
        yield users, gid
    finally:
        for name in made:
            _sh("userdel", name, check=False)
        if group:
            _sh("groupdel", tag, check=False)


def as_user(user: User | None, fn: Callable[[], Any], cwd: Path | None = None) -> Any:
    """``fn()``'s JSON-able result, computed in a child process running as ``user`` (None: this
    process's user, still in a child so a crash cannot take the benchmark down)."""
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            if user is not None:
                os.setgroups([user.gid])
                os.setgid(user.gid)
                os.setuid(user.uid)
                os.environ.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name)
            if cwd is not None or user is not None:
                os.chdir(cwd or user.home)  # type: ignore[union-attr]
            out = json.dumps({"ok": fn()}).encode()
        except BaseException as exc:  # reported to the parent
            out = json.dumps({"error": f"{exc!r}", "tb": traceback.format_exc()[-2000:]}).encode()
            code = 1
        with os.fdopen(w, "wb") as f:
            f.write(out)
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    got = json.loads(data or b'{"error": "no answer"}')
    if "error" in got:
        raise RuntimeError(
            f"child as {user.name if user else 'self'} failed: {got['error']}\n{got.get('tb')}"
        )
    return got["ok"]


# ----------------------------------------------------------------------------- client API matrix


def client_routes() -> list[tuple[str, str]]:
    """(method, path template) of every route of the real client API router."""
    from frenzyd.api.client_api import build_client_app

    app = build_client_app(None, dict, None, None)  # type: ignore[arg-type]  # only the router is read
    out = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        out.append((route.method, str(path)))
    return out


def route_rule(method: str, path: str) -> str:
    """Who may call a route, from the documented rules (SECURITY.md "Users and jobs"):
    ``admin`` (token management), ``owner`` (a job's record, output, results, cancel: its owner or
    an admin), ``user`` (any identified caller; listing shows only their own jobs)."""
    if path.startswith("/v1/tokens"):
        return "admin"
    if "{job_id}" in path:
        return "owner"
    return "user"


def expected(rule: str, ident: str) -> bool:
    """Whether ``ident`` may call a route under ``rule``."""
    if ident == "none":
        return False
    if rule == "admin":
        return ident == "admin"
    if rule == "owner":
        return ident in ("owner", "admin")
    return True


def route_request(method: str, path: str, ident: str, ctx: dict[str, Any]) -> dict[str, Any]:
    """The concrete request for one cell: path filled in, body for POSTs."""
    concrete = path.replace("{job_id}", ctx["job"])
    body: dict[str, Any] = {"method": method, "path": concrete, "body": "", "ctype": None}
    if "{user}" in path:
        # Legit: the admin revokes the stranger's token (issued first); refused ones aim at the owner's.
        body["path"] = path.replace("{user}", ctx["stranger"] if expected("admin", ident) else ctx["owner"])
    if method == "POST" and path == "/v1/tokens":
        body["body"] = json.dumps({"user": ctx["stranger"] if ident == "admin" else ctx["other"]})
        body["ctype"] = "application/json"
    elif method == "POST" and path == "/v1/jobs":
        body["submit"] = True
    return body


def _call_cells(
    target: str, token: str | None, cells: list[dict[str, Any]], jobdir: str
) -> list[dict[str, Any]]:
    """Run cells' requests in order (in whatever process and as whatever user this is called)."""
    out = []
    for c in cells:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        body = c["body"].encode()
        if c.get("submit"):
            from frenzy_client.daemon_client import pack_request

            spec, f = pack_request(
                {
                    "workdir": jobdir,
                    "argv": ["quick.py"],
                    "name": "rb-submit",
                    "nproc": 1,
                    "mem_per_rank": 1 << 30,
                },
                1 << 20,
            )
            with f:
                ctype, body = multipart(spec, f.read())
            headers["Content-Type"] = ctype
        elif c["ctype"]:
            headers["Content-Type"] = c["ctype"]
        t0 = time.perf_counter()
        try:
            status, data = http_call(target, c["method"], c["path"], headers=headers, body=body, timeout=20)
        except (OSError, http.client.HTTPException) as exc:
            status, data = -2, repr(exc).encode()
        out.append(
            {
                **c,
                "status": status,
                "reply": data[:4000].decode(errors="replace"),
                "ms": (time.perf_counter() - t0) * 1e3,
            }
        )
    return out


def client_matrix(
    surface: str, target: str, callers: dict[str, tuple[User | None, str | None]], ctx: dict[str, Any]
) -> dict[str, Any]:
    """Every route x identity on one listener; ``callers[ident]`` = (account to run as, token)."""
    routes = client_routes()
    plan: dict[str, list[dict[str, Any]]] = {i: [] for i in callers}
    order = []
    for method, path in routes:
        rule = route_rule(method, path)
        for ident in callers:
            cell = route_request(method, path, ident, ctx) | {
                "route": f"{method} {path}",
                "ident": ident,
                "rule": rule,
                "legit": expected(rule, ident),
            }
            order.append(cell)

    # Refusals first (they must change nothing), then legitimate calls; cancels last, the owner's first.
    def rank(c: dict[str, Any]) -> tuple[int, int, int]:
        cancel = c["path"].endswith("/cancel")
        return (int(c["legit"]), int(cancel), IDENTITIES.index(c["ident"]))

    order.sort(key=rank)
    results: list[dict[str, Any]] = []
    for phase in (False, True):
        for ident, (user, token) in callers.items():
            cells = [c for c in order if c["legit"] == phase and c["ident"] == ident]
            # cancels are run after every other call of this phase (below)
            plan[ident] = [c for c in cells if not c["path"].endswith("/cancel")]
            if plan[ident]:
                jd = str(user.home / "job") if user else ctx["jobdir"]
                results += as_user(user, functools.partial(_call_cells, target, token, plan[ident], jd))
        for ident in sorted(callers, key=IDENTITIES.index):
            user, token = callers[ident]
            cells = [
                c
                for c in order
                if c["legit"] == phase and c["ident"] == ident and c["path"].endswith("/cancel")
            ]
            if cells:
                jd = str(user.home / "job") if user else ctx["jobdir"]
                results += as_user(user, functools.partial(_call_cells, target, token, cells, jd))
    rows = []
    for c in results:
        refused = c["status"] in (-1, 401, 403)
        # Listing is every identified user's, but must not show another user's job.
        leaked = (
            c["route"] in ("GET /v1/jobs", "HEAD /v1/jobs")
            and c["ident"] not in ("owner", "admin")
            and ctx["job"] in c["reply"]
        )
        wrongly_accepted = (not c["legit"] and not refused) or leaked
        wrongly_refused = c["legit"] and refused
        rows.append(
            {
                "surface": surface,
                "route": c["route"],
                "ident": c["ident"],
                "rule": c["rule"],
                "legit": c["legit"],
                "status": c["status"],
                "wrongly_accepted": wrongly_accepted,
                "wrongly_refused": wrongly_refused,
                "server_error": c["status"] >= 500,
                "ms": round(c["ms"], 2),
                "reply": c["reply"][:200],
            }
        )
    return {"surface": surface, "routes": [f"{m} {p}" for m, p in routes], "cells": rows}


# ----------------------------------------------------------------------------- peer frames


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def peer_kinds() -> list[str]:
    """Every registered peer message kind (the peer layer's and the job layer's)."""
    import frenzyd.jobs.messages
    import frenzyd.net.messages  # noqa: F401
    from frenzyd.net import wire

    return sorted(wire.KINDS)


def base_body(kind: str, j: dict[str, Any], sender_id: str) -> dict[str, Any] | None:
    """A well-formed body of ``kind`` about the live job's current attempt and term."""
    job, att, term, rec = j["job"], j["attempt"], j["term"], j["record"]
    data = _tar_gz({"result.json": b'{"injected": true}'})
    bodies: dict[str, dict[str, Any]] = {
        "heartbeat": {
            "node_id": sender_id,
            "name": "rb-member",
            "address": j["member_address"],
            "priority": 0,
            "term": term,
            "coordinator": j["node_id"],
            "report": {},
        },
        "ok": {"detail": "rb"},
        "error": {"reason": "rb", "detail": "rb"},
        "job.submit": {"record": rec},
        "job.cancel": {"job_id": job},
        "job.state": {"record": dict(rec, state="failed")},
        "job.attempt": {"job_id": job, "term": term, "after": att},
        "lease.request": {"job_id": job, "attempt": att, "gpus": [j["free_gpu"]], "term": term},
        "lease.release": {"job_id": job, "attempt": att, "term": term},
        "job.launch": {
            "job_id": job,
            "attempt": att,
            "term": term,
            "record": rec,
            "master_addr": j["address_ip"],
            "master_port": 29450,
            "start_store": True,
            "backend": "gloo",
        },
        "job.stop": {"job_id": job, "attempt": att, "term": term},
        "payload.fetch": {"job_id": job, "attempt": att, "offset": 0, "length": 4096},
        "job.output": {"job_id": job, "attempt": att, "chunks": [[0, "stdout", b"RB-INJECTED\n"]]},
        "job.results": {"job_id": job, "attempt": att, "offset": 0, "total": len(data), "data": data},
        "job.checkpoint": {
            "job_id": job,
            "attempt": att,
            "step": 1,
            "hosts": 1,
            "offset": 0,
            "total": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "data": data,
        },
        "job.exit": {"job_id": job, "attempt": att, "term": term, "codes": [[0, 1]], "peer": j["node_id"]},
        "job.finished": {"job_id": job, "attempt": att},
    }
    if kind in bodies:
        return bodies[kind]
    return schema_body(kind, j)


def schema_body(kind: str, j: dict[str, Any]) -> dict[str, Any]:
    """A body for a kind this benchmark has no hand-made one for (a kind added later): every required
    field of its registered schema, about the live job where the name says so."""
    from frenzyd.net import wire

    named: dict[str, Any] = {
        "job_id": j["job"],
        "attempt": j["attempt"],
        "term": j["term"],
        "node_id": j["node_id"],
    }
    plain: dict[type, Any] = {str: "rb", int: 0, float: 0.0, bool: False, bytes: b"", list: [], dict: {}}
    out: dict[str, Any] = {}
    for key, typ in wire.KINDS[kind].required.items():
        first = typ[0] if isinstance(typ, tuple) else typ
        out[key] = named[key] if key in named else plain.get(first)
    return out


NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("stale_term", "job.exit"): "a report, fenced by attempt: a running attempt outlives a change of "
    "coordinator, so its exit report rightly carries the older term it was launched under",
    ("wrong_addressee", "job.submit"): "one daemon is submitter and coordinator: no other addressee to name",
    ("wrong_addressee", "job.state"): "one daemon is submitter and coordinator: no other addressee to name",
    ("wrong_addressee", "job.cancel"): "one daemon is submitter and coordinator: no other addressee to name",
}
"""Cells that do not test what their column means, and why (reported as n/a with the reason)."""


def mutate_for(column: str, kind: str, body: dict[str, Any], j: dict[str, Any]) -> dict[str, Any] | None:
    """The column's version of ``body`` (None: the column does not apply to this kind)."""
    if (column, kind) in NOT_APPLICABLE:
        return None
    b = dict(body)
    if column == "stale_term":
        if "term" not in b:
            return None
        b["term"] = max(0, j["term"] - 1)
        if kind == "heartbeat":
            b["coordinator"] = b["node_id"]  # and claims the role at the stale term
        return b
    if column == "stale_attempt":
        if "attempt" not in b:
            return None
        b["attempt"] = j["attempt"] - 1
        if "record" in b:
            b["record"] = dict(b["record"], attempt=j["attempt"] - 1)
        return b
    if column == "wrong_addressee":
        if kind == "heartbeat":
            b["node_id"] = j["other_member_id"]  # a heartbeat in another node's name
            return b
        if kind == "lease.request":
            b["gpus"] = ["GPU-not-on-this-node"]
            return b
        if "job_id" in b:
            b["job_id"] = j["foreign_job"]  # a job this node never submitted, runs or places
            if "record" in b:
                b["record"] = dict(b["record"], id=j["foreign_job"])
            return b
        if "record" in b:
            b["record"] = dict(b["record"], id=j["foreign_job"])
            return b
        return None
    return b  # foreign_ca, revoked, replay: the body as the legitimate sender would write it


# ----------------------------------------------------------------------------- fuzz mutators (pure)

WEIRD_JSON: list[Any] = [
    0,
    -1,
    1,
    2,
    2**31,
    2**63,
    2**64 + 1,
    -(2**63),
    10**30,
    1e308,
    -1e308,
    0.5,
    -0.0,
    float("nan"),
    float("inf"),
    "",
    "x",
    "1",
    "a" * 300,
    None,
    True,
    False,
    [],
    {},
    [1],
    {"a": 1},
    [[[]]],
    "\u0000",
    "\ud7ff",
]
WEIRD_TOML = [
    "0",
    "-1",
    "1",
    "1e400",
    "-inf",
    "inf",
    "nan",
    '"x"',
    '""',
    "[]",
    "{}",
    "true",
    "false",
    "99999999999999999999",
    "-9223372036854775809",
    '"../../etc/passwd"',
    '"0.0.0.0:99999"',
    '"unix:relative.sock"',
    '[1, "a"]',
    "{a = 1}",
    "0.5",
    '"A100-80GB"',
    '"\\u0000"',
    "1979-05-27",
    "[[1]]",
    '"' + "a" * 300 + '"',
]
WEIRD_CSV = [
    "",
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e309",
    "x",
    "2017-13-45 99:99:99",
    "99999999999",
    "1.5",
    "2017-10-01 00:00:00",
    "1e-300",
    "\u0000",
    '"',
    ",",
]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if op == 0 and out:
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            i = rng.randrange(len(out))
            out[i] = rng.randrange(256)
        elif op == 2:
            i = rng.randrange(len(out) + 1)
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and out:
            i = rng.randrange(len(out))
            del out[i : i + rng.randint(1, 16)]
        elif op == 4 and out:
            del out[rng.randrange(len(out) + 1) :]
        elif out:
            i = rng.randrange(len(out))
            j = rng.randrange(i, min(len(out), i + 64) + 1)
            out[i:i] = out[i:j] * rng.randint(1, 20)
    return bytes(out)


def mutate_json_obj(rng: random.Random, obj: Any, depth: int = 0) -> Any:
    """Replace, add or delete a random key deep in a JSON-like value."""
    if isinstance(obj, dict) and obj and depth < 4:
        key = rng.choice(sorted(obj, key=str))
        r = rng.random()
        out = dict(obj)
        if r < 0.15:
            del out[key]
        elif r < 0.25:
            out[f"k{rng.randrange(100)}"] = rng.choice(WEIRD_JSON)
        elif r < 0.5 and isinstance(obj[key], dict | list):
            out[key] = mutate_json_obj(rng, obj[key], depth + 1)
        else:
            out[key] = rng.choice(WEIRD_JSON)
        return out
    if isinstance(obj, list) and obj and depth < 4:
        out_l = list(obj)
        i = rng.randrange(len(out_l))
        out_l[i] = mutate_json_obj(rng, out_l[i], depth + 1) if rng.random() < 0.5 else rng.choice(WEIRD_JSON)
        return out_l
    return rng.choice(WEIRD_JSON)


def mutate_lines(rng: random.Random, text: str, weird: list[str], sep: str) -> str:
    """Line-level mutations of a TOML (``sep`` = "=") or CSV (``sep`` = ",") text."""
    lines = text.splitlines()
    for _ in range(rng.randint(1, 3)):
        if not lines:
            lines.append(rng.choice(weird))
            continue
        i = rng.randrange(len(lines))
        op = rng.randrange(6)
        line = lines[i]
        if op <= 2 and sep in line:
            if sep == "=":
                key, _, _ = line.partition("=")
                lines[i] = f"{key}= {rng.choice(weird)}"
            else:
                cells = line.split(",")
                cells[rng.randrange(len(cells))] = rng.choice(weird)
                lines[i] = ",".join(cells)
        elif op == 3:
            del lines[i]
        elif op == 4:
            lines.insert(i, line)
        else:
            lines.insert(
                i,
                rng.choice(
                    [
                        "[network]",
                        "[[devices]]",
                        "[types.X]",
                        "[[nodes]]",
                        "[node]",
                        "[timing]",
                        "timestamp,duration,num_gpus,gpu_time,cluster",
                        "x = 1",
                        "a,b",
                    ]
                ),
            )
    return "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")


def mutate_text(rng: random.Random, text: str, kind: str) -> bytes:
    if rng.random() < 0.3:
        return mutate_bytes(rng, text.encode())
    if kind == "json":
        try:
            obj = json.loads(text)
        except ValueError:
            return mutate_bytes(rng, text.encode())
        for _ in range(rng.randint(1, 3)):
            obj = mutate_json_obj(rng, obj)
        return json.dumps(obj).encode()
    if kind == "toml":
        return mutate_lines(rng, text, WEIRD_TOML, "=").encode()
    return mutate_lines(rng, text, WEIRD_CSV, ",").encode()


def mutate_msgpack_body(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    weird: list[Any] = [
        0,
        -1,
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        1.5,
        float("nan"),
        "",
        "x" * 200,
        b"",
        b"\x00" * 64,
        None,
        True,
        [],
        {},
        [[[]]],
        {"a": {"b": {}}},
        ["x"] * 50,
        "../../etc",
        "j-1",
    ]
    out = dict(body)
    for _ in range(rng.randint(1, 3)):
        r = rng.random()
        if r < 0.2 and out:
            del out[rng.choice(sorted(out))]
        elif r < 0.3:
            out[f"x{rng.randrange(10)}"] = rng.choice(weird)
        elif out:
            key = rng.choice(sorted(out))
            val = out[key]
            if isinstance(val, dict) and val and rng.random() < 0.5:
                out[key] = mutate_msgpack_body(rng, val)
            else:
                out[key] = rng.choice(weird)
    return out


# ----------------------------------------------------------------------------- in-process fuzz workers

SEED_TRACE = "timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
    f"2017-10-03 {8 + i // 12:02d}:{(i * 5) % 60:02d}:00,{600 + 137 * i},{1 + i % 4},"
    f"{(600 + 137 * i) * (1 + i % 4)},c1\n"
    for i in range(40)
)
SEED_CLUSTER = (ROOT / "frenzyd" / "sim" / "data" / "lab.toml").read_text() + (
    '\n[types.MYGPU]\nmemory_gib = 24\nspeed = 1.3\n\n[[nodes]]\nname = "ws-x"\ngpus = { MYGPU = 2 }\n'
)
SEED_CONFIG = """\
[node]
name = "ws-01"
data_dir = "/tmp/frenzy-fuzz-data"
priority = 0

[network]
listen = "0.0.0.0:7470"
interfaces = []
peers = ["10.0.0.2:7470"]
mdns = true
max_unauthenticated = 256
handshake_timeout_s = 5.0

[pool]
credentials = "/etc/frenzy/node"

[client]
listen = "unix:/run/frenzy/client.sock"

[web]
listen = "127.0.0.1:7480"
idle_timeout_s = 15.0

[timing]
heartbeat_s = 0.5
peer_timeout_s = 2.0

[launcher]
rendezvous_ports = [29400, 29499]

[[devices]]
type = "A100-80GB"
count = 2
"""


def _fuzz_cases(surface: str, n: int, seed: int) -> Iterator[tuple[int, bytes, list[str]]]:
    """(index, file content, extra CLI args) for each input of a surface."""
    rng = random.Random(f"{surface}:{seed}")
    presets = sorted((ROOT / "frenzyd" / "marp" / "presets").glob("*.json"))
    for i in range(n):
        if surface == "predict":
            seed_text = rng.choice(presets).read_text()
            args = [
                "--seq-len",
                str(rng.choice([1, 16, 128, 512, 0, -1, 10**7])),
                "--micro-batch",
                str(rng.choice([1, 2, 4, 0])),
                "--dtype",
                rng.choice(["fp32", "bf16", "bf16-mixed"]),
            ]
            if rng.random() < 0.3:
                args += ["--gpus", rng.choice(["T4:2", "A100-80GB:4,RTX-3090:8", "H100-80GB:8"])]
            if rng.random() < 0.3:
                args += ["--tp", str(rng.choice([1, 2, 3])), "--zero", str(rng.choice([0, 1, 3]))]
            yield i, mutate_text(rng, seed_text, "json"), args
        elif surface == "simulate_trace":
            yield i, mutate_text(rng, SEED_TRACE, "csv"), []
        elif surface == "simulate_cluster":
            yield i, mutate_text(rng, SEED_CLUSTER, "toml"), []
        elif surface == "config":
            yield i, mutate_text(rng, SEED_CONFIG, "toml"), []
        else:
            raise ValueError(surface)


class Hang(BaseException):
    """Raised in a fuzz worker by SIGALRM: the input ran past ``HANG_S`` (a BaseException, so the code
    under test cannot swallow it as an error of its own)."""


def _hang(signum: int, frame: Any) -> None:
    raise Hang


def role_fuzz(spec: dict[str, Any]) -> dict[str, Any]:
    """Worker: run ``spec['n']`` inputs of one surface through the real entry point; documented
    errors (FrenzyError, argparse's usage exit) are fine, anything else is a crash."""
    import logging

    from frenzy_client.cli import run_cli
    from frenzyd.config import load_config
    from frenzyd.errors import FrenzyError

    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGALRM, _hang)
    surface, n, seed = spec["surface"], spec["n"], spec["seed"]
    work = Path(tempfile.mkdtemp(prefix=f"rb-fuzz-{surface}-"))
    counts: Counter[str] = Counter()
    crashes: list[dict[str, Any]] = []
    slowest = 0.0
    slow = 0
    devnull = open(os.devnull, "w")  # noqa: SIM115
    try:
        for i, content, extra in _fuzz_cases(surface, n, seed):
            path = work / (
                "in.json" if surface == "predict" else "in.csv" if surface == "simulate_trace" else "in.toml"
            )
            path.write_bytes(content)
            if surface == "predict":
                argv = ["predict", "--model", str(path), *extra, "--json"]
            elif surface == "simulate_trace":
                (work / "c.toml").write_text(SEED_CLUSTER)
                argv = [
                    "simulate",
                    "--trace",
                    str(path),
                    "--cluster",
                    str(work / "c.toml"),
                    "--policy",
                    "fifo",
                    "--jobs",
                    "4",
                    "--json",
                ]
            elif surface == "simulate_cluster":
                (work / "t.csv").write_text(SEED_TRACE)
                argv = [
                    "simulate",
                    "--trace",
                    str(work / "t.csv"),
                    "--cluster",
                    str(path),
                    "--policy",
                    "fifo",
                    "--jobs",
                    "4",
                    "--json",
                ]
            else:
                argv = []
            t0 = time.perf_counter()
            signal.alarm(HANG_S)
            try:
                with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
                    if surface == "config":
                        load_config(path, env={}, ifaddr=lambda _name: "10.0.0.1")
                        rc = 0
                    else:
                        rc = run_cli(argv)
                counts["ok" if rc == 0 else "refused"] += 1
            except Hang:
                counts["crash"] += 1
                counts["hang"] += 1
                if len(crashes) < 20:
                    crashes.append(
                        {
                            "i": i,
                            "error": f"hang: still running after {HANG_S} s",
                            "where": traceback.format_exc().splitlines()[-6:-1],
                            "input": content[:2000].decode(errors="replace"),
                            "args": extra,
                        }
                    )
            except FrenzyError:
                counts["refused"] += 1
            except SystemExit as exc:
                if exc.code == 2:
                    counts["usage"] += 1
                else:
                    counts["crash"] += 1
                    crashes.append(
                        {
                            "i": i,
                            "error": f"SystemExit({exc.code!r})",
                            "input": content[:2000].decode(errors="replace"),
                        }
                    )
            except Exception as exc:
                counts["crash"] += 1
                if len(crashes) < 20:
                    crashes.append(
                        {
                            "i": i,
                            "error": f"{type(exc).__name__}: {str(exc)[:200]}",
                            "where": traceback.format_exc().splitlines()[-3:],
                            "input": content[:2000].decode(errors="replace"),
                            "args": extra,
                        }
                    )
            finally:
                signal.alarm(0)
            dt = time.perf_counter() - t0
            slowest = max(slowest, dt)
            slow += dt > SLOW_S
    finally:
        devnull.close()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "surface": surface,
        "n": n,
        "seed": seed,
        "counts": dict(counts),
        "crashes": crashes,
        "slowest_s": round(slowest, 3),
        "slow_inputs": slow,
    }


class FuzzWorkers:
    """The in-process fuzz surfaces, each in its own worker process (an exit or a kill is a crash
    too), all at once; ``collect`` waits for them."""

    SURFACES = ("predict", "simulate_trace", "simulate_cluster", "config")

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Any, Any, float]] = {}
        self.results: dict[str, Any] | None = None

    def start(self) -> FuzzWorkers:
        for surface in self.SURFACES:
            spec = json.dumps({"surface": surface, "n": self.n, "seed": self.seed})
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
            proc = subprocess.Popen(
                ["nice", "-n", "5", PY, str(Path(__file__).resolve()), "_role", "fuzz", spec],
                stdout=out,
                stderr=err,
                env=env(),
                start_new_session=True,
            )
            self.procs[surface] = (proc, out, err, time.monotonic())
        return self

    def collect(self, timeout: float = 3600.0) -> dict[str, Any]:
        if self.results is not None:
            return self.results
        self.results = {}
        deadline = time.monotonic() + timeout
        for surface, (proc, out, err, t0) in self.procs.items():
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
            out.seek(0)
            err.seek(0)
            got = _last_json(out.read().decode(errors="replace"))
            stderr = err.read().decode(errors="replace")
            out.close()
            err.close()
            wall = round(time.monotonic() - t0, 1)
            if code != 0 or got is None:
                got = {
                    "surface": surface,
                    "n": self.n,
                    "seed": self.seed,
                    "counts": {"crash": 1},
                    "exited": code,
                    "crashes": [{"error": f"worker exited {code}", "stderr": stderr[-2000:]}],
                }
            self.results[surface] = got | {"wall_s": wall}
        return self.results


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            got = json.loads(line)
            if isinstance(got, dict):
                return got
    return None


# ----------------------------------------------------------------------------- namespaced roles


def _creds(path: str) -> Any:
    from frenzyd.net import auth

    return auth.load_credentials(Path(path))


def _client_ctx(creds: Any) -> ssl.SSLContext:
    from frenzyd.net import tls

    return tls.client_context(creds)


def _post_frame(
    target: str,
    ctx: ssl.SSLContext,
    frame: bytes,
    timeout: float = 10.0,
    conn: http.client.HTTPSConnection | None = None,
) -> tuple[int, bytes, str]:
    """POST one frame over mutual TLS; (status, reply, refusal) -- status -1 when TLS refused us."""
    host, _, port = target.rpartition(":")
    own = conn is None
    c = conn or http.client.HTTPSConnection(host, int(port), timeout=timeout, context=ctx)
    try:
        c.request("POST", "/v1/msg", body=frame, headers={"Content-Type": "application/x-frenzy-frame"})
        resp = c.getresponse()
        return resp.status, resp.read(), ""
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError) as exc:
        return -1, b"", type(exc).__name__
    finally:
        if own:
            c.close()


def _unix_json(sock: str, path: str) -> Any:
    status, data = http_call("unix:" + sock, "GET", path, timeout=20)
    if status != 200:
        return None
    return json.loads(data)


def _job_fingerprint(sock: str, job: str, data_dir: str, foreign_job: str = "") -> dict[str, Any]:
    """What a peer message could change about the live job and the node, as root sees it: the
    record's state and attempt, the job's files (output, results, checkpoint), the node's term,
    coordinator and leases, and the job's rank processes."""
    got = _unix_json(sock, f"/v1/jobs/{job}") or {}
    rec = got.get("record") or {}
    st = _unix_json(sock, "/v1/status") or {}
    me = (st.get("node") or {}).get("id")
    leases = sorted(
        (g.get("uuid"), g.get("leased_to"))
        for p in st.get("peers", [])
        if p.get("id") == me
        for g in p.get("gpus", [])
    )
    files = sorted(
        (str(f.relative_to(data_dir)), f.stat().st_size)
        for f in (Path(data_dir) / "jobs" / job).rglob("*")
        if f.is_file() and f.name not in ("record.json", "output.ndjson")
    )
    try:  # the output log grows as the job prints: what matters is whether an injected line is in it
        injected = b"RB-INJECTED" in (Path(data_dir) / "jobs" / job / "output.ndjson").read_bytes()
    except OSError:
        injected = False
    ranks = rank_processes(job)
    return {
        "state": rec.get("state"),
        "attempt": rec.get("attempt"),
        "term": (st.get("node") or {}).get("term"),
        "coordinator": (st.get("coordinator") or {}).get("id"),
        "leases": leases,
        "files": files,
        "injected_output": injected,
        "rank_processes": ranks,
        "foreign_job_known": bool(foreign_job) and foreign_job in json.dumps(st.get("jobs", [])),
    }


def fresh_live_job(
    sock: str, jobdir: str, data_dir: str, j: dict[str, Any], timeout: float = 90.0
) -> dict[str, Any]:
    """Cancel the live job and start another (root's sleeper), once it runs: the new ``j``."""
    http_call("unix:" + sock, "POST", f"/v1/jobs/{j['job']}/cancel")
    spec_req, f = _pack_sleeper(jobdir)
    with f:
        ctype, body = multipart(spec_req, f.read())
    st, data = http_call("unix:" + sock, "POST", "/v1/jobs", headers={"Content-Type": ctype}, body=body)
    if st != 201:
        raise RuntimeError(f"resubmitting the live job: HTTP {st} {data[:200]!r}")
    job = json.loads(data)["job"]["id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = live_and_printing(sock, job, data_dir)
        if rec is not None:
            status = _unix_json(sock, "/v1/status") or {}
            me = status["node"]["id"]
            gpus = [g for p in status.get("peers", []) if p.get("id") == me for g in p.get("gpus", [])]
            free = [g["uuid"] for g in gpus if not g.get("leased_to")] or [gpus[0]["uuid"]]
            return dict(
                j,
                job=job,
                attempt=int(rec["attempt"]),
                record=rec,
                term=int(status["node"]["term"]),
                free_gpu=free[0],
            )
        time.sleep(0.25)
    raise RuntimeError(f"the resubmitted live job {job} did not run within {timeout:.0f}s")


def _pack_sleeper(jobdir: str) -> tuple[dict[str, Any], Any]:
    from frenzy_client.daemon_client import pack_request

    return pack_request(
        {
            "workdir": jobdir,
            "argv": ["sleeper.py", "3600", "rb-live-sleeper"],
            "name": "rb-live",
            "nproc": 1,
            "mem_per_rank": 1 << 30,
        },
        1 << 20,
    )


def rank_processes(job: str) -> int:
    """Processes running a rank of ``job`` (the live sleeper, with the job's id in its environment)."""
    n = 0
    tag = f"FRENZY_JOB_ID={job}".encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if (
                    b"rb-live-sleeper" in (proc / "cmdline").read_bytes()
                    and tag in (proc / "environ").read_bytes()
                ):
                    n += 1
    return n


def live_and_printing(sock: str, job: str, data_dir: str) -> dict[str, Any] | None:
    """The job's record once it runs, its rank process is up and its first line is in its log."""
    got = _unix_json(sock, f"/v1/jobs/{job}") or {}
    rec = got.get("record") or {}
    if rec.get("state") != "running" or not rec.get("ranks") or not rank_processes(job):
        return None
    with contextlib.suppress(OSError):
        if b"rb live job" in (Path(data_dir) / "jobs" / job / "output.ndjson").read_bytes():
            return dict(rec)
    return None


def classify(kind: str, status: int, reply: bytes, refusal: str) -> tuple[str, str]:
    """("refused" | "acknowledged" | "accepted", reason) from the daemon's answer alone.
    ``accepted``: the answer itself gives something away (payload bytes, an attempt number);
    ``acknowledged``: an ``ok`` without data (whether it acted shows in the job's fingerprint)."""
    from frenzyd.net import wire

    if status < 0:
        return "refused", refusal or "tls"
    try:
        msg = wire.decode(reply, max_bytes=len(reply) + 1)
    except wire.FrameRejected as exc:
        return "refused", f"undecodable reply ({exc.reason})"
    body = msg.body
    if msg.kind == "error":
        return "refused", str(body.get("reason"))
    if msg.kind == "heartbeat":
        return "acknowledged", "heartbeat answered"
    if body.get("ok") is False:
        return "refused", "ack: " + str(body.get("reason", ""))[:70]
    if kind == "job.attempt" and body.get("attempt") == 0:
        return "refused", f"attempt 0 ({body.get('state')})"
    if kind == "job.cancel" and body.get("state") == "unknown":
        return "acknowledged", "ok (job unknown here)"
    if isinstance(body.get("data"), bytes) and body["data"]:
        return "accepted", f"answered {len(body['data'])} bytes of data"
    if kind == "job.attempt" and isinstance(body.get("attempt"), int):
        return "accepted", f"allocated attempt {body['attempt']}"
    return "acknowledged", "ok " + json.dumps({k: v for k, v in body.items() if not isinstance(v, bytes)})[
        :60
    ]


def role_peer_matrix(spec: dict[str, Any]) -> dict[str, Any]:
    """In the member's namespace: every kind x column at the daemon; verdicts and effects.

    Senders: ``foreign_ca`` another pool's node; ``revoked`` a removed member; ``stale_term``,
    ``stale_attempt`` and ``wrong_addressee`` the node that legitimately sends the kind (here the
    daemon's own identity: it is the live job's submitter, coordinator and rank host), so only the
    column's field is wrong (a heartbeat's stale term is claimed by a member); ``replay`` another
    member re-sending the legitimate sender's frame (orders keep the coordinator's signature)."""
    from frenzyd.jobs.messages import SIGNED_KINDS
    from frenzyd.net import auth, wire

    j = spec["job"]
    member, foreign, legit = (_creds(spec[k]) for k in ("member", "foreign", "coordinator"))
    revoked = _creds(spec["revoked"]) if spec.get("revoked") else None
    target, sock, data_dir = spec["target"], spec["socket"], spec["data_dir"]
    cells = []
    fj = j["foreign_job"]
    before = _job_fingerprint(sock, j["job"], data_dir, fj)
    restarts = 0
    destructive = (
        "job.stop",
        "job.cancel",
        "job.exit",
        "lease.release",
        "job.finished",
        "job.state",
        "signed",
    )
    kinds = sorted(peer_kinds(), key=lambda k: (k in destructive, k))
    for column in COLUMNS:
        for kind in kinds:
            inner = "job.stop" if kind == "signed" else kind
            cell: dict[str, Any] = {"kind": kind, "column": column}
            cells.append(cell)
            if column == "revoked" and revoked is None:
                cell.update(verdict="n/a", why="no revocation on main")
                continue
            sender = {"foreign_ca": foreign, "revoked": revoked, "replay": member}.get(column, legit)
            if kind == "heartbeat" and column not in ("foreign_ca", "revoked"):
                sender = member
            assert sender is not None
            body = base_body(inner, j, sender.node_id)
            body = None if body is None else mutate_for(column, inner, body, j)
            if body is None:
                field_name = column.split("_", 1)[-1].replace("_", " ")
                why = NOT_APPLICABLE.get((column, inner), f"{inner} carries no {field_name}")
                cell.update(verdict="n/a", why=why)
                continue
            signed = inner in SIGNED_KINDS or kind == "signed"
            if signed:
                signer = legit if column == "replay" else sender
                frame = wire.encode(wire.SIGNED_KIND, auth.seal_order(signer, inner, body))
            elif column == "replay" and kind == "heartbeat":
                frame = wire.encode(kind, dict(body, node_id=j["node_id"], name="n0"))  # the daemon's own
            else:
                frame = wire.encode(kind, body)
            status, reply, refusal = _post_frame(target, _client_ctx(sender), frame)
            verdict, reason = classify(inner if kind != "signed" else "signed", status, reply, refusal)
            after = _job_fingerprint(sock, j["job"], data_dir, fj)
            changed = {k: [before[k], after[k]] for k in before if before[k] != after[k]}
            if changed and verdict != "refused":
                verdict = "accepted"
            if {"state", "attempt", "rank_processes", "leases", "term", "coordinator"} & set(changed):
                # the live job (or the node's view) was disturbed: later cells get a fresh one
                j = fresh_live_job(sock, spec["jobdir"], data_dir, j)
                restarts += 1
                after = _job_fingerprint(sock, j["job"], data_dir, fj)
            cell.update(
                verdict=verdict,
                reason=reason,
                http=status,
                changed=changed,
                signed=signed,
                sender={
                    "foreign_ca": "another pool",
                    "revoked": "removed member",
                    "replay": "another member",
                }.get(column, "member" if sender is member else "legitimate sender"),
            )
            before = after
    return {"cells": cells, "kinds": kinds, "live_job_restarts": restarts}


def role_wire_fuzz(spec: dict[str, Any]) -> dict[str, Any]:
    """In the member's namespace: seeded mutated frames over one kept-alive mutual-TLS connection."""
    import msgpack

    from frenzyd.net import wire

    j = spec["job"]
    member = _creds(spec["member"])
    ctx = _client_ctx(member)
    rng = random.Random(f"wire:{spec['seed']}")
    kinds = peer_kinds()
    bases = {
        k: base_body("job.stop" if k == "signed" else k, dict(j, job="j-rb-fuzz-" + str(i)), member.node_id)
        for i, k in enumerate(kinds)
    }
    host, _, port = spec["target"].rpartition(":")
    conn: http.client.HTTPSConnection | None = None
    statuses: Counter[int] = Counter()
    server_errors: list[dict[str, Any]] = []
    refused_conn = 0
    slowest = 0.0
    for i in range(spec["n"]):
        kind = rng.choice(kinds)
        body = bases[kind] or {}
        r = rng.random()
        if r < 0.45:
            frame = msgpack.packb(
                {"v": wire.PROTOCOL_VERSION, "k": kind, "b": mutate_msgpack_body(rng, body)},
                use_bin_type=True,
            )
        elif r < 0.9:
            try:
                good = wire.encode(kind, body)
            except Exception:
                good = msgpack.packb({"v": wire.PROTOCOL_VERSION, "k": kind, "b": body}, use_bin_type=True)
            frame = mutate_bytes(rng, good)
        else:
            frame = bytes(rng.randrange(256) for _ in range(rng.randint(0, 512)))
        if conn is None:
            conn = http.client.HTTPSConnection(host, int(port), timeout=20, context=ctx)
        t0 = time.perf_counter()
        status, reply, _ = _post_frame(spec["target"], ctx, frame, conn=conn)
        slowest = max(slowest, time.perf_counter() - t0)
        if status < 0:
            refused_conn += 1
            conn.close()
            conn = None
            continue
        statuses[status] += 1
        if status >= 500 and len(server_errors) < 20:
            server_errors.append(
                {"i": i, "status": status, "frame": frame[:400].hex(), "reply": reply[:300].hex()}
            )
    if conn is not None:
        conn.close()
    return {
        "n": spec["n"],
        "statuses": {str(k): v for k, v in statuses.items()},
        "server_errors": server_errors,
        "connection_failures": refused_conn,
        "slowest_reply_s": round(slowest, 3),
    }


def _heartbeat_frame(member: Any, j: dict[str, Any]) -> bytes:
    from frenzyd.net import wire

    return wire.encode("heartbeat", base_body("heartbeat", j, member.node_id) or {})


def role_latency(spec: dict[str, Any]) -> dict[str, Any]:
    """In the member's namespace, every interval: a heartbeat on a fresh mutual-TLS connection (a
    handshake each time, as a member that just came up) and one on a kept-alive connection (as
    members' heartbeats normally travel)."""
    member = _creds(spec["member"])
    ctx = _client_ctx(member)
    frame = _heartbeat_frame(member, spec["job"])
    host, _, port = spec["target"].rpartition(":")
    fresh: list[list[float]] = []
    kept: list[list[float]] = []
    conn: http.client.HTTPSConnection | None = None
    end = time.time() + spec["duration_s"]
    while time.time() < end:
        t0 = time.time()
        p0 = time.perf_counter()
        status, _, _ = _post_frame(spec["target"], ctx, frame, timeout=10)
        fresh.append([t0, round((time.perf_counter() - p0) * 1e3, 3), status])
        if conn is None:
            conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=ctx)
        t1, p1 = time.time(), time.perf_counter()
        status, _, _ = _post_frame(spec["target"], ctx, frame, conn=conn)
        kept.append([t1, round((time.perf_counter() - p1) * 1e3, 3), status])
        if status < 0:
            conn.close()
            conn = None
        time.sleep(max(0.0, spec["interval_s"] - (time.time() - t0)))
    if conn is not None:
        conn.close()
    return {"samples": fresh, "kept_alive": kept}


def role_flood_idle(spec: dict[str, Any]) -> dict[str, Any]:
    """In an attacker's namespace: keep ``n`` connections open to the TLS port from many source
    addresses, each sending half a TLS record and then nothing; reopen one a second after the daemon
    closes it."""
    import asyncio

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    host, _, port = spec["target"].rpartition(":")
    stats: Counter[str] = Counter()
    stop_at = time.time() + spec["duration_s"]
    open_now = 0
    peak = 0

    async def one(k: int) -> None:
        nonlocal open_now, peak
        src = spec["sources"][k % len(spec["sources"])]
        while time.time() < stop_at:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, int(port), local_addr=(src, 0)), 5
                )
            except (OSError, TimeoutError):
                stats["connect_failed"] += 1
                await asyncio.sleep(0.5)
                continue
            stats["opened"] += 1
            open_now += 1
            peak = max(peak, open_now)
            try:
                writer.write(b"\x16\x03\x01\x02\x00")  # a TLS handshake record header, then silence
                left = stop_at - time.time()
                try:
                    data = await asyncio.wait_for(reader.read(1), max(0.01, left))
                    stats["closed_by_daemon" if not data else "daemon_sent_data"] += 1
                except TimeoutError:
                    stats["still_open_at_end"] += 1
                except OSError:
                    stats["reset_by_daemon"] += 1
            finally:
                open_now -= 1
                writer.close()
            await asyncio.sleep(1.0)  # reopen a second after the daemon closed it

    async def main() -> None:
        await asyncio.gather(*(one(k) for k in range(spec["n"])))

    asyncio.run(main())
    return {"stats": dict(stats), "peak_open": peak}


def role_flood_bad(spec: dict[str, Any]) -> dict[str, Any]:
    """In an attacker's namespace: ``rate`` TLS handshakes a second with another pool's certificate,
    each followed by a request; an HTTP answer would mean the daemon let it in."""
    import asyncio

    foreign = _creds(spec["foreign"])
    ctx = _client_ctx(foreign)
    host, _, port = spec["target"].rpartition(":")
    stats: Counter[str] = Counter()

    async def one() -> None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), ssl=ctx), 5)
        except (OSError, ssl.SSLError, TimeoutError):
            stats["refused_in_handshake"] += 1
            return
        try:
            writer.write(b"POST /v1/msg HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            data = await asyncio.wait_for(reader.read(64), 5)
            stats["answered_http" if data.startswith(b"HTTP/") else "refused_on_read"] += 1
        except (OSError, ssl.SSLError, TimeoutError):
            stats["refused_on_read"] += 1
        finally:
            writer.close()

    async def main() -> None:
        tasks = set()
        t_end = time.time() + spec["duration_s"]
        k = 0
        t0 = time.time()
        while time.time() < t_end:
            t = asyncio.create_task(one())
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            k += 1
            await asyncio.sleep(max(0.0, t0 + k / spec["rate"] - time.time()))
        if tasks:
            await asyncio.wait(tasks, timeout=6)
        stats["sent"] = k

    asyncio.run(main())
    return {"stats": dict(stats)}


ROLES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "fuzz": role_fuzz,
    "peer-matrix": role_peer_matrix,
    "wire-fuzz": role_wire_fuzz,
    "latency": role_latency,
    "flood-idle": role_flood_idle,
    "flood-bad": role_flood_bad,
}


def run_role(name: str, spec: dict[str, Any]) -> int:
    print(json.dumps(ROLES[name](spec)), flush=True)
    return 0


# ----------------------------------------------------------------------------- the daemon side


class LagProbe:
    """A thread asking the daemon's unix socket ``GET /v1/whoami`` every 50 ms: the slowest answer
    bounds how long its event loop was blocked (plus this machine's scheduling delay)."""

    def __init__(self, sock: Path) -> None:
        self.sock = sock
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            status, _ = http_call(f"unix:{self.sock}", "GET", "/v1/whoami", timeout=30)
            self.samples.append((time.time(), time.perf_counter() - t0 if status == 200 else math.inf))
            self._stop.wait(0.05)

    def __enter__(self) -> LagProbe:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(timeout=35)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        xs = [d for t, d in self.samples if t0 <= t <= t1]
        return {
            "probes": len(xs),
            "max_s": round(max(xs), 3) if xs else None,
            "over_1s": sum(1 for d in xs if d > SLOW_S),
        }


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tracebacks(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count("Traceback (most recent call last)")
    except OSError:
        return 0


def ns_role(lab: Any, host: int, role: str, spec: dict[str, Any], timeout: float) -> subprocess.Popen[str]:
    proc: subprocess.Popen[str] = lab.popen(
        host,
        [PY, str(Path(__file__).resolve()), "_role", role, json.dumps(spec)],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return proc


def finish(proc: subprocess.Popen[str], timeout: float, what: str) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    got = _last_json(out or "")
    if got is None:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{(err or '')[-3000:]}")
    return got


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))], 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


QUICK = "print('rb quick job')\n"
SLEEPER = "import time, sys\nprint('rb live job', flush=True)\ntime.sleep(float(sys.argv[1]))\n"


def submit_as(
    user: User | None, target: str, token: str | None, argv: list[str], cwd: Path
) -> dict[str, Any]:
    """``frenzy-client run --detach --json`` as ``user`` (None: root), from ``cwd``."""

    def go() -> Any:
        from frenzy_client.cli import run_cli

        buf = io.StringIO()
        if token:
            cfg = Path(os.environ["HOME"]) / ".config" / "frenzy"
            cfg.mkdir(parents=True, exist_ok=True)
            (cfg / "token").write_text(token + "\n")
            (cfg / "token").chmod(0o600)
        with contextlib.redirect_stdout(buf):
            rc = run_cli(
                [
                    "run",
                    "--daemon",
                    target,
                    "--detach",
                    "--json",
                    "--nproc",
                    "1",
                    "--mem-per-rank",
                    "1GiB",
                    "--",
                    *argv,
                ]
            )
        if rc != 0:
            raise RuntimeError(f"frenzy-client run exited {rc}")
        return json.loads(buf.getvalue())

    return dict(as_user(user, go, cwd=cwd))


def job_dir(user: User) -> None:
    d = user.home / "job"
    d.mkdir(exist_ok=True)
    (d / "sleeper.py").write_text(SLEEPER)
    (d / "quick.py").write_text(QUICK)
    for p in (d, d / "sleeper.py", d / "quick.py"):
        os.chown(p, user.uid, user.gid)


def _preload() -> None:
    """What the children import, loaded before they drop to accounts that cannot read /root."""
    import importlib

    from frenzy_client import cli

    cli.build_parser()
    for name in (
        "encodings.idna",
        "frenzy_client.daemon_client",
        "frenzy_client.trainer_job",
        "frenzy_client.results",
        "frenzyd.payload",
        "aiohttp.web",
        "concurrent.futures.thread",
        "tarfile",
        "gzip",
        "tempfile",
        "frenzy_client.cmd_jobs",
    ):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


# ----------------------------------------------------------------------------- the run


@dataclass
class Plan:
    tiny: bool
    seed: int
    fuzz_n: int
    wire_n: int
    idle_conns: int
    bad_rate: float
    idle_s: float
    flood_s: float
    sections: tuple[str, ...]
    results: dict[str, Any] = field(default_factory=dict)


def remove_node(pool: Path, name: str, daemon: str) -> str | None:
    """``frenzy-client pool remove-node POOL NAME`` given to ``daemon``; None when it worked, else why
    the revoked column cannot run ("n/a ...")."""
    from _pool import cli

    try:
        cli("pool", "remove-node", str(pool), name, "--daemon", daemon, "--json", timeout=60)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        first = str(exc).strip().splitlines()
        detail = next((ln for ln in reversed(first) if ln.strip()), "")[:160]
        return f"n/a (no revocation: pool remove-node failed: {detail})"
    return None


def namespaced(plan: Plan, base: Path, before_flood: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Client matrix, peer matrix, wire fuzz and flood against real daemons in namespaces."""
    from tests.netns import NetnsLab

    out: dict[str, Any] = {}
    marks: dict[str, float] = {}
    out["phase_s"] = marks
    t_setup = time.monotonic()
    tag = "rb" + secrets.token_hex(3)
    base.chmod(0o755)
    with contextlib.ExitStack() as stack:
        users, gid = stack.enter_context(throwaway_users(base, tag))
        lab = stack.enter_context(NetnsLab(4))
        h0 = lab.hosts[0]
        target = f"{h0.address}:{PEER_PORT}"
        names = ["n0", "n1", "member", "member2", "gone"]
        creds = make_pool(base / "pool", names)
        foreign = make_pool(base / "other-pool", ["intruder"])["intruder"]
        for u in users.values():
            job_dir(u)
        d0 = Daemon(
            NodeConf(
                name="n0",
                base=base / "n0",
                credentials=creds["n0"],
                devices=[("T4", 8)],
                listen=f"0.0.0.0:{PEER_PORT}",
                advertise=h0.address,
                web="127.0.0.1:7480",
                interfaces=["eth0"],
                mdns=False,
                heartbeat_s=0.5,
                peer_timeout_s=3.0,
            ),
            spawn=lambda argv, **kw: lab.popen(0, argv, **kw),
        )
        tcp_port = free_port()
        d1 = Daemon(
            NodeConf(
                name="n1",
                base=base / "n1",
                credentials=creds["n1"],
                devices=[("T4", 1)],
                listen=f"127.0.0.1:{free_port()}",
                web="127.0.0.1:0",
                interfaces=["lo"],
                mdns=False,
                extra_toml="",
            )
        )
        stack.callback(stop_daemons, (d0, d1))
        d0.start()
        d1.conf.write()
        text = d1.conf.config_path.read_text().replace(
            f'listen = "unix:{d1.conf.socket}"', f'listen = "127.0.0.1:{tcp_port}"'
        )
        d1.conf.write = lambda: d1.conf.config_path  # type: ignore[method-assign]
        d1.conf.config_path.write_text(text)
        d1.start()
        wait_until(d0.status, 90, "n0 to answer on its socket")
        tcp = f"127.0.0.1:{tcp_port}"
        marks["daemons_up"] = round(time.monotonic() - t_setup, 1)
        wait_until(
            lambda: (
                (base / "n1" / "data" / "client.token").exists()
                and http_call(tcp, "GET", "/v1/status")[0] == 401
            ),
            90,
            "n1's TCP API",
        )
        admin_token = (base / "n1" / "data" / "client.token").read_text().strip()
        for p in (base / "n0", base / "n1"):
            p.chmod(0o755)
        os.chown(d0.conf.socket, 0, gid)  # the throwaway group may open the socket (mode 0660)
        _preload()

        def issue(user: str) -> str:
            st, data = http_call(
                tcp,
                "POST",
                "/v1/tokens",
                headers={"Authorization": f"Bearer {admin_token}", "Content-Type": "application/json"},
                body=json.dumps({"user": user}).encode(),
            )
            if st != 201:
                raise RuntimeError(f"token issue for {user}: HTTP {st} {data[:200]!r}")
            return str(json.loads(data)["token"])

        tokens = {r: issue(users[r].name) for r in ("owner", "other")}
        # The job the client routes name: the owner's (it need not run: a daemon without slot accounts
        # runs only its own user's jobs, and the routes' rules do not depend on the state).
        live = submit_as(
            users["owner"], d0.address, None, ["sleeper.py", "3600"], users["owner"].home / "job"
        )
        live_tcp = submit_as(
            users["owner"], tcp, tokens["owner"], ["sleeper.py", "3600"], users["owner"].home / "job"
        )
        # The job the peer messages name: the daemon's own user's, running (attempt, term and ranks live).
        rootjob = base / "rootjob"
        rootjob.mkdir()
        (rootjob / "sleeper.py").write_text(SLEEPER)
        peer_job = submit_as(None, d0.address, None, ["sleeper.py", "3600", "rb-live-sleeper"], rootjob)

        try:
            rec = wait_until(
                lambda: live_and_printing(str(d0.conf.socket), peer_job["id"], str(d0.conf.data_dir)),
                90,
                "root's job to run on n0",
            )
            rec0 = {"record": rec}
        except TimeoutError:
            print(d0.log_tail(30), file=sys.stderr)
            raise

        marks["setup"] = round(time.monotonic() - t_setup, 1)
        with LagProbe(d0.conf.socket) as probe:
            t_start = time.time()
            windows: dict[str, tuple[float, float]] = {}
            # --- client API, unix socket and TCP ---
            if "client" in plan.sections:
                t0 = time.monotonic()
                ctx = {
                    "job": live["id"],
                    "owner": users["owner"].name,
                    "other": users["other"].name,
                    "stranger": users["stranger"].name,
                    "jobdir": str(users["other"].home / "job"),
                }
                unix_callers: dict[str, tuple[User | None, str | None]] = {
                    "none": (users["stranger"], None),
                    "other": (users["other"], None),
                    "owner": (users["owner"], None),
                    "admin": (None, None),
                }
                # the admin (root) submits from the other user's directory: readable by root
                unix = client_matrix("unix", d0.address, unix_callers, ctx)
                issue(users["stranger"].name)  # so the admin's DELETE has a token to remove
                ctx_tcp = dict(ctx, job=live_tcp["id"])
                tcp_callers: dict[str, tuple[User | None, str | None]] = {
                    "none": (None, None),
                    "other": (None, tokens["other"]),
                    "owner": (None, tokens["owner"]),
                    "admin": (None, admin_token),
                }
                tcpm = client_matrix("tcp", tcp, tcp_callers, ctx_tcp)
                bad = client_matrix(
                    "tcp", tcp, {"none": (None, "not-a-token-" + secrets.token_hex(8))}, ctx_tcp
                )
                for c in bad["cells"]:
                    c["ident"] = "none (wrong token)"
                tcpm["cells"] += bad["cells"]
                out["client"] = {"unix": unix, "tcp": tcpm, "wall_s": round(time.monotonic() - t0, 1)}
                windows["client"] = (time.time() - out["client"]["wall_s"], time.time())
                # the jobs the matrix submitted (other users' wait for slot accounts) go away
                for listed in (_unix_json(str(d0.conf.socket), "/v1/jobs") or {}).get("jobs", []):
                    if listed["id"] != peer_job["id"] and listed.get("state") not in (
                        "succeeded",
                        "failed",
                        "cancelled",
                    ):
                        http_call(d0.address, "POST", f"/v1/jobs/{listed['id']}/cancel")
            # --- peer messages ---
            st = d0.status() or {}
            gpus = [
                g for p in st.get("peers", []) for g in p.get("gpus", []) if p.get("id") == st["node"]["id"]
            ]
            free = [g["uuid"] for g in gpus if not g.get("leased_to")] or [gpus[0]["uuid"]]
            jinfo = {
                "job": peer_job["id"],
                "attempt": int(rec0["record"]["attempt"]),
                "term": int(st["node"]["term"]),
                "record": rec0["record"],
                "node_id": st["node"]["id"],
                "free_gpu": free[0],
                "address_ip": h0.address,
                "member_address": f"{lab.hosts[1].address}:7470",
                "other_member_id": _creds(str(creds["member2"])).node_id,
                "foreign_job": "j-not-here-" + tag,
            }
            common = {
                "target": target,
                "socket": str(d0.conf.socket),
                "job": jinfo,
                "member": str(creds["member"]),
                "other_member": str(creds["member2"]),
                "foreign": str(foreign),
                "coordinator": str(creds["n0"]),
                "data_dir": str(d0.conf.data_dir),
                "jobdir": str(rootjob),
            }
            if "peer" in plan.sections:
                t0 = time.monotonic()
                tb0 = tracebacks(d0.log_path)
                why = remove_node(base / "pool", "gone", d0.address)
                got = finish(
                    ns_role(
                        lab, 1, "peer-matrix", dict(common, revoked=None if why else str(creds["gone"])), 300
                    ),
                    300,
                    "the peer matrix",
                )
                windows["peer"] = (time.time() - (time.monotonic() - t0), time.time())
                out["peer"] = got | {
                    "revoked": why or "available",
                    "tracebacks": tracebacks(d0.log_path) - tb0,
                    "wall_s": round(time.monotonic() - t0, 1),
                }
            if "wire" in plan.sections:
                t0, w0 = time.monotonic(), time.time()
                tb0 = tracebacks(d0.log_path)
                got = finish(
                    ns_role(lab, 1, "wire-fuzz", dict(common, n=plan.wire_n, seed=plan.seed), 3600),
                    3600,
                    "the wire fuzz",
                )
                windows["wire"] = (w0, time.time())
                out["wire"] = got | {
                    "tracebacks": tracebacks(d0.log_path) - tb0,
                    "alive": d0.proc is not None and d0.proc.poll() is None,
                    "loop": probe.window(w0, time.time()),
                    "wall_s": round(time.monotonic() - t0, 1),
                }
            # --- flood ---
            if before_flood is not None:
                before_flood()
            if "flood" in plan.sections:
                t0, f0 = time.monotonic(), time.time()
                out["flood"] = flood(plan, lab, d0, common, str(foreign), tag)
                marks["flood"] = round(time.monotonic() - t0, 1)
                windows["flood"] = (f0, time.time())
            out["loop_all"] = probe.window(t_start, time.time())
            # the probe's slowest answer per phase (the flood's own window includes its idle part)
            out["loop_by_phase"] = {name: probe.window(t0w, t1w) for name, (t0w, t1w) in windows.items()}
        out["daemon_alive"] = d0.proc is not None and d0.proc.poll() is None
        out["daemon_tracebacks"] = tracebacks(d0.log_path)
        out["tcp_daemon_tracebacks"] = tracebacks(d1.log_path)
        if out["daemon_tracebacks"]:
            out["daemon_log_tail"] = d0.log_tail(80)
        for job in (live["id"], peer_job["id"]):
            http_call(d0.address, "POST", f"/v1/jobs/{job}/cancel")
    return out


def stop_daemons(daemons: tuple[Daemon, ...]) -> None:
    """SIGTERM every daemon at once, then wait for each (SIGKILL past its deadline)."""
    for d in daemons:
        d.kill(signal.SIGTERM)
    for d in daemons:
        d.stop(deadline_s=15)


def flood(plan: Plan, lab: Any, d0: Daemon, common: dict[str, Any], foreign: str, tag: str) -> dict[str, Any]:
    """Latency of legitimate requests idle, then under the flood, in one run; RSS around it."""
    assert d0.proc is not None
    pid = d0.proc.pid
    h2 = lab.hosts[2]
    sources = []
    prefix = h2.address.rsplit(".", 1)[0]
    for k in range(64):
        ip = f"{prefix}.{100 + k}"
        subprocess.run(
            ["ip", "-n", h2.ns, "addr", "add", f"{ip}/24", "dev", "eth0"], check=True, capture_output=True
        )
        sources.append(ip)
    total = plan.idle_s + plan.flood_s + 2.0
    lat = ns_role(lab, 1, "latency", dict(common, duration_s=total, interval_s=0.1), total + 60)
    client_samples: list[tuple[float, float, int]] = []
    stop = threading.Event()

    def client_loop() -> None:
        while not stop.is_set():
            t0, p0 = time.time(), time.perf_counter()
            status, _ = http_call(d0.address, "GET", "/v1/status", timeout=30)
            client_samples.append((t0, (time.perf_counter() - p0) * 1e3, status))
            stop.wait(0.1)

    th = threading.Thread(target=client_loop, daemon=True)
    t_idle = time.time()
    th.start()
    time.sleep(plan.idle_s)
    rss_before = rss_bytes(pid)
    t_flood = time.time()
    idle_p = ns_role(
        lab,
        2,
        "flood-idle",
        dict(common, n=plan.idle_conns, sources=sources, duration_s=plan.flood_s),
        plan.flood_s + 60,
    )
    bad_p = ns_role(
        lab,
        3,
        "flood-bad",
        dict(common, foreign=foreign, rate=plan.bad_rate, duration_s=plan.flood_s),
        plan.flood_s + 60,
    )
    rss_peak = rss_before
    while time.time() < t_flood + plan.flood_s:
        rss_peak = max(rss_peak, rss_bytes(pid))
        time.sleep(0.25)
    t_end = time.time()
    idle_r = finish(idle_p, 90, "the idle-connection flood")
    bad_r = finish(bad_p, 90, "the bad-handshake flood")
    rss_after = rss_bytes(pid)
    lat_r = finish(lat, 120, "the latency probe")
    stop.set()
    th.join(timeout=35)
    time.sleep(2.0)
    rss_settled = rss_bytes(pid)
    ramp = 1.0  # the flood needs a moment to reach its size; its first second is not counted

    def split(samples: list[list[float]] | list[tuple[float, float, int]]) -> dict[str, Any]:
        idle = [s[1] for s in samples if t_idle + 0.5 <= s[0] < t_flood and s[2] == 200]
        under = [s[1] for s in samples if t_flood + ramp <= s[0] < t_end and s[2] == 200]
        failed = [s for s in samples if t_flood <= s[0] < t_end and s[2] != 200]
        res: dict[str, Any] = {
            "idle": {"n": len(idle), "p50_ms": pct(idle, 0.5), "p95_ms": pct(idle, 0.95)},
            "flood": {"n": len(under), "p50_ms": pct(under, 0.5), "p95_ms": pct(under, 0.95)},
            "failed_under_flood": len(failed),
        }
        for q in ("p50_ms", "p95_ms"):
            a, b = res["idle"][q], res["flood"][q]
            res[q.replace("_ms", "_ratio")] = round(b / a, 2) if a and b else None
        return res

    return {
        "member_heartbeat": split(lat_r["samples"]),
        "member_heartbeat_kept_alive": split(lat_r["kept_alive"]),
        "client_status": split(client_samples),
        "idle_flood": idle_r,
        "bad_handshakes": bad_r,
        "rss_bytes": {"before": rss_before, "peak": rss_peak, "after": rss_after, "settled_2s": rss_settled},
        "config": {
            "idle_connections": plan.idle_conns,
            "bad_handshakes_per_s": plan.bad_rate,
            "source_addresses": len(sources),
            "idle_s": plan.idle_s,
            "flood_s": plan.flood_s,
        },
    }


# ----------------------------------------------------------------------------- report


def summarise(doc: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (what the table prints)."""
    s: dict[str, Any] = {}
    ns = doc.get("namespaced") or {}
    cl = ns.get("client")
    if cl:
        for surf in ("unix", "tcp"):
            cells = cl[surf]["cells"]
            s[f"client_{surf}"] = {
                "routes": len(cl[surf]["routes"]),
                "cases": len(cells),
                "must_refuse": sum(not c["legit"] for c in cells),
                "accepted_wrongly": sum(c["wrongly_accepted"] for c in cells),
                "legit": sum(c["legit"] for c in cells),
                "refused_wrongly": sum(c["wrongly_refused"] for c in cells),
                "http_5xx": sum(c["server_error"] for c in cells),
            }
    pm = ns.get("peer")
    if pm:
        col = {}
        for c in COLUMNS:
            cells = [x for x in pm["cells"] if x["column"] == c]
            ran = [x for x in cells if x["verdict"] != "n/a"]
            col[c] = {
                "cases": len(ran),
                "n/a": len(cells) - len(ran),
                "accepted": sum(x["verdict"] == "accepted" for x in ran),
                "acknowledged_no_effect": sum(x["verdict"] == "acknowledged" for x in ran),
                "refused": sum(x["verdict"] == "refused" for x in ran),
            }
        s["peer"] = {"kinds": len(pm["kinds"]), "columns": col, "revoked": pm.get("revoked")}
    fz = doc.get("fuzz") or {}
    s["fuzz"] = {}
    if ns.get("wire"):
        w = ns["wire"]
        s["fuzz"]["wire"] = {
            "cases": w["n"],
            "crashes": int(w["statuses"].get("500", 0))
            + w["tracebacks"]
            + int(not w["alive"])
            + int((w["loop"]["over_1s"] or 0) > 0),
            "http_500": int(w["statuses"].get("500", 0)),
            "tracebacks": w["tracebacks"],
            "loop_max_s": w["loop"]["max_s"],
            "loop_over_1s": w["loop"]["over_1s"],
        }
    for name, r in fz.items():
        s["fuzz"][name] = {
            "cases": r["n"],
            "crashes": r["counts"].get("crash", 0),
            "slowest_s": r.get("slowest_s"),
            "over_1s": r.get("slow_inputs"),
            "hangs": r["counts"].get("hang", 0),
            "refused": r["counts"].get("refused", 0) + r["counts"].get("usage", 0),
            "ok": r["counts"].get("ok", 0),
        }
    fl = ns.get("flood")
    if fl:
        s["flood"] = {
            k: {q: fl[k][q] for q in ("idle", "flood", "p50_ratio", "p95_ratio", "failed_under_flood")}
            for k in ("member_heartbeat", "member_heartbeat_kept_alive", "client_status")
        }
        s["flood"]["rss_mib"] = {k: round(v / 2**20, 1) for k, v in fl["rss_bytes"].items()}
        s["flood"]["bad_handshakes"] = fl["bad_handshakes"]["stats"]
        s["flood"]["idle_flood"] = fl["idle_flood"]
    return s


def table(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    lines = []
    for surf in ("unix", "tcp"):
        c = s.get(f"client_{surf}")
        if c:
            lines.append(
                f"client API ({surf}): {c['routes']} routes, {c['cases']} cases: "
                f"{c['accepted_wrongly']} of {c['must_refuse']} that must be refused were accepted; "
                f"{c['refused_wrongly']} of {c['legit']} legitimate were refused; HTTP 5xx {c['http_5xx']}"
            )
    ns = doc.get("namespaced") or {}
    if ns.get("client"):
        lines.append("")
        lines.append(f"{'route':<34}" + "".join(f"{i:>22}" for i in ("none", "other", "owner", "admin")))
        for surf in ("unix", "tcp"):
            cells = ns["client"][surf]["cells"]
            for route in ns["client"][surf]["routes"]:
                row = f"{surf + ' ' + route:<34}"
                for ident in ("none", "other", "owner", "admin"):
                    got = [c for c in cells if c["route"] == route and c["ident"] == ident]
                    if not got:
                        row += f"{'-':>22}"
                        continue
                    c = got[0]
                    mark = "WRONG" if c["wrongly_accepted"] or c["wrongly_refused"] else "ok"
                    row += (
                        f"{('allow' if c['legit'] else 'refuse') + ' ' + str(c['status']) + ' ' + mark:>22}"
                    )
                lines.append(row)
    p = s.get("peer")
    if p:
        lines.append("")
        lines.append(
            f"peer messages: {p['kinds']} kinds x {len(COLUMNS)} columns (accepted / cases; "
            "'n/a' where the kind has no such field)"
        )
        lines.append(
            f"{'column':<18}{'cases':>7}{'n/a':>6}{'refused':>9}{'acked, no effect':>18}{'accepted':>10}"
        )
        for c, v in p["columns"].items():
            if c == "revoked" and p.get("revoked") and p["revoked"] != "available":
                lines.append(f"{c:<18}{p['revoked']}")
                continue
            lines.append(
                f"{c:<18}{v['cases']:>7}{v['n/a']:>6}{v['refused']:>9}{v['acknowledged_no_effect']:>18}"
                f"{v['accepted']:>10}"
            )
        for x in ns["peer"]["cells"]:
            if x["verdict"] in ("accepted", "acknowledged"):
                lines.append(
                    f"  {x['verdict']:<12} {x['kind']} x {x['column']} ({x.get('sender')}): {x.get('reason')}"
                    + (f" changed {x['changed']}" if x.get("changed") else "")
                )
    f = s.get("fuzz")
    if f:
        lines.append("")
        lines.append(f"{'fuzz surface':<18}{'cases':>8}{'crashes':>9}{'refused':>9}{'ok':>7}  notes")
        for name, v in f.items():
            note = (
                f"HTTP 500 {v['http_500']}, tracebacks {v['tracebacks']}, loop max {v['loop_max_s']} s"
                if name == "wire"
                else f"slowest {v['slowest_s']} s, {v['over_1s']} over 1 s, {v['hangs']} hangs (> {HANG_S} s)"
            )
            lines.append(
                f"{name:<18}{v['cases']:>8}{v['crashes']:>9}{v.get('refused', '-'):>9}"
                f"{v.get('ok', '-'):>7}  {note}"
            )
    if ns.get("loop_all"):
        la = ns["loop_all"]
        phases = ", ".join(f"{k} {v['max_s']} s" for k, v in (ns.get("loop_by_phase") or {}).items())
        lines.append(
            f"event-loop probe ({la['probes']} answers, every 50 ms): slowest {la['max_s']} s, "
            f"{la['over_1s']} over 1 s" + (f"; slowest by phase: {phases}" if phases else "")
        )
    fl = s.get("flood")
    if fl:
        cfg = ns["flood"]["config"]
        lines.append("")
        lines.append(
            f"flood: {cfg['idle_connections']} idle connections from {cfg['source_addresses']} addresses + "
            f"{cfg['bad_handshakes_per_s']:g} bad handshakes/s for {cfg['flood_s']:g} s "
            f"(idle {cfg['idle_s']:g} s first)"
        )
        lines.append(
            f"{'legitimate request':<30}{'idle p50':>10}{'p95':>8}{'flood p50':>11}{'p95':>8}{'x p50':>7}"
            f"{'x p95':>7}{'failed':>8}"
        )
        for k in ("member_heartbeat", "member_heartbeat_kept_alive", "client_status"):
            v = fl[k]
            lines.append(
                f"{k:<30}{v['idle']['p50_ms'] or 0:>10.1f}{v['idle']['p95_ms'] or 0:>8.1f}"
                f"{v['flood']['p50_ms'] or 0:>11.1f}{v['flood']['p95_ms'] or 0:>8.1f}"
                f"{v['p50_ratio'] or 0:>7.2f}{v['p95_ratio'] or 0:>7.2f}{v['failed_under_flood']:>8}"
            )
        r = fl["rss_mib"]
        lines.append(
            f"daemon RSS MiB: before {r['before']}, peak {r['peak']}, after {r['after']}, "
            f"2 s later {r['settled_2s']}"
        )
        lines.append(f"bad handshakes: {fl['bad_handshakes']}; idle flood: {fl['idle_flood']}")
    if doc.get("skipped"):
        lines.append(f"skipped: {doc['skipped']}")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_role":
        return run_role(sys.argv[2], json.loads(sys.argv[3]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CI size: fewer fuzz inputs, a short, smaller flood")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument(
        "--fuzz", type=int, default=None, help="inputs per in-process fuzz surface (10000; tiny 150)"
    )
    ap.add_argument("--wire", type=int, default=None, help="wire frames sent (10000; tiny 300)")
    ap.add_argument(
        "--sections",
        default="client,peer,wire,flood,fuzz",
        help="comma-separated subset of client,peer,wire,flood,fuzz",
    )
    ap.add_argument("--out", type=Path, help="write the JSON results here")
    args = ap.parse_args()
    prov = provenance()
    plan = Plan(
        tiny=args.tiny,
        seed=args.seed,
        fuzz_n=args.fuzz if args.fuzz is not None else (60 if args.tiny else 10_000),
        wire_n=args.wire if args.wire is not None else (300 if args.tiny else 10_000),
        idle_conns=200 if args.tiny else 1000,
        bad_rate=20.0 if args.tiny else 100.0,
        idle_s=2.0 if args.tiny else 10.0,
        flood_s=4.0 if args.tiny else 20.0,
        sections=tuple(s.strip() for s in args.sections.split(",") if s.strip()),
    )
    unknown = set(plan.sections) - {"client", "peer", "wire", "flood", "fuzz"}
    if unknown:
        ap.error(f"unknown --sections {sorted(unknown)}")
    if plan.fuzz_n < 1 or plan.wire_n < 1:
        ap.error("--fuzz and --wire must be at least 1")
    doc: dict[str, Any] = {"config": {k: v for k, v in plan.__dict__.items() if k != "results"}}
    t0 = time.monotonic()
    from tests.netns import skip_reason

    why = skip_reason() if set(plan.sections) - {"fuzz"} else None
    if why is None and set(plan.sections) - {"fuzz"} and shutil.which("useradd") is None:
        why = "useradd is not installed (throwaway accounts)"
    if why is not None:
        if os.environ.get("FRENZY_REQUIRE_NETNS") == "1":
            print(f"bench_robustness: cannot run the namespaced parts: {why}", file=sys.stderr)
            return 1
        doc["skipped"] = f"client/peer/wire/flood: {why}"
    # --tiny: the fuzz workers run while the daemons start and are questioned, and are done before
    # the flood (whose latencies they would disturb); full size: after everything else.
    fuzz = FuzzWorkers(plan.fuzz_n, plan.seed) if "fuzz" in plan.sections else None
    if fuzz is not None and (plan.tiny or why is not None or not set(plan.sections) - {"fuzz"}):
        fuzz.start()
    if why is None and set(plan.sections) - {"fuzz"}:
        with tempfile.TemporaryDirectory(prefix="frenzy-robust-") as tmp:
            doc["namespaced"] = namespaced(
                plan, Path(tmp), before_flood=fuzz.collect if fuzz and fuzz.procs else None
            )
    if fuzz is not None:
        if not fuzz.procs:
            fuzz.start()
        doc["fuzz"] = fuzz.collect()
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    doc["summary"] = summarise(doc)
    print(table(doc))
    print(f"wall {doc['wall_s']} s")
    if args.out:
        write_results(args.out, doc, prov)
    return 0


if __name__ == "__main__":
    sys.exit(main())
