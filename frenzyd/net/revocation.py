"""Removing nodes from a pool: the CA-signed revocation list, its checks, its file and its versions.

``frenzy-client pool remove-node POOL_DIR NODE`` (on the machine holding ``ca.key``) writes a new
list to ``POOL_DIR/revocations.json``; every daemon that gets it (from the client API, from a peer,
or from ``[pool] credentials/revocations.json`` at start) checks it, keeps the newest in
``data_dir/revocations.json`` and passes it on (``frenzyd.net.network``).  The list document is
JSON, and the CA's Ed25519 signature covers its exact bytes::

    {"format": "frenzy-revocations", "pool_id": str, "version": int >= 1, "issued_at": ISO-8601,
     "nodes": [{"node_id": 32 hex, "name": str, "fingerprints": [64 hex], "serials": [hex],
                "revoked_at": ISO-8601}]}

A node is revoked when its node id is listed (every certificate of its key), or when the
certificate it presents is listed by fingerprint or serial.  Versions only grow: a list is
replaced only by a higher version of the same pool, signed by its CA; a lower version is
"stale", a bad signature "forged" (both refused and counted by the caller).  The file on disk
and the wire body carry the same two fields: ``list`` (the document's bytes) and ``sig``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import logging
import os
import random
import re
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from frenzyd.errors import AuthError, ConfigError, FrenzyError, PeerError
from frenzyd.net import auth
from frenzyd.net.dispatch import Counters, Reply
from frenzyd.net.messages import Revocations
from frenzyd.net.wire import FrameRejected, Message

log = logging.getLogger(__name__)

LIST_FORMAT: Final = "frenzy-revocations"
FILE_FORMAT: Final = "frenzy-revocation-list"
REVOCATIONS_FILE: Final = "revocations.json"
MAX_LIST_BYTES: Final = 256 * 1024
"""Largest list document accepted (about 1,000 removed nodes)."""
MAX_FILE_BYTES: Final = 2 * MAX_LIST_BYTES
ANTI_ENTROPY_S: Final = 30.0
"""About this often (jittered) a member compares lists with one live member picked at random, so a
list that a failed send did not deliver still spreads: one small message per member and period,
whatever the pool's size."""
_NODE_ID: Final = re.compile(r"^[0-9a-f]{32}$")
_HEX: Final = re.compile(r"^[0-9a-f]{1,64}$")


class RevocationError(AuthError):
    """A list that is refused: ``reason`` is ``forged_revocation`` (not our CA's signature),
    ``malformed_revocation`` (not a list, another pool's, oversized) or ``stale_revocation``."""


@dataclass(frozen=True)
class RevokedNode:
    node_id: str
    name: str
    fingerprints: tuple[str, ...] = ()
    serials: tuple[str, ...] = ()
    revoked_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "name": self.name, "fingerprints": list(self.fingerprints),
                "serials": list(self.serials), "revoked_at": self.revoked_at}


@dataclass(frozen=True)
class RevocationList:
    """A checked list: its fields, and the exact signed bytes (``raw``) with the CA's ``sig``."""

    pool_id: str
    version: int
    issued_at: str
    nodes: tuple[RevokedNode, ...]
    raw: bytes
    sig: bytes

    @property
    def node_ids(self) -> frozenset[str]:
        return frozenset(n.node_id for n in self.nodes)

    def revokes(self, node_id: str, fingerprint: str | None = None, serial: str | None = None) -> bool:
        """Whether a peer with this node id (and, when known, certificate) is removed from the pool."""
        for n in self.nodes:
            if n.node_id == node_id or (fingerprint and fingerprint in n.fingerprints) or (
                    serial and serial in n.serials):
                return True
        return False

    def wire_body(self) -> dict[str, Any]:
        """The ``revocations`` message body carrying this list."""
        return {"version": self.version, "list": self.raw, "sig": self.sig}

    def file_bytes(self) -> bytes:
        """The list as ``revocations.json`` holds it."""
        doc = {"format": FILE_FORMAT, "list": self.raw.decode(), "sig": base64.b64encode(self.sig).decode()}
        return (json.dumps(doc, indent=1) + "\n").encode()


def _malformed(detail: str) -> RevocationError:
    return RevocationError("malformed_revocation", detail)


def _strings(value: object, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and pattern.match(v) for v in value):
        raise _malformed(f"{what} must be a list of lower-case hex strings")
    return tuple(value)


def check_list(ca_pem: bytes, raw: bytes, sig: bytes) -> RevocationList:
    """Verify the CA's signature over ``raw`` and parse it; raise :class:`RevocationError`.

    The signature is checked before the document is parsed: a list nobody in the pool signed is
    ``forged_revocation`` whatever it says."""
    if len(raw) > MAX_LIST_BYTES:
        raise _malformed(f"list of {len(raw)} bytes > {MAX_LIST_BYTES}")
    try:
        auth.verify_ca_signature(ca_pem, raw, sig)
    except AuthError as exc:
        raise RevocationError("forged_revocation", str(exc).removeprefix(f"{exc.reason}: ")) from exc
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _malformed("the signed list is not JSON") from exc
    if not isinstance(doc, dict) or doc.get("format") != LIST_FORMAT:
        raise _malformed(f"not a {LIST_FORMAT!r} document")
    version, pool_id, issued = doc.get("version"), doc.get("pool_id"), doc.get("issued_at")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version < 2**53:
        raise _malformed("version must be an integer >= 1")
    if pool_id != auth.pool_id_of(ca_pem):
        raise _malformed("the list names another pool")
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list) or not all(isinstance(n, dict) for n in raw_nodes):
        raise _malformed("nodes must be a list of objects")
    nodes = []
    for n in raw_nodes:
        node_id = n.get("node_id")
        if not isinstance(node_id, str) or not _NODE_ID.match(node_id):
            raise _malformed("a node_id is not 32 hex digits")
        nodes.append(RevokedNode(node_id=node_id, name=str(n.get("name", "")),
                                 fingerprints=_strings(n.get("fingerprints", []), _HEX, "fingerprints"),
                                 serials=_strings(n.get("serials", []), _HEX, "serials"),
                                 revoked_at=str(n.get("revoked_at", ""))))
    return RevocationList(pool_id=str(pool_id), version=version, issued_at=str(issued or ""),
                          nodes=tuple(nodes), raw=raw, sig=sig)


def build_list(ca_pem: bytes, ca_key_pem: bytes, version: int, nodes: Iterable[RevokedNode],
               now: dt.datetime) -> RevocationList:
    """Sign a list of ``nodes`` at ``version`` with the pool CA (no file is written)."""
    doc = {"format": LIST_FORMAT, "pool_id": auth.pool_id_of(ca_pem), "version": version,
           "issued_at": now.isoformat(timespec="seconds"), "nodes": [n.to_dict() for n in nodes]}
    raw = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    return check_list(ca_pem, raw, auth.ca_sign(ca_pem, ca_key_pem, raw))


def parse_file(ca_pem: bytes, data: bytes, *, source: str = "the revocation list") -> RevocationList:
    """Read ``revocations.json`` bytes (see :meth:`RevocationList.file_bytes`) and check them."""
    if len(data) > MAX_FILE_BYTES:
        raise _malformed(f"{source} is {len(data)} bytes")
    try:
        doc = json.loads(data)
        raw, sig = doc["list"].encode(), base64.b64decode(doc["sig"], validate=True)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _malformed(f"{source} is not a Frenzy revocation list") from exc
    if doc.get("format") != FILE_FORMAT:
        raise _malformed(f"{source} is not a Frenzy revocation list")
    return check_list(ca_pem, raw, sig)


def read_file(ca_pem: bytes, path: Path) -> RevocationList | None:
    """The list at ``path``, None when there is no file (RevocationError when it is refused)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    return parse_file(ca_pem, data, source=str(path))


def write_file(path: Path, lst: RevocationList) -> None:
    """Replace ``path`` with ``lst`` atomically (mode 0644: the list is public, only signed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(lst.file_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- the CA's side: pool remove-node -------------------------------------------------------------


def _resolve(pool_dir: Path, ca_pem: bytes, node: str) -> RevokedNode:
    """A node named by its name (every certificate issued under it), its node id, or the path of its
    ``node.pem`` / credentials directory."""
    issued = auth.issued_certificates(pool_dir)
    path = Path(node)
    if "/" in node or node.endswith(".pem"):
        pem = (path / auth.NODE_CERT_FILE if path.is_dir() else path).read_bytes()
        node_id, name = auth.verify_node_cert(ca_pem, pem)
        fps = {auth.certificate_fingerprint(pem)} | {i["fingerprint"] for i in issued
                                                      if i["node_id"] == node_id and "fingerprint" in i}
        serials = {auth.certificate_serial(pem)}
        return RevokedNode(node_id, name, tuple(sorted(fps)), tuple(sorted(serials)))
    matches = [i for i in issued if node in (i["name"], i["node_id"])]
    if not matches and _NODE_ID.match(node):
        return RevokedNode(node, "")
    if not matches:
        known = ", ".join(sorted({i["name"] for i in issued})) or "none recorded"
        raise ConfigError(f"no node {node!r} was enrolled from {pool_dir} (known: {known}); name it by "
                          "its node id (frenzy-client status shows it) or by the path of its node.pem")
    ids = {i["node_id"] for i in matches}
    if len(ids) > 1 and node not in ids:
        raise ConfigError(f"name {node!r} was enrolled {len(ids)} times (node ids {', '.join(sorted(ids))}); "
                          "remove each by its node id")
    node_id = ids.pop()
    mine = [i for i in matches if i["node_id"] == node_id]
    return RevokedNode(node_id, mine[-1]["name"],
                       tuple(sorted({i["fingerprint"] for i in mine if "fingerprint" in i})),
                       tuple(sorted({i["serial"] for i in mine if "serial" in i})))


def revoke(pool_dir: Path, nodes: Iterable[str], *, now: dt.datetime | None = None) -> RevocationList:
    """Add ``nodes`` (names, node ids or node.pem paths) to the pool's list, one version up, and write
    it to ``pool_dir/revocations.json``; return the new list.  Needs ``pool_dir/ca.key``."""
    pool_dir = Path(pool_dir)
    try:
        ca_pem = (pool_dir / auth.CA_FILE).read_bytes()
        ca_key_pem = (pool_dir / auth.CA_KEY_FILE).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"{pool_dir} is not a pool directory with its CA key (no {exc.filename}); run "
                          "remove-node where 'pool init' made the pool") from exc
    now = now or dt.datetime.now(dt.UTC)
    old = read_file(ca_pem, pool_dir / REVOCATIONS_FILE)
    entries = {n.node_id: n for n in (old.nodes if old else ())}
    for name in nodes:
        new = _resolve(pool_dir, ca_pem, name)
        prev = entries.get(new.node_id)
        if prev is not None:  # again: keep the first date, add any certificate not listed yet
            new = RevokedNode(new.node_id, new.name or prev.name,
                              tuple(sorted({*prev.fingerprints, *new.fingerprints})),
                              tuple(sorted({*prev.serials, *new.serials})), prev.revoked_at)
        entries[new.node_id] = new if new.revoked_at else RevokedNode(
            new.node_id, new.name, new.fingerprints, new.serials, now.isoformat(timespec="seconds"))
    lst = build_list(ca_pem, ca_key_pem, (old.version if old else 0) + 1, entries.values(), now)
    write_file(pool_dir / REVOCATIONS_FILE, lst)
    return lst


# --- a daemon's side ---------------------------------------------------------------------------


class RevocationState:
    """The newest list this daemon knows, persisted in ``data_dir/revocations.json``.

    At start it takes the newest valid list of ``sources`` (its own file, and
    ``[pool] credentials/revocations.json`` where an admin may put one); a refused file is logged
    and counted, never used.  :meth:`offer` takes a list from a peer or the client API.
    ``refused`` counts refusals by reason; ``listeners`` hear every adopted list.
    """

    def __init__(self, ca_pem: bytes, path: Path, sources: Iterable[Path] = ()) -> None:
        self.ca_pem = ca_pem
        self.path = path
        self.current: RevocationList | None = None
        self.refused: Counter[str] = Counter()
        self.listeners: list[Callable[[RevocationList], None]] = []
        for src in (path, *sources):
            try:
                lst = read_file(ca_pem, src)
            except (RevocationError, OSError) as exc:
                self.refused[getattr(exc, "reason", "unreadable")] += 1
                log.error("ignoring the revocation list %s: %s", src, exc)  # noqa: TRY400
                continue
            if lst is not None and (self.current is None or lst.version > self.current.version):
                self.current = lst
        if self.current is not None:
            self._save()
            log.info("revocation list version %d: %d node(s) removed from the pool", self.current.version,
                     len(self.current.nodes))

    @property
    def version(self) -> int:
        """The current list's version (0: none)."""
        return self.current.version if self.current is not None else 0

    def is_revoked(self, node_id: str, der: bytes | None = None) -> bool:
        """Whether the peer ``node_id`` (presenting certificate ``der``, when known) is removed."""
        cur = self.current
        if cur is None:
            return False
        if der is None:
            return cur.revokes(node_id)
        try:
            return cur.revokes(node_id, auth.certificate_fingerprint(der), auth.certificate_serial(der))
        except AuthError:
            return True  # an unreadable certificate is not let through by a revocation check

    def check_peer(self, node_id: str, der: bytes | None = None) -> None:
        """Raise AuthError(``revoked_certificate``) when the peer is removed from the pool."""
        if self.is_revoked(node_id, der):
            raise AuthError("revoked_certificate", f"node {node_id[:12]} was removed from the pool "
                            f"(revocation list version {self.version})")

    def offer(self, raw: bytes, sig: bytes) -> bool:
        """Take a list if it is this pool's and newer; return whether it was adopted.

        Raises :class:`RevocationError`: ``forged_revocation`` / ``malformed_revocation`` (counted
        here), and ``stale_revocation`` for a lower version than ours (counted; the caller answers
        with ours).  The same version again returns False."""
        try:
            lst = check_list(self.ca_pem, raw, sig)
        except RevocationError as exc:
            self.refused[exc.reason] += 1
            raise
        if lst.version < self.version:
            self.refused["stale_revocation"] += 1
            raise RevocationError("stale_revocation", f"version {lst.version} < ours {self.version}")
        if lst.version == self.version:
            assert self.current is not None
            if lst.raw != self.current.raw:  # two pool directories issued the same version: keep ours
                self.refused["conflicting_revocation"] += 1
                log.error("two different revocation lists of version %d exist (was the pool directory "
                          "copied?): keeping the one this node has; issue a newer one from the pool "
                          "directory that has both removals", lst.version)
            return False
        self.current = lst
        self._save()
        log.warning("revocation list version %d adopted: removed %s", lst.version,
                    ", ".join(f"{n.name or '?'} ({n.node_id[:12]})" for n in lst.nodes) or "nobody")
        for listener in list(self.listeners):
            listener(lst)
        return True

    def offer_file(self, data: bytes, *, source: str = "the list given") -> bool:
        """:meth:`offer` for ``revocations.json`` bytes (a refusal counted here too)."""
        try:
            lst = parse_file(self.ca_pem, data, source=source)
        except RevocationError as exc:
            self.refused[exc.reason] += 1
            raise
        return self.offer(lst.raw, lst.sig)

    def _save(self) -> None:
        assert self.current is not None
        try:
            write_file(self.path, self.current)
        except OSError as exc:
            log.error("cannot keep the revocation list in %s: %s (it holds until restart)",  # noqa: TRY400
                      self.path, exc)

    def summary(self) -> Mapping[str, Any]:
        """For status and the client API: the version and the removed nodes."""
        cur = self.current
        return {"version": self.version,
                "nodes": [{"node_id": n.node_id, "name": n.name, "revoked_at": n.revoked_at}
                          for n in (cur.nodes if cur else ())]}


# --- passing it on --------------------------------------------------------------------------------

SendFn = Callable[[str, str, Mapping[str, Any]], Awaitable[Message]]
"""``send(node_id, kind, body)`` -> the peer's reply (``PeerNetwork.send``; PeerError on failure)."""


class RevocationGossip:
    """Passes the newest list on: to a peer when it becomes live (both sides say which version they
    have; the one with the newer list answers with it), to every live peer when this node adopts a
    newer list, and to one random live peer about every :data:`ANTI_ENTROPY_S` (:meth:`start`).
    Every peer that adopts it does the same, so a list reaches every member connected to one that
    has it.  Also forgets a removed node at once (``forget(node_id)``)."""

    def __init__(self, state: RevocationState, send: SendFn, live_peers: Callable[[], list[str]],
                 forget: Callable[[str], None], counters: Counters) -> None:
        self.state = state
        self._send = send
        self._live = live_peers
        self._forget = forget
        self.counters = counters
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        state.listeners.append(self._adopted)

    def start(self, every_s: float = ANTI_ENTROPY_S) -> None:
        """Start the anti-entropy loop (:data:`ANTI_ENTROPY_S`); :meth:`close` stops it."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._anti_entropy(every_s),
                                                                name="revocation anti-entropy")

    async def _anti_entropy(self, every_s: float) -> None:
        rng = random.Random()
        while True:
            await asyncio.sleep(every_s * rng.uniform(0.5, 1.5))
            peers = [p for p in self._live() if not self.state.is_revoked(p)]
            if peers:
                try:
                    await self._exchange(rng.choice(peers))
                except FrenzyError as exc:  # a message this node cannot even send: say so, go on
                    log.warning("revocation anti-entropy: %s", exc)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro, name=name)
        except RuntimeError:  # no loop (a test driving the state alone): nothing to send
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _body(self) -> dict[str, Any]:
        cur = self.state.current
        return Revocations(version=0).to_body() if cur is None else cur.wire_body()

    def _adopted(self, lst: RevocationList) -> None:
        for node_id in lst.node_ids:
            self._forget(node_id)
        for peer in self._live():
            if not lst.revokes(peer):
                self._spawn(self._exchange(peer), f"revocations to {peer[:12]}")

    def peer_live(self, node_id: str) -> None:
        """A peer became live (first heard, or back): tell it which list we have."""
        if not self.state.is_revoked(node_id):
            self._spawn(self._exchange(node_id), f"revocations to {node_id[:12]}")

    def take(self, raw: bytes, sig: bytes, peer: str) -> str:
        """Offer a list from ``peer``: ``"adopted"``, ``"same"`` (ours), or ``"stale"`` (older than ours;
        counted in ``dropped``).  Raises RevocationError for a forged or malformed list."""
        try:
            return "adopted" if self.state.offer(raw, sig) else "same"
        except RevocationError as exc:
            if exc.reason != "stale_revocation":
                raise
            self.counters.dropped["stale_revocation"] += 1
            log.info("peer %s sent revocation list %s", peer[:12], exc)
            return "stale"

    async def handle(self, peer_id: str, msg: Any) -> dict[str, Any] | Reply:
        """The ``revocations`` handler: take a newer list; answer with ours when it is newer."""
        assert isinstance(msg, Revocations)
        theirs = msg.version
        if msg.list is not None and msg.sig is not None:
            theirs = -1 if self.take(msg.list, msg.sig, peer_id) == "stale" else self.state.version
        cur = self.state.current
        if cur is not None and cur.version > theirs:
            return Reply(Revocations.KIND, cur.wire_body())
        return {}

    async def _exchange(self, node_id: str) -> None:
        try:
            reply = await self._send(node_id, Revocations.KIND, self._body())
        except PeerError as exc:
            log.debug("could not exchange revocation lists with %s: %s", node_id[:12], exc)
            return
        if reply.kind != Revocations.KIND:
            return
        try:
            msg = Revocations.from_body(reply.body)
            if msg.list is not None and msg.sig is not None:
                self.take(msg.list, msg.sig, node_id)
        except RevocationError as exc:
            self.counters.auth_refusals[exc.reason] += 1
            log.warning("refused the revocation list %s sent: %s", node_id[:12], exc)
        except FrameRejected as exc:
            self.counters.dropped[exc.reason] += 1

    async def close(self) -> None:
        """Stop the anti-entropy loop and cancel the exchanges in flight."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

