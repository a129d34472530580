"""Peer transport on loopback: real aiohttp servers with mutual TLS, heartbeats, election, handlers,
signed orders, refusal of another pool, and garbage frames that never stop the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from frenzyd.errors import AuthError, PeerError
from frenzyd.net import auth, tls, wire
from frenzyd.net.election import ElectionState, Role
from frenzyd.net.messages import Heartbeat
from frenzyd.net.network import CONTENT_TYPE, MSG_PATH, PeerNetwork, Reply
from frenzyd.net.peer_table import AddressBook, PeerTable
from frenzyd.net.ratelog import RateLimitedLog

from .conftest import fast_config

wire.register_kind("test.echo", {"text": str})
wire.register_kind("test.launch", wire.Schema(required={"job": str, "term": int}))

Factory = Callable[..., "asyncio.Future[PeerNetwork]"]


@pytest.fixture
async def make_net(tmp_path: Path, pool_creds: dict[str, auth.Credentials]) -> AsyncIterator[Any]:
    started: list[PeerNetwork] = []

    async def make(name: str, priority: int = 0, network: dict[str, Any] | None = None,
                   **kw: Any) -> PeerNetwork:
        creds = pool_creds[name]
        cfg = fast_config(tmp_path, creds, priority, **(network or {}))
        el = ElectionState(
            creds.node_id, priority, started_at=time.monotonic(), grace_s=cfg.timing.election_grace_s
        )
        net = PeerNetwork(cfg, creds, el, **kw)
        await net.start()
        started.append(net)
        return net

    yield make
    for net in started:
        await net.stop()


def _mesh(*nets: PeerNetwork) -> None:
    for a in nets:
        for b in nets:
            if a is not b:
                a.add_address(b.address, source="static")


def _agree(nets: list[PeerNetwork]) -> Callable[[], bool]:
    def check() -> bool:
        views = {(n.election.coordinator, n.election.term) for n in nets}
        coords = [n for n in nets if n.election.role is Role.COORDINATOR]
        return (
            len(views) == 1 and len(coords) == 1 and all(len(n.live_peers()) == len(nets) - 1 for n in nets)
        )

    return check


async def test_three_nodes_mesh_elect_one_coordinator_and_fail_over(make_net: Any) -> None:
    mesh = {"membership": "mesh"}  # swim's counterpart: test_swim_members_join_by_gossip_...
    n1 = await make_net("n1", priority=0, network=mesh)
    n2 = await make_net("n2", priority=5, network=mesh)
    n3 = await make_net("n3", priority=1, network=mesh)
    _mesh(n1, n2, n3)
    nets = [n1, n2, n3]
    assert await n1.wait_until(_agree(nets), 10.0)
    assert n2.election.role is Role.COORDINATOR  # highest priority
    term = n2.election.term
    rec = n1.table.get(n2.creds.node_id)
    assert rec is not None
    assert rec.name == "n2"
    assert rec.report.python
    # The coordinator dies: n3 (priority 1) takes over under a higher term.
    await n2.stop()
    assert await n1.wait_until(_agree([n1, n3]), 10.0)
    assert n3.election.role is Role.COORDINATOR
    assert n1.election.term > term


def _gpus(name: str) -> Callable[[], dict[str, Any]]:
    return lambda: {"gpus": [{"uuid": f"SIM-{name}-0", "type": "A10"}]}


async def test_swim_members_join_by_gossip_report_to_the_coordinator_only_and_fail_over(
    make_net: Any,
) -> None:
    swim = {"membership": "swim"}
    n1 = await make_net("n1", 0, network=swim, report_provider=_gpus("n1"))
    n2 = await make_net("n2", 5, network=swim, report_provider=_gpus("n2"))
    n3 = await make_net("n3", 1, network=swim, report_provider=_gpus("n3"))
    n4 = await make_net("n4", 0, network=swim, report_provider=_gpus("n4"))
    for n in (n2, n3, n4):  # n1 is everyone's one seed; the others learn each other by gossip
        n.add_address(n1.address, source="static")
    nets = [n1, n2, n3, n4]
    assert await n1.wait_until(_agree(nets), 20.0)
    assert n2.election.role is Role.COORDINATOR  # highest priority, learnt from membership entries

    def has_report(at: PeerNetwork, *of: PeerNetwork) -> Callable[[], bool]:
        return lambda: all((r := at.table.get(n.creds.node_id)) is not None and bool(r.report.gpus)
                           for n in of)

    # The coordinator holds every member's report; a member holds the coordinator's, not the others'.
    assert await n2.wait_until(has_report(n2, n1, n3, n4), 10.0)
    assert await n1.wait_until(has_report(n1, n2), 10.0)
    beats_at_n1, beats_at_n2 = n1.received["heartbeat"], n2.received["heartbeat"]
    # Heartbeats keep reaching the coordinator, and (but for an election a loaded host may cause) not
    # a plain member.
    assert await n2.wait_until(lambda: n2.received["heartbeat"] >= beats_at_n2 + 12, 15.0)
    assert n1.received["heartbeat"] - beats_at_n1 < 4
    for at, of in ((n3, n4), (n4, n3)):  # (n1, the seed, heard one heartbeat of each as it joined)
        assert await at.wait_until(lambda at=at, of=of: at.table.is_alive(of.creds.node_id, time.monotonic()),
                                   5.0)  # known and live by gossip alone...
        rec = at.table.get(of.creds.node_id)
        assert rec is not None
        assert rec.report.gpus is None  # ...with no report: they never heartbeat each other
    assert n1.received["swim.ping"] > 0
    assert n1.members is not None
    assert n1.members.driver is not None
    # A ping's ack comes back as the reply to its request (only forwarded acks are requests of their own).
    assert n1.members.driver.received["swim.ack"] > n1.received["swim.ack"]
    # The coordinator leaves: n3 (priority 1) takes over and rebuilds the view from heartbeats.
    term = n2.election.term
    await n2.stop()
    assert await n1.wait_until(_agree([n1, n3, n4]), 20.0)
    assert n3.election.role is Role.COORDINATOR
    assert n1.election.term > term
    assert await n3.wait_until(has_report(n3, n1, n4), 10.0)


async def test_better_node_joining_later_does_not_take_over(make_net: Any) -> None:
    n1 = await make_net("n1", priority=0)
    n3 = await make_net("n3", priority=0)
    _mesh(n1, n3)
    assert await n1.wait_until(_agree([n1, n3]), 10.0)
    sitting = n1.election.coordinator
    n2 = await make_net("n2", priority=9)
    _mesh(n1, n2, n3)
    assert await n1.wait_until(_agree([n1, n2, n3]), 10.0)
    assert n2.election.coordinator == sitting
    assert n2.election.role is Role.PEER


async def test_handlers_and_signed_orders_bound_to_the_term(make_net: Any) -> None:
    launched: list[tuple[str, dict[str, Any]]] = []

    async def echo(peer: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"detail": body["text"].upper(), "from": peer}

    async def launch(peer: str, body: dict[str, Any]) -> Reply:
        launched.append((peer, body))
        return Reply("ok", {"detail": "started"})

    n1 = await make_net("n1", priority=5)
    n2 = await make_net("n2")
    n3 = await make_net("n3")
    for n in (n2, n3):
        n.on("test.echo", echo)
        n.on("test.launch", launch, signed=True)
    _mesh(n1, n2, n3)
    assert await n1.wait_until(_agree([n1, n2, n3]), 10.0)
    assert n1.election.role is Role.COORDINATOR
    term = n1.election.term

    reply = await n1.send(n2.creds.node_id, "test.echo", {"text": "hi"})
    assert reply.body == {"detail": "HI", "from": n1.creds.node_id}

    with pytest.raises(PeerError) as info:  # an order must be signed
        await n1.send(n2.creds.node_id, "test.launch", {"job": "j1", "term": term})
    assert info.value.reason == "unsigned_order"
    assert n2.auth_refusals["unsigned_order"] == 1

    reply = await n1.send_signed(n2.creds.node_id, "test.launch", {"job": "j1", "term": term})
    assert reply.body == {"detail": "started"}
    assert launched == [(n1.creds.node_id, {"job": "j1", "term": term})]

    with pytest.raises(PeerError) as info:  # a stale term: refused
        await n1.send_signed(n2.creds.node_id, "test.launch", {"job": "j2", "term": term - 1})
    assert info.value.reason == "stale_term"
    with pytest.raises(PeerError) as info:  # the current term from a non-coordinator
        await n3.send_signed(n2.creds.node_id, "test.launch", {"job": "j3", "term": term})
    assert info.value.reason == "not_coordinator"
    assert [j for _, j in launched] == [{"job": "j1", "term": term}]

    results = await n1.broadcast("test.echo", {"text": "all"})
    assert set(results) == {n2.creds.node_id, n3.creds.node_id}
    assert all(isinstance(r, wire.Message) and r.body["detail"] == "ALL" for r in results.values())

    with pytest.raises(PeerError) as info:
        await n1.send("no-such-node", "test.echo", {"text": "x"})
    assert info.value.reason == "unknown_peer"
    with pytest.raises(PeerError) as info:  # nobody registered a handler for ok on n2
        await n1.send(n2.creds.node_id, "ok", {})
    assert info.value.reason == "unknown_kind"


async def _raw_post(net: PeerNetwork, creds: auth.Credentials, data: bytes) -> tuple[int, wire.Message]:
    connector = aiohttp.TCPConnector(ssl=tls.client_context(creds))
    url = f"https://{net.address}{MSG_PATH}"
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(url, data=data, headers={"Content-Type": CONTENT_TYPE}) as resp,
    ):
        return resp.status, wire.decode(await resp.read())


async def test_garbage_frames_are_dropped_counted_and_the_server_keeps_serving(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1", max_frame_bytes=4096)
    me = pool_creds["n2"]
    hb = {"node_id": me.node_id, "name": "n2", "address": "127.0.0.1:1", "priority": 0, "term": 0}
    cases = [
        (b"\xc1\x00garbage", "malformed"),
        (b"x" * 5000, "oversized"),
        (msgpack.packb({"v": 99, "k": "heartbeat", "b": hb}), "version"),
        (msgpack.packb({"v": wire.PROTOCOL_VERSION, "k": "heartbeat", "b": dict(hb, term="0")}), "schema"),
        (msgpack.packb({"v": wire.PROTOCOL_VERSION, "k": "nope", "b": {}}), "unknown_kind"),
        (msgpack.packb([1, 2, 3]), "not_a_frame"),
    ]
    for data, reason in cases:
        status, reply = await _raw_post(n1, me, data)
        assert status in (400, 413)
        assert (reply.kind, reply.body["reason"]) == ("error", reason)
    assert dict(n1.dropped) == {r: 1 for _, r in cases}
    # The member that sent the other protocol version is named (status: "upgrade it")...
    assert n1.counters.other_versions == {me.node_id: 99}
    # A heartbeat claiming to be another node than its certificate is refused.
    status, reply = await _raw_post(n1, me, wire.encode("heartbeat", dict(hb, node_id="f" * 32)))
    assert (status, reply.body["reason"]) == (403, "identity_mismatch")
    # A heartbeat whose report has the wrong shape is dropped at the edge, counted by reason.
    status, reply = await _raw_post(n1, me, wire.encode("heartbeat", dict(hb, report={"gpus": "GPU-0"})))
    assert (status, reply.body["reason"]) == (400, "schema")
    assert n1.dropped["schema"] == 2
    assert n1.table.get(me.node_id) is None
    # ...and a proper one still works.
    status, reply = await _raw_post(n1, me, wire.encode("heartbeat", hb))
    assert (status, reply.kind, reply.body["node_id"]) == (200, "heartbeat", n1.creds.node_id)
    assert n1.table.get(me.node_id) is not None
    assert n1.counters.other_versions == {}  # ...until it speaks this node's version


async def test_another_pool_is_refused_both_ways(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1")
    alien = await make_net("alien")
    _mesh(n1, alien)
    await n1.heartbeat_once()
    await alien.heartbeat_once()
    # Each side's client refuses the other's server certificate at the handshake...
    assert n1.send_failures["untrusted_certificate"] >= 1
    assert alien.send_failures["untrusted_certificate"] >= 1
    # ...and each server counts the aborted handshake (the client's "unknown CA" alert).
    for net in (n1, alien):
        assert await net.wait_until(lambda net=net: net.auth_refusals["untrusted_certificate"] >= 2, 5.0)
    assert n1.live_peers() == []
    assert alien.live_peers() == []


async def test_foreign_certificate_is_refused_on_the_first_read(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    # An attacker who has the lab's public CA certificate (so it trusts our server) but a
    # certificate of its own CA: under TLS 1.3 its handshake "succeeds", the first read fails.
    n1 = await make_net("n1")
    alien = pool_creds["alien"]
    ctx = tls.client_context(alien)
    ctx.load_verify_locations(cadata=pool_creds["n1"].ca_pem.decode())
    host, port = n1.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
    try:
        writer.write(b"POST /v1/msg HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        try:
            data = await asyncio.wait_for(reader.read(100), 5.0)
        except (ConnectionError, OSError):
            data = b""
        assert data == b""  # refused: nothing but the TLS alert / EOF comes back
    finally:
        writer.close()
    assert await n1.wait_until(lambda: n1.auth_refusals["untrusted_certificate"] >= 1, 5.0)
    # Through the real client the same refusal surfaces as PeerError("refused").
    a = PeerNetwork(
        fast_config(Path(str(n1.config.node.data_dir)).parent, alien),
        alien,
        ElectionState(alien.node_id, 0, started_at=0.0, grace_s=1.0),
    )
    a.max_frame_bytes = 4096
    await a.start()
    try:
        assert a.transport.session is not None  # swap in a client that trusts n1's server
        await a.transport.session.close()
        a.transport.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        with pytest.raises(PeerError) as info:
            await a.transport.post(n1.address, wire.encode("ok", {}), 5.0, 4096)
        assert info.value.reason == "refused"
    finally:
        await a.stop()


async def test_report_provider_rides_on_heartbeats(make_net: Any) -> None:
    n1 = await make_net("n1", report_provider=lambda: {"gpus": [{"uuid": "SIM-n1-0", "type": "A10"}]})
    n2 = await make_net("n2")
    _mesh(n1, n2)
    assert await n2.wait_until(lambda: n2.table.get(n1.creds.node_id) is not None, 5.0)
    rec = n2.table.get(n1.creds.node_id)
    assert rec is not None
    assert rec.report.gpus == ({"uuid": "SIM-n1-0", "type": "A10"},)
    assert n2.reports()[n1.creds.node_id]["gpus"] == [{"uuid": "SIM-n1-0", "type": "A10"}]
    assert set(n2.reports()) == {n1.creds.node_id, n2.creds.node_id}
    status = n2.peers_status()
    assert [(p["name"], p["alive"]) for p in status] == [("n2", True), ("n1", True)]
    await n1.stop()
    assert await n2.wait_until(lambda: not n2.peers_status()[1]["alive"], 5.0)
    assert set(n2.reports()) == {n2.creds.node_id}


async def test_reports_of_the_wrong_shape_never_travel_or_count(make_net: Any) -> None:
    # A provider whose report has the wrong shape: the heartbeat goes without it (logged).
    n1 = await make_net("n1", report_provider=lambda: {"gpus": "GPU-0"})
    assert n1.reports()[n1.creds.node_id] == {"python": n1.heartbeats.build().report.python}
    # A peer that answers with a malformed report is dropped at the edge, not heard.
    n2 = await make_net("n2")

    def bad_answer(body: dict[str, Any]) -> dict[str, Any]:
        return {**n2.heartbeats.build().to_body(), "report": {"jobs": [1]}}

    n2.dispatch.bind(bad_answer, n2.heartbeats.changed)
    n1.add_address(n2.address, source="static")
    await n1.heartbeat_once()
    assert n1.dropped["schema"] == 1
    assert n1.live_peers() == []
    assert n1.book.addresses()[n2.address] is None  # not counted as an answer: backed off


async def test_discovery_hints_of_another_pool_or_of_ourselves_are_not_dialled(make_net: Any) -> None:
    n1 = await make_net("n1")
    n1.add_address("10.9.9.9:7470", {"id": "a" * 32, "pool": "b" * 64})
    assert n1.auth_refusals["foreign_pool_hint"] == 1
    n1.add_address("10.9.9.8:7470", {"id": n1.creds.node_id, "pool": n1.creds.pool_id})
    assert n1.book.due(0.0) == []


def test_peer_table_liveness_and_revival() -> None:
    t = PeerTable(timeout_s=2.0)
    hb = Heartbeat(node_id="p", name="p", address="h:1", priority=0, term=1, coordinator="p")
    rec, revived = t.heard(hb, 10.0)
    assert revived
    assert rec.first_seen == 10.0
    assert t.live(11.9) == ["p"]
    assert t.live(12.0) == []
    rec, revived = t.heard(hb, 11.0)
    assert not revived
    assert rec.first_seen == 10.0
    rec, revived = t.heard(hb, 20.0)  # came back after a silence: a new life
    assert revived
    assert rec.first_seen == 20.0


def test_membership_gossip_never_moves_a_node_heard_at_another_address() -> None:
    """Two daemons with one identity: the membership protocol carries each one's address in turn.
    While heartbeats come from the first, its address stands, so the second's heartbeats stay
    refused and orders keep going to the first (a fresh-clone CI run placed a second attempt on
    such a twin while the first still ran)."""
    t = PeerTable(timeout_s=2.0)
    real = Heartbeat(node_id="p", name="p", address="h:1", priority=0, term=1, coordinator="c")
    twin = Heartbeat(node_id="p", name="p", address="h:2", priority=0, term=1, coordinator="c")
    t.heard(real, 10.0)
    rec, _ = t.member("p", name="p", address="h:2", priority=0, term=1, coordinator="c", live=True, now=10.5)
    assert rec.address == "h:1"
    with pytest.raises(AuthError, match="live at h:1"):
        t.heard(twin, 11.0)
    rec, revived = t.heard(real, 11.5)
    assert rec.address == "h:1"
    assert not revived
    # Heartbeats at h:1 stopped: the protocol's address is taken (a node restarted elsewhere).
    rec, _ = t.member("p", name="p", address="h:2", priority=0, term=2, coordinator="c", live=True, now=14.0)
    assert rec.address == "h:2"
    rec, _ = t.heard(twin, 14.5)
    assert rec.address == "h:2"


def test_address_book_backs_off_and_dials_one_address_per_node() -> None:
    b = AddressBook(base_s=1.0, max_s=8.0)
    assert b.add("a:1", "static")
    assert not b.add("a:1", "mdns")
    b.add("a:2", "mdns")
    b.add("me:1", "mdns")
    b.succeeded("me:1", "self", is_self=True)
    assert sorted(b.due(0.0)) == ["a:1", "a:2"]
    b.succeeded("a:1", "node-a")
    b.succeeded("a:2", "node-a")
    assert len(b.due(0.0)) == 1  # same node: one address
    b.add("c:1", "mdns")  # never answers
    for _ in range(6):
        b.failed("c:1", 100.0)
    assert "c:1" not in b.due(107.9)
    assert "c:1" in b.due(108.0)  # 1, 2, 4, 8, 8, 8: back-off is capped at max_s
    for i in range(2000):
        b.add(f"x:{i}", "mdns")
    assert len(b.addresses()) <= 1024


def test_rate_limited_log_warns_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("frenzyd.test"), interval_s=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="frenzyd.test"):
        for _ in range(5):
            rl.warning("k", "bad frame %s", "x")
        rl.warning("other", "another reason")
        now[0] = 61.0
        rl.warning("k", "bad frame %s", "y")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["bad frame x", "another reason", "bad frame y (and 4 more since the last report)"]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 4


async def test_tampered_signed_order_and_fallback_handler(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    got: list[tuple[str, str, bool]] = []

    async def fallback(peer: str, msg: wire.Message, signed: bool) -> dict[str, Any]:
        got.append((peer, msg.kind, signed))
        return {"detail": "fallback"}

    n1 = await make_net("n1", on_message=fallback)
    me = pool_creds["n2"]
    env = auth.seal_order(me, "test.echo", {"text": "x", "term": 0})
    env["sig"] = bytes(64)
    status, reply = await _raw_post(n1, me, wire.encode(wire.SIGNED_KIND, env))
    assert (status, reply.body["reason"]) == (403, "bad_signature")
    assert n1.auth_refusals["bad_signature"] == 1
    # Signed by n3 but sent by n2: a relay, refused.
    env = auth.seal_order(pool_creds["n3"], "test.echo", {"text": "x", "term": 0})
    status, reply = await _raw_post(n1, me, wire.encode(wire.SIGNED_KIND, env))
    assert (status, reply.body["reason"]) == (403, "signer_mismatch")
    # A kind nobody registered goes to the fallback, with the signed flag.
    status, reply = await _raw_post(n1, me, wire.encode("test.echo", {"text": "plain"}))
    assert (status, reply.body) == (200, {"detail": "fallback"})
    assert got == [(me.node_id, "test.echo", False)]


async def test_messages_to_this_node_are_delivered_locally_with_the_same_checks(make_net: Any) -> None:
    calls: list[str] = []

    async def launch(peer: str, body: dict[str, Any]) -> Reply:
        calls.append(peer)
        return Reply("ok", {"detail": "local"})

    n1 = await make_net("n1")
    n1.on("test.launch", launch, signed=True)
    assert await n1.wait_until(lambda: n1.election.role is Role.COORDINATOR, 5.0)
    me, term = n1.creds.node_id, n1.election.term
    reply = await n1.send_signed(me, "test.launch", {"job": "j", "term": term})
    assert reply.body == {"detail": "local"}
    assert calls == [me]
    with pytest.raises(PeerError) as info:
        await n1.send(me, "test.launch", {"job": "j", "term": term})
    assert info.value.reason == "unsigned_order"
    with pytest.raises(PeerError) as info:
        await n1.send_signed(me, "test.launch", {"job": "j", "term": term - 1})
    assert info.value.reason == "stale_term"


async def test_an_unresponsive_address_does_not_hold_up_the_round(make_net: Any) -> None:
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accept, then never answer the TLS handshake

    sink = await asyncio.start_server(hold, "127.0.0.1", 0)
    sink_addr = f"127.0.0.1:{sink.sockets[0].getsockname()[1]}"
    try:
        n1 = await make_net("n1")
        n2 = await make_net("n2")
        n1.add_address(sink_addr, source="static")
        n1.add_address(n2.address, source="static")
        await n1.heartbeat_once(wait_s=1.0)
        assert n2.creds.node_id in n1.live_peers()
        stuck = n1.transport.in_flight(sink_addr)  # still waiting for the sink (request timeout 2 s)
        assert stuck is not None
        assert not stuck.done()
        await n1.heartbeat_once(wait_s=0.0)  # the next round does not stack a second beat on it
        assert n1.transport.in_flight(sink_addr) is stuck
    finally:
        for w in held:
            w.close()
        sink.close()


async def test_a_taken_port_is_a_config_error(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    from frenzyd.errors import ConfigError

    creds = pool_creds["n1"]
    taken = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = taken.sockets[0].getsockname()[1]
    try:
        cfg = fast_config(tmp_path, creds, listen=f"127.0.0.1:{port}")
        net = PeerNetwork(cfg, creds, ElectionState(creds.node_id, 0, started_at=0.0, grace_s=1.0))
        with pytest.raises(ConfigError, match=r"\[network\] listen"):
            await net.start()
        await net.stop()
    finally:
        taken.close()
