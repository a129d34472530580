"""Who is calling the local client API: the kernel's word on the unix socket, a token over TCP.

* **Unix socket**: ``SO_PEERCRED`` of the connected socket (uid, gid, pid of the process that
  connected, filled in by the kernel; nothing the caller sends is believed).
* **TCP (loopback)**: ``Authorization: Bearer TOKEN``.  ``data_dir/client.token`` (0600, made at
  first start) is the **admin** credential: whoever can read that file is the daemon's own user.
  Per-user tokens are issued by an admin (``POST /v1/tokens``, ``frenzy-client token issue USER``)
  for a user of this machine; only their sha256 is kept, in ``data_dir/client-tokens.json``
  (0600); the user keeps the token in ``~/.config/frenzy/token`` (0600).

A caller is an **admin** when its uid is 0 or the daemon's own uid, or when its user is a
member of ``[client] admin_group`` (default ``frenzy-admin``).  Admins see and cancel every job
of the node; other users only their own (``frenzyd.api.client_api``).
"""

from __future__ import annotations

import contextlib
import grp
import hashlib
import hmac
import json
import logging
import os
import pwd
import secrets
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from frenzyd.errors import AuthError, ConfigError

log = logging.getLogger(__name__)

ADMIN_TOKEN_FILE = "client.token"
USER_TOKENS_FILE = "client-tokens.json"
DEFAULT_ADMIN_GROUP = "frenzy-admin"

How = Literal["peercred", "token", "admin-token", "in-process"]


@dataclass(frozen=True, slots=True)
class Caller:
    """The user behind one API request."""

    uid: int
    user: str
    groups: frozenset[str]
    """Names of the user's groups (primary and supplementary, from the user database)."""
    admin: bool
    how: How
    pid: int | None = None
    """The connecting process (unix socket only)."""

    def owns(self, owner_uid: int | None, daemon_uid: int) -> bool:
        """True when this caller may act on a job owned by ``owner_uid`` (None: a record written
        before jobs had owners, which belongs to the daemon's user)."""
        if self.admin:
            return True
        return self.uid == (daemon_uid if owner_uid is None else owner_uid)

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "user": self.user, "groups": sorted(self.groups), "admin": self.admin,
                "how": self.how, "pid": self.pid}


def user_name(uid: int) -> str:
    """The login name of ``uid``, or ``uid:N`` for a uid the user database does not know."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


def group_names(user: str, gid: int) -> frozenset[str]:
    """Names of ``user``'s groups (``gid`` included); an unknown user has only ``gid``."""
    try:
        gids = os.getgrouplist(user, gid) if gid >= 0 else []
    except (KeyError, OSError, OverflowError):
        gids = [gid]
    names = set()
    for g in gids:
        try:
            names.add(grp.getgrgid(g).gr_name)
        except KeyError:
            names.add(f"gid:{g}")
    return frozenset(names)


def make_caller(uid: int, gid: int, how: How, *, admin_group: str, daemon_uid: int,
                pid: int | None = None, user: str | None = None) -> Caller:
    """The ``Caller`` of ``uid``/``gid`` with its groups and admin bit worked out."""
    name = user or user_name(uid)
    groups = group_names(name, gid)
    admin = uid in (0, daemon_uid) or admin_group in groups
    return Caller(uid=uid, user=name, groups=groups, admin=admin, how=how, pid=pid)


def peer_credentials(request: web.BaseRequest) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix-socket request (``SO_PEERCRED``);
    ``AuthError`` when the connection carries none."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    opt = getattr(socket, "SO_PEERCRED", None)
    if sock is None or opt is None or sock.family != socket.AF_UNIX:
        raise AuthError("no_peercred", "the caller of this unix socket cannot be identified "
                        "(SO_PEERCRED is Linux's; use the TCP listener and a token elsewhere)")
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, size))
    return pid, uid, gid


class UserTokens:
    """Per-user API tokens for the TCP listener: sha256(token) -> (user, uid), kept in
    ``data_dir/client-tokens.json`` (0600), re-read when the file changes."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / USER_TOKENS_FILE
        self._stamp: tuple[int, int] | None = None
        self._users: dict[str, dict[str, Any]] = {}
        self._by_hash: dict[str, str] = {}

    def _reload(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._users, self._by_hash = None, {}, {}
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            doc = json.loads(self.path.read_text())
            users = {str(u): dict(e) for u, e in doc["users"].items()
                     if isinstance(e, dict) and isinstance(e.get("sha256"), str)
                     and isinstance(e.get("uid"), int)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring unreadable %s (%s): no per-user token is accepted until it is fixed or "
                        "tokens are issued again", self.path, exc)
            users = {}
        self._stamp, self._users = stamp, users
        self._by_hash = {e["sha256"]: u for u, e in users.items()}

    def lookup(self, token: str) -> tuple[str, int] | None:
        """(user, uid) of a valid per-user token, else None."""
        self._reload()
        digest = hashlib.sha256(token.encode()).hexdigest()
        user = self._by_hash.get(digest)
        if user is None:
            return None
        entry = self._users[user]
        if not hmac.compare_digest(entry["sha256"], digest):  # pragma: no cover - same dict key
            return None
        return user, int(entry["uid"])

    def issue(self, user: str) -> tuple[str, int]:
        """A new token for local user ``user`` (replacing any earlier one): (token, uid).
        ``ConfigError`` for a user this machine does not know."""
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            raise ConfigError(f"no local user {user!r} on this machine: tokens are issued to local users "
                              "(a job belongs to (node, user))") from None
        self._reload()
        token = secrets.token_urlsafe(32)
        users = dict(self._users)
        users[user] = {"uid": uid, "sha256": hashlib.sha256(token.encode()).hexdigest(),
                       "issued_at": time.time()}
        self._write(users)
        log.info("issued a client API token to user %s (uid %d)", user, uid)
        return token, uid

    def revoke(self, user: str) -> bool:
        """Forget ``user``'s token; False when it had none."""
        self._reload()
        if user not in self._users:
            return False
        users = {u: e for u, e in self._users.items() if u != user}
        self._write(users)
        log.info("revoked the client API token of user %s", user)
        return True

    def _write(self, users: dict[str, dict[str, Any]]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"version": 1, "users": users}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._stamp = None
        self._reload()


def load_or_create_admin_token(data_dir: Path) -> str:
    """The admin token in ``data_dir/client.token``, created (0600) when missing."""
    path = data_dir / ADMIN_TOKEN_FILE
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


@dataclass(frozen=True, slots=True)
class Identify:
    """How a listener identifies its callers: by ``SO_PEERCRED`` (``admin_token`` None: a unix
    socket) or by bearer token (the admin token, then the per-user tokens)."""

    admin_group: str
    daemon_uid: int
    admin_token: str | None = None
    tokens: UserTokens | None = None

    def __call__(self, request: web.BaseRequest) -> Caller:
        """The caller of ``request``; ``AuthError`` (reason ``no_token``, ``bad_token`` or
        ``no_peercred``) when it cannot be identified."""
        if self.admin_token is None:
            pid, uid, gid = peer_credentials(request)
            return make_caller(uid, gid, "peercred", admin_group=self.admin_group, daemon_uid=self.daemon_uid,
                               pid=pid)
        got = request.headers.get("Authorization", "")
        if not got.startswith("Bearer "):
            raise AuthError("no_token", "this API needs a token: your own in ~/.config/frenzy/token "
                            "(an admin issues it: frenzy-client token issue USER), or the admin token "
                            "data_dir/client.token")
        token = got[7:].strip()
        if hmac.compare_digest(token.encode(), self.admin_token.encode()):
            uid = self.daemon_uid
            return make_caller(uid, _primary_gid(uid), "admin-token", admin_group=self.admin_group,
                               daemon_uid=self.daemon_uid)
        found = self.tokens.lookup(token) if self.tokens is not None else None
        if found is None:
            raise AuthError("bad_token", "missing or wrong API token (yours is in ~/.config/frenzy/token; "
                            "an admin issues a new one with 'frenzy-client token issue USER')")
        user, uid = found
        return make_caller(uid, _primary_gid(uid), "token", admin_group=self.admin_group,
                           daemon_uid=self.daemon_uid, user=user)


def _primary_gid(uid: int) -> int:
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return -1


CALLER: web.RequestKey[Caller] = web.RequestKey("caller", Caller)
IDENTIFY: web.AppKey[Identify] = web.AppKey("identify", Identify)


def caller(request: web.Request) -> Caller:
    """Who sent ``request`` (worked out once per request, then kept on it); ``AuthError`` when
    the listener cannot tell."""
    found = request.get(CALLER)
    if found is None:
        found = request.app[IDENTIFY](request)
        request[CALLER] = found
    return found
