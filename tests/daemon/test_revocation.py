"""Removing a node (issue 16): the CA-signed revocation list is honoured and passed on by every member.

The peer layers here are the daemon's own (``PeerNetwork``: real aiohttp servers, mutual TLS on
loopback, heartbeats, election); the last test runs real ``frenzyd`` processes driven by
``frenzy-client pool remove-node``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import socket
import ssl
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from frenzyd.errors import AuthError, ConfigError, PeerError
from frenzyd.net import auth, revocation, tls, wire
from frenzyd.net.dispatch import Counters, Reply
from frenzyd.net.election import ElectionState, Role
from frenzyd.net.messages import Revocations
from frenzyd.net.network import PeerNetwork

from .conftest import fast_config

NAMES = ("a", "b", "c", "v")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, auth.Credentials]]:
    """Pool "lab" with nodes a, b, c and v (the one to remove), and its directory (with ca.key)."""
    d = tmp_path_factory.mktemp("revpool")
    auth.create_pool(d / "lab")
    creds = {n: auth.load_credentials(auth.add_node(d / "lab", n, d / "creds" / n).out_dir) for n in NAMES}
    auth.create_pool(d / "other")
    return d / "lab", creds


@pytest.fixture
async def nets(tmp_path: Path, pool: tuple[Path, dict[str, auth.Credentials]]) -> AsyncIterator[Any]:
    started: list[PeerNetwork] = []

    async def make(name: str, priority: int = 0, **network: Any) -> PeerNetwork:
        creds = pool[1][name]
        cfg = fast_config(tmp_path, creds, priority, **network)
        cfg.node.data_dir.mkdir(exist_ok=True)
        el = ElectionState(creds.node_id, priority, started_at=time.monotonic(),
                           grace_s=cfg.timing.election_grace_s)
        net = PeerNetwork(cfg, creds, el)
        await net.start()
        started.append(net)
        return net

    yield make
    for net in started:
        await net.stop()


def _dial(net: PeerNetwork, *others: PeerNetwork) -> None:
    for o in others:
        net.add_address(o.address, source="static")


def _doc(lst: revocation.RevocationList) -> dict[str, Any]:
    return dict(json.loads(lst.file_bytes()))


def test_remove_node_writes_a_signed_list_that_only_grows(
    tmp_path: Path, pool: tuple[Path, dict[str, auth.Credentials]],
) -> None:
    auth.create_pool(tmp_path / "p")
    for n in ("x", "y"):
        auth.add_node(tmp_path / "p", n, tmp_path / n)
    ca = (tmp_path / "p" / "ca.pem").read_bytes()
    one = revocation.revoke(tmp_path / "p", ["x"])
    x = auth.load_credentials(tmp_path / "x")
    assert (one.version, [n.node_id for n in one.nodes]) == (1, [x.node_id])
    assert one.nodes[0].fingerprints == (auth.certificate_fingerprint(x.cert_pem),)
    two = revocation.revoke(tmp_path / "p", [str(tmp_path / "y" / "node.pem")])
    assert two.version == 2
    assert len(two.nodes) == 2
    again = revocation.read_file(ca, tmp_path / "p" / revocation.REVOCATIONS_FILE)
    assert again is not None
    assert again.raw == two.raw
    with pytest.raises(ConfigError, match="no node 'nobody'"):
        revocation.revoke(tmp_path / "p", ["nobody"])
    # Tampering with the signed bytes, or another pool's CA signing, is "forged".
    doc = _doc(two)
    doc["list"] = doc["list"].replace('"version":2', '"version":9')
    with pytest.raises(revocation.RevocationError) as info:
        revocation.parse_file(ca, json.dumps(doc).encode())
    assert info.value.reason == "forged_revocation"
    other_ca = (pool[0].parent / "other" / "ca.pem").read_bytes()
    with pytest.raises(revocation.RevocationError) as info:
        revocation.parse_file(other_ca, two.file_bytes())
    assert info.value.reason == "forged_revocation"


def test_renew_node_keeps_the_node_id_and_never_needs_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from frenzy_client.cli import run_cli

    auth.create_pool(tmp_path / "p")
    node = auth.add_node(tmp_path / "p", "x", tmp_path / "x", valid_days=3)
    before = auth.load_credentials(tmp_path / "x")
    _, not_after = auth.certificate_dates(before.cert_pem)
    assert dt.timedelta(days=2) < not_after - dt.datetime.now(dt.UTC) <= dt.timedelta(days=3)
    # An expired certificate (the daemon refuses to start with it) is renewed from its public half.
    ca, ca_key = (tmp_path / "p" / "ca.pem").read_bytes(), (tmp_path / "p" / "ca.key").read_bytes()
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    (tmp_path / "x" / "node.pem").write_bytes(auth.issue_node_cert(ca, ca_key, "x", before.key_pem, long_ago,
                                                                   valid_days=1))
    with pytest.raises(AuthError, match="expired_certificate"):
        auth.load_credentials(tmp_path / "x")
    key = tmp_path / "x" / "node.key"
    key.rename(tmp_path / "elsewhere.key")  # renewal never reads the node's key: it stays on the node
    argv = ["pool", "renew-node", str(tmp_path / "p"), str(tmp_path / "x"), "--days", "400", "--json"]
    assert run_cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["node_id"] == node.node_id
    (tmp_path / "elsewhere.key").rename(key)
    after = auth.load_credentials(tmp_path / "x")
    assert after.node_id == before.node_id
    assert auth.certificate_serial(after.cert_pem) != auth.certificate_serial(before.cert_pem)
    assert auth.certificate_dates(after.cert_pem)[1] - dt.datetime.now(dt.UTC) > dt.timedelta(days=399)
    # remove-node names every certificate issued under the name, the renewed one included.
    lst = revocation.revoke(tmp_path / "p", ["x"])
    assert auth.certificate_fingerprint(after.cert_pem) in lst.nodes[0].fingerprints
    # A removed node's key is not renewed (its certificate would be refused anyway).
    assert run_cli(argv) != 0
    assert "was removed from the pool" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="1 to 3650 days"):
        auth.renew_node(tmp_path / "p", tmp_path / "x", valid_days=0)


async def test_a_removed_node_is_refused_by_every_member_and_cannot_coordinate(
    nets: Any, pool: tuple[Path, dict[str, auth.Credentials]],
) -> None:
    pool_dir, creds = pool
    v_id = creds["v"].node_id
    a, b, v = await nets("a"), await nets("b"), await nets("v", priority=9)
    _dial(a, b, v)
    _dial(b, a, v)
    _dial(v, a, b)
    assert await a.wait_until(lambda: all(len(n.live_peers()) == 2 for n in (a, b, v))
                              and a.election.coordinator == v_id == b.election.coordinator, 15.0)

    # The issuer's daemon gets the list (what `pool remove-node` does through the client API).
    lst = revocation.revoke(pool_dir, ["v"])
    out = a.accept_revocations(_doc(lst))
    assert out["adopted"]
    assert out["version"] == lst.version
    # b hears it from a, not from the issuer; both forget v and elect one of themselves.
    assert await b.wait_until(lambda: b.revocations.version == lst.version, 10.0)
    assert await a.wait_until(
        lambda: all(v_id not in n.live_peers() and n.election.coordinator not in (None, v_id)
                    for n in (a, b)) and a.election.coordinator == b.election.coordinator, 15.0)
    assert v_id not in {r.node_id for r in a.table.records()} | {r.node_id for r in b.table.records()}
    # v keeps trying: its heartbeats and messages are refused by both (TLS door or per frame).
    await v.heartbeat_once(wait_s=3.0)
    for n in (a, b):
        with pytest.raises(PeerError):
            await v.send(n.creds.node_id, "revocations", {"version": 0})
        assert n.auth_refusals["revoked_certificate"] > 0
        assert v_id not in n.live_peers()
    # A fresh TLS connection from v is closed right after the handshake, before any request is read.
    before = a.auth_refusals["revoked_certificate"]
    host, port = a.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=tls.client_context(creds["v"]))
    writer.write(b"POST /v1/msg HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # no HTTP answer at all
    writer.close()
    assert a.auth_refusals["revoked_certificate"] > before
    # Nor does v become coordinator by claiming a higher term: its frames never get in.
    assert a.election.role is Role.COORDINATOR or b.election.role is Role.COORDINATOR

    # c was down; it starts knowing only b and v (a is gone) and learns the list from b.
    await a.stop()
    c = await nets("c")
    _dial(c, b, v)
    assert await c.wait_until(lambda: c.revocations.version == lst.version, 10.0)
    assert (c.config.node.data_dir / revocation.REVOCATIONS_FILE).exists()
    await v.heartbeat_once(wait_s=3.0)
    assert await c.wait_until(
        lambda: v_id not in c.live_peers() and c.auth_refusals["revoked_certificate"] > 0, 10.0)
    with pytest.raises(PeerError):
        await v.send(c.creds.node_id, "revocations", {"version": 0})


async def test_a_list_that_was_not_pushed_still_spreads_by_anti_entropy(
    tmp_path: Path, pool: tuple[Path, dict[str, auth.Credentials]],
) -> None:
    """Two members that never become live to each other again (no exchange on connect) and whose push
    never went out (no listeners): the periodic comparison with a random live member still delivers the
    list.  Frames go through the wire codec; the transport is a direct call to the other's handler."""
    pool_dir, creds = pool
    ca = creds["a"].ca_pem
    got_a = revocation.RevocationState(ca, tmp_path / "a.json")
    got_b = revocation.RevocationState(ca, tmp_path / "b.json")
    b_side = revocation.RevocationGossip(got_b, _unused_send, lambda: ["a"], lambda _: None, Counters())

    async def send_to_b(node: str, kind: str, body: Any) -> wire.Message:
        msg = wire.parse(wire.decode(wire.encode(kind, body)))
        reply = await b_side.handle("a", msg)
        out = reply if isinstance(reply, Reply) else Reply("ok", reply or {})
        return wire.decode(wire.encode(out.kind, out.body))

    a_side = revocation.RevocationGossip(got_a, send_to_b, lambda: ["b"], lambda _: None, Counters())
    got_a.listeners.clear()  # no push: only the periodic comparison is left
    lst = revocation.build_list(ca, (pool_dir / "ca.key").read_bytes(), 7,
                                [revocation.RevokedNode(creds["v"].node_id, "v")], dt.datetime.now(dt.UTC))
    assert got_a.offer(lst.raw, lst.sig)
    assert got_b.version == 0
    a_side.start(every_s=0.05)
    try:
        for _ in range(200):
            if got_b.version == lst.version:
                break
            await asyncio.sleep(0.02)
        assert got_b.version == lst.version
        assert (tmp_path / "b.json").exists()
    finally:
        await a_side.close()


async def _unused_send(node: str, kind: str, body: Any) -> wire.Message:
    raise PeerError("unreachable", "this side only answers")


async def test_under_swim_membership_gossip_never_brings_a_removed_node_back(
    nets: Any, pool: tuple[Path, dict[str, auth.Credentials]],
) -> None:
    """[network] membership = "swim": members learn of each other through gossip, not only through
    heartbeats; an entry about a removed node (from the SWIM core's own state or a member that has not
    heard of the list yet) must not make it live, nor coordinator, again."""
    pool_dir, creds = pool
    v_id = creds["v"].node_id
    a = await nets("a", membership="swim")
    b = await nets("b", membership="swim")
    v = await nets("v", 9, membership="swim")
    for n, others in ((a, (b, v)), (b, (a, v)), (v, (a, b))):
        _dial(n, *others)
    assert await a.wait_until(lambda: all(len(n.live_peers()) == 2 for n in (a, b, v))
                              and a.election.coordinator == v_id == b.election.coordinator, 20.0)
    old = revocation.read_file(a.creds.ca_pem, pool_dir / revocation.REVOCATIONS_FILE)
    lst = revocation.build_list(a.creds.ca_pem, (pool_dir / "ca.key").read_bytes(),
                                (old.version if old else 0) + 1, [revocation.RevokedNode(v_id, "v")],
                                dt.datetime.now(dt.UTC))
    a.accept_revocations(_doc(lst))
    assert v_id not in a.live_peers()  # forgotten at once
    # From now on a never counts v live again: not while its SWIM core still lists v, nor when it
    # suspects v (its pings are refused), nor when b, which learns the list a little later, gossips v.
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        assert v_id not in a.live_peers()
        await asyncio.sleep(0.02)
    assert await a.wait_until(
        lambda: all(v_id not in n.live_peers() and n.election.coordinator not in (None, v_id)
                    for n in (a, b)), 20.0)


async def test_forged_and_older_lists_are_refused_and_counted_and_restart_keeps_the_list(
    nets: Any, tmp_path: Path, pool: tuple[Path, dict[str, auth.Credentials]],
) -> None:
    pool_dir, creds = pool
    ca = creds["a"].ca_pem
    old = revocation.read_file(ca, pool_dir / revocation.REVOCATIONS_FILE)
    now = dt.datetime.now(dt.UTC)
    v = revocation.RevokedNode(creds["v"].node_id, "v")
    base = old.version if old else 0
    newer = revocation.build_list(ca, (pool_dir / "ca.key").read_bytes(), base + 2, [v], now)
    older = revocation.build_list(ca, (pool_dir / "ca.key").read_bytes(), base + 1, [v], now)
    other = pool_dir.parent / "other"
    forged = revocation.build_list((other / "ca.pem").read_bytes(), (other / "ca.key").read_bytes(), 99,
                                   [revocation.RevokedNode(creds["a"].node_id, "a")], now)

    a, b = await nets("a"), await nets("b")
    _dial(a, b)
    _dial(b, a)
    assert await a.wait_until(lambda: len(a.live_peers()) == 1 and len(b.live_peers()) == 1, 15.0)
    assert a.accept_revocations(_doc(newer))["version"] == newer.version
    assert await b.wait_until(lambda: b.revocations.version == newer.version, 10.0)

    # A forged list (another CA signed it; it would remove a) is refused by the client API path and
    # over the wire, and counted; nothing changes.
    with pytest.raises(AuthError) as info:
        a.accept_revocations(_doc(forged))
    assert info.value.reason == "forged_revocation"
    with pytest.raises(PeerError) as perr:
        await b.send(a.creds.node_id, "revocations", forged.wire_body())
    assert perr.value.reason == "forged_revocation"
    assert a.auth_refusals["forged_revocation"] == 1
    assert a.revocations.refused["forged_revocation"] == 2
    # An older list is refused too (counted); the answer carries the newer one.
    with pytest.raises(AuthError) as info:
        a.accept_revocations(_doc(older))
    assert info.value.reason == "stale_revocation"
    reply = await b.send(a.creds.node_id, "revocations", older.wire_body())
    assert reply.kind == "revocations"
    assert Revocations.from_body(reply.body).version == newer.version
    assert a.dropped["stale_revocation"] == 1
    assert a.revocations.version == newer.version

    # Restart b (a new peer layer on the same data directory): the list is still there.
    await b.stop()
    b2 = await nets("b")
    assert b2.revocations.version == newer.version
    assert b2.revocations.is_revoked(creds["v"].node_id)
    # A forged file dropped in the data directory is ignored at start, and counted.
    (b2.config.node.data_dir / revocation.REVOCATIONS_FILE).write_bytes(forged.file_bytes())
    b3 = PeerNetwork(b2.config, creds["b"], ElectionState(creds["b"].node_id, 0, started_at=0, grace_s=1))
    assert b3.revocations.version == 0
    assert b3.revocations.refused["forged_revocation"] == 1


@pytest.mark.timeout(120)
def test_cli_remove_node_reaches_every_running_daemon_and_survives_restart(tmp_path: Path) -> None:
    """Real frenzyd processes: `pool remove-node` on the CA's machine gives the list to its daemon,
    which passes it on; the removed node is refused everywhere, also after a restart."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "scripts"))
    from _pool import Daemon, NodeConf, cli, wait_until

    auth.create_pool(tmp_path / "pool")  # what `pool init` / `pool add-node` do, without 4 processes
    creds = {n: auth.add_node(tmp_path / "pool", n, tmp_path / "pool" / "nodes" / n).out_dir
             for n in ("a", "b", "v")}
    socks = [socket.socket() for _ in range(6)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    peers = [f"127.0.0.1:{p}" for p in ports[:3]]
    daemons = {n: Daemon(NodeConf(name=n, base=tmp_path / n, credentials=creds[n], devices=[],
                                  listen=peers[i], web=f"127.0.0.1:{ports[3 + i]}", peers=peers, mdns=False,
                                  heartbeat_s=0.2, peer_timeout_s=1.2))
               for i, n in enumerate(("a", "b", "v"))}
    v_id = json.loads((creds["v"] / "node.json").read_text())["node_id"]

    def status(d: Daemon) -> dict[str, Any]:
        """GET /v1/status on the daemon's unix socket ({} while it does not answer): no client process."""
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(5)
                sock.connect(str(d.conf.socket))
                sock.sendall(b"GET /v1/status HTTP/1.0\r\nHost: x\r\n\r\n")
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
        except OSError:
            return {}
        head, _, body = data.partition(b"\r\n\r\n")
        return dict(json.loads(body)) if head.split(b"\r\n", 1)[0].split(b" ")[1:2] == [b"200"] else {}

    def alive(d: Daemon) -> set[str]:
        return {p["id"] for p in status(d).get("peers", []) if p.get("alive")}

    def refusals(i: int) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[3 + i]}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("frenzy_auth_refusals_total")
                   and 'reason="revoked_certificate"' in line)

    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {what}")

    try:
        for d in daemons.values():
            d.start()
        a, b = daemons["a"], daemons["b"]
        wait_until(lambda: v_id in alive(a) and v_id in alive(b), 40, "v to join the pool")
        mark("v joined")
        out = json.loads(cli("pool", "remove-node", str(tmp_path / "pool"), "v", "--daemon", a.address,
                             "--json"))
        assert out["version"] == 1
        assert out["pushed"]["adopted"]
        assert out["removed"][0]["node_id"] == v_id
        mark("removed")
        wait_until(lambda: v_id not in alive(a) and v_id not in alive(b), 20, "a and b to drop v")
        wait_until(lambda: refusals(0) > 0 and refusals(1) > 0, 20, "v's connections to be refused")
        assert (b.conf.data_dir / "revocations.json").exists()  # b learned it from a
        mark("refused")
        # Pushing it again changes nothing; a forged copy is refused with a message saying so.
        doc = json.loads((tmp_path / "pool" / "revocations.json").read_text())
        doc["list"] = doc["list"].replace(v_id, "0" * 32)
        (tmp_path / "forged.json").write_text(json.dumps(doc))
        with pytest.raises(RuntimeError, match="forged_revocation"):
            cli("pool", "push-revocations", str(tmp_path / "forged.json"), "--daemon", b.address)
        mark("forged")
        # b restarts: it keeps the list and keeps refusing v.
        b.stop()
        b.start()
        wait_until(lambda: status(b), 30, "b to come back")
        before = refusals(1)
        wait_until(lambda: refusals(1) > before, 20, "b to refuse v after its restart")
        assert v_id not in alive(b)
        mark("restarted")
    finally:
        for d in daemons.values():
            d.kill()  # nothing runs on them: no need for the graceful shutdown's seconds
            d.stop(deadline_s=5)
