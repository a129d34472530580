"""Bounds on what a member or another host can make a node do (issue 16, "bounds everywhere"):
per-kind frame caps checked before the body is read, msgpack expansion bounded, terms bounded,
malformed certificates and reports refused at the edge with a reason, job ids checked at decode,
the web port's idle timeout and connection cap, the peer port's handshake deadline and caps on
unauthenticated connections.  Real aiohttp servers with mutual TLS on loopback."""

from __future__ import annotations

import asyncio
import io
import json
import random
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from frenzyd.api.metrics import MetricsRegistry
from frenzyd.api.web import WebServer, build_web_app, render_page
from frenzyd.config import Config
from frenzyd.daemon import STATE_FILE, Daemon
from frenzyd.errors import ElectionError
from frenzyd.jobs import context, messages
from frenzyd.jobs.messages import JobCancel, JobResults, PayloadChunk
from frenzyd.net import auth, tls, wire
from frenzyd.net.election import MAX_TERM, ElectionState, PeerView
from frenzyd.net.network import CONTENT_TYPE, MSG_PATH, PeerNetwork

from .conftest import fast_config

V = wire.PROTOCOL_VERSION


def _frame(kind: str, body_bytes: bytes) -> bytes:
    """A frame whose header names ``kind`` and whose body is ``body_bytes`` as they are."""
    return b"\x83\xa1v" + msgpack.packb(V) + b"\xa1k" + msgpack.packb(kind) + b"\xa1b" + body_bytes


# --- 1. per-kind frame caps ---------------------------------------------------------------------


def test_each_kind_has_a_cap_that_fits_its_largest_legitimate_body() -> None:
    assert messages.CHUNK_BYTES == context.CHUNK  # the cap below is sized from the chunk the roles send
    full = JobResults("j-1", 1, 0, 10 * context.CHUNK, b"\x00" * context.CHUNK)
    assert wire.decode(wire.encode_message(full)).body["data"] == full.data
    reply = wire.encode("ok", PayloadChunk(b"\x01" * context.CHUNK, 5 * context.CHUNK).to_body())
    assert len(wire.decode(reply).body["data"]) == context.CHUNK
    for kind in wire.KINDS:
        assert wire.kind_cap(kind) <= wire.DEFAULT_MAX
    for small in ("job.cancel", "job.attempt", "lease.release", "job.stop", "payload.fetch", "job.finished",
                  "error"):
        assert wire.kind_cap(small) <= 64 * 1024, small
    assert wire.kind_cap("heartbeat") == 1 << 20
    assert wire.kind_cap("job.results") < 2 * context.CHUNK


def test_an_oversized_frame_is_refused_by_its_kind_before_its_body_is_read() -> None:
    # The body is not msgpack at all: a decoder that read it would say "malformed".
    data = _frame("job.cancel", b"\xc1" * (100 * 1024))
    with pytest.raises(wire.FrameRejected) as info:
        wire.decode(data)
    assert info.value.reason == "oversized"
    assert "job.cancel" in info.value.detail
    # A configured override moves the cap.
    ok = wire.encode("job.cancel", {"job_id": "j-1", "pad": "x" * 3000})
    assert wire.decode(ok).kind == "job.cancel"
    with pytest.raises(wire.FrameRejected) as info:
        wire.decode(ok, caps={"job.cancel": 1024})
    assert info.value.reason == "oversized"


def test_a_small_frame_cannot_expand_into_a_large_allocation() -> None:
    # 900 KiB of empty maps fits job.results' cap; decoded whole it would be ~900k dicts (>60 MiB).
    n = 900 * 1024
    body = b"\x82\xa6job_id\xa3j-1\xa1x\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    data = _frame("job.results", body)
    assert len(data) < wire.kind_cap("job.results")
    tracemalloc.start()
    try:
        with pytest.raises(wire.FrameRejected) as info:
            wire.decode(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.reason == "malformed"
    assert "too many maps" in info.value.detail
    assert peak < 8 * len(data), f"decoding a {len(data)}-byte frame allocated {peak} bytes"


@pytest.fixture
async def make_net(tmp_path: Path, pool_creds: dict[str, auth.Credentials]) -> AsyncIterator[Any]:
    started: list[PeerNetwork] = []

    async def make(name: str, **network: Any) -> PeerNetwork:
        creds = pool_creds[name]
        cfg = fast_config(tmp_path, creds, **network)
        el = ElectionState(creds.node_id, 0, started_at=time.monotonic(), grace_s=cfg.timing.election_grace_s)
        net = PeerNetwork(cfg, creds, el)
        await net.start()
        started.append(net)
        return net

    yield make
    for net in started:
        await net.stop()


async def _post(net: PeerNetwork, creds: auth.Credentials, data: bytes,
                local_addr: tuple[str, int] | None = None) -> tuple[int, wire.Message]:
    connector = aiohttp.TCPConnector(ssl=tls.client_context(creds), local_addr=local_addr)
    async with (
        aiohttp.ClientSession(connector=connector) as s,
        s.post(f"https://{net.address}{MSG_PATH}", data=io.BytesIO(data),
               headers={"Content-Type": CONTENT_TYPE}) as resp,
    ):
        return resp.status, wire.decode(await resp.read())


def _hb(creds: auth.Credentials, **kw: Any) -> dict[str, Any]:
    return {"node_id": creds.node_id, "name": creds.node_name, "address": "127.0.0.1:1", "priority": 0,
            "term": 0, **kw}


async def test_a_member_cannot_send_an_oversized_heartbeat_over_tls(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1")
    n2 = pool_creds["n2"]
    body = msgpack.packb({**_hb(n2), "report": {"pad": "x" * (3 << 19)}})  # 1.5 MiB, built by hand
    assert len(body) > wire.kind_cap("heartbeat")
    status, reply = await _post(n1, n2, _frame("heartbeat", body))
    assert (status, reply.kind, reply.body["reason"]) == (400, "error", "oversized")
    assert n1.dropped["oversized"] == 1
    assert n1.table.get(n2.node_id) is None
    status, reply = await _post(n1, n2, wire.encode("heartbeat", _hb(n2)))
    assert (status, reply.kind) == (200, "heartbeat")


async def test_configured_frame_caps_apply(make_net: Any, pool_creds: dict[str, auth.Credentials]) -> None:
    n1 = await make_net("n1", frame_caps={"heartbeat": 4096})
    n2 = pool_creds["n2"]
    status, reply = await _post(n1, n2, wire.encode("heartbeat", _hb(n2, report={"pad": "y" * 8000})))
    assert (status, reply.body["reason"]) == (400, "oversized")


# --- 2. terms ---------------------------------------------------------------------------------


def test_terms_are_bounded_and_the_first_term_heard_is_taken() -> None:
    el = ElectionState("a" * 32, 0, started_at=0.0, grace_s=0.0, max_term_jump=1000)
    with pytest.raises(ElectionError, match="term_out_of_range"):
        el.observe(PeerView("b" * 32, 0, 2**64 - 1, "b" * 32))
    el.observe(PeerView("b" * 32, 0, 5000, "b" * 32))  # a new node learns the pool's term
    with pytest.raises(ElectionError, match="term_jump"):
        el.observe(PeerView("c" * 32, 0, 6001, "c" * 32))
    el.observe(PeerView("c" * 32, 0, 6000, "c" * 32))
    with pytest.raises(ElectionError, match="term_jump"):
        el.check_order("c" * 32, 9000)
    with pytest.raises(ElectionError, match="term_out_of_range"):
        el.check_order("c" * 32, MAX_TERM + 1)
    el.tick(1.0, ["b" * 32, "c" * 32])
    assert el.term == 6000
    with pytest.raises(ValueError, match="term must be in"):
        ElectionState("a" * 32, 0, started_at=0.0, grace_s=0.0, term=2**64 - 1)


async def test_a_member_cannot_wedge_the_pool_with_a_huge_term(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1")
    n2 = await make_net("n2")
    for a, b in ((n1, n2), (n2, n1)):
        a.add_address(b.address, source="static")

    def agreed() -> bool:
        return n1.election.coordinator is not None and n1.election.coordinator == n2.election.coordinator

    assert await n1.wait_until(agreed, 10.0)
    term = n1.election.term
    n3 = pool_creds["n3"]
    for bad, reason in ((2**64 - 1, "term_out_of_range"), (term + 5000, "term_jump")):
        hb = _hb(n3, term=bad, coordinator=n3.node_id)
        status, reply = await _post(n1, n3, wire.encode("heartbeat", hb))
        assert (status, reply.body["reason"]) == (409, reason)
        assert n1.dropped[reason] == 1
    assert n1.table.get(n3.node_id) is None
    await n1.heartbeat_once()
    assert n1.election.term == term
    assert agreed()


def test_a_persisted_term_out_of_range_is_not_loaded(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    cfg = fast_config(tmp_path, pool_creds["n1"])
    d = Daemon(cfg)
    d.data_dir.mkdir(parents=True)
    for stored, loaded in ((17, 17), (2**64 - 1, 0), (-3, 0), ("7", 0), (True, 0)):
        (d.data_dir / STATE_FILE).write_text(json.dumps({"term": stored}))
        assert d._load_term() == loaded, stored


# --- 3. malformed certificates and reports ---------------------------------------------------


def _lazily_malformed_certificate(creds: auth.Credentials) -> bytes:
    """A node certificate with a few bytes changed so that it loads but a field fails when read
    (the case that raised an unmapped ValueError, an HTTP 500 with a traceback per request)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    der = x509.load_pem_x509_certificate(creds.cert_pem).public_bytes(Encoding.DER)
    rng = random.Random(16)
    for _ in range(20000):
        b = bytearray(der)
        for _ in range(rng.randint(1, 3)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            cert = x509.load_der_x509_certificate(bytes(b))
        except ValueError:
            continue
        try:
            _ = cert.issuer
        except ValueError:
            return bytes(b)
    raise AssertionError("no such certificate found")


async def test_a_malformed_certificate_in_a_signed_envelope_is_a_clear_refusal(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1")
    n2 = pool_creds["n2"]
    bad = _lazily_malformed_certificate(n2)
    inner = wire.encode("job.cancel", {"job_id": "j-1"})
    envelope = wire.encode(wire.SIGNED_KIND, {"frame": inner, "cert": bad, "sig": auth.sign(n2, inner)})
    for _ in range(2):
        status, reply = await _post(n1, n2, envelope)
        assert (status, reply.kind, reply.body["reason"]) == (403, "error", "bad_certificate")
    assert n1.auth_refusals["bad_certificate"] == 2


@pytest.mark.parametrize(
    "gpu",
    [{"free_bytes": "lots"}, {"free_bytes": -1}, {"free_bytes": 2**63}, {"free_bytes": 1.5},
     {"memory_bytes": True}, {"utilization": float("nan")}, {"uuid": 7}, {"leased_to": ["x"]}],
)
async def test_a_report_with_a_malformed_gpu_field_is_dropped_at_the_edge(
    make_net: Any, pool_creds: dict[str, auth.Credentials], gpu: dict[str, Any]
) -> None:
    n1 = await make_net("n1")
    n2 = pool_creds["n2"]
    good = {"uuid": "GPU-1", "index": 0, "type": "T4", "memory_bytes": 16 << 30, "free_bytes": 15 << 30,
            "utilization": 0.0, "simulated": True, "offered": True, "leased_to": None}
    status, reply = await _post(n1, n2, wire.encode("heartbeat", _hb(n2, report={"gpus": [{**good, **gpu}]})))
    assert (status, reply.body["reason"]) == (400, "schema")
    assert n1.table.get(n2.node_id) is None
    status, reply = await _post(n1, n2, wire.encode("heartbeat", _hb(n2, report={"gpus": [good]})))
    assert status == 200
    assert n1.peers_status()[1]["report"]["gpus"] == [good]


def test_the_status_page_renders_whatever_a_report_holds() -> None:
    for junk in ("lots", float("inf"), float("nan"), -5, None, [1], 2**80):
        st = {"node": {"name": "n1"}, "peers": [{"id": "x", "name": "n2", "alive": True,
                                                  "gpus": [{"type": "T4", "free_bytes": junk,
                                                            "memory_bytes": junk}]}], "jobs": []}
        assert "T4" in render_page(st)


# --- 4. job ids at decode -----------------------------------------------------------------------


@pytest.mark.parametrize("job_id", ["../../etc", "", "a/b", "-x", "x" * 200, "j 1"])
def test_every_job_message_checks_its_job_id_at_decode(job_id: str) -> None:
    bodies = {
        "job.cancel": {"job_id": job_id},
        "job.attempt": {"job_id": job_id, "term": 1, "after": 0},
        "lease.request": {"job_id": job_id, "attempt": 1, "gpus": ["G"], "term": 1},
        "lease.release": {"job_id": job_id, "attempt": 1, "term": 1},
        "job.stop": {"job_id": job_id, "attempt": 1, "term": 1},
        "payload.fetch": {"job_id": job_id, "attempt": 1, "offset": 0, "length": 10},
        "job.output": {"job_id": job_id, "attempt": 1, "chunks": []},
        "job.results": {"job_id": job_id, "attempt": 1, "offset": 0, "total": 0, "data": b""},
        "job.exit": {"job_id": job_id, "attempt": 1, "term": 1, "codes": [], "peer": "p"},
        "job.finished": {"job_id": job_id, "attempt": 1},
    }
    for kind, body in bodies.items():
        with pytest.raises(wire.FrameRejected) as info:
            wire.parse(wire.decode(wire.encode(kind, body)))
        assert info.value.reason == "schema", kind
        good = dict(body, job_id="ws-01-20261201-1")
        assert wire.parse(wire.decode(wire.encode(kind, good))).job_id == "ws-01-20261201-1"  # type: ignore[union-attr]
    body = dict(bodies["payload.fetch"], job_id="j", attempt=-1)
    negative = wire.decode(wire.encode("payload.fetch", body))
    with pytest.raises(wire.FrameRejected):
        wire.parse(negative)


async def test_a_bad_job_id_never_reaches_a_handler(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1")
    got: list[Any] = []

    async def on_cancel(peer: str, msg: Any) -> None:
        got.append(msg)

    n1.on(JobCancel.KIND, on_cancel)
    status, reply = await _post(n1, pool_creds["n2"], wire.encode("job.cancel", {"job_id": "../../x"}))
    assert (status, reply.body["reason"]) == (400, "schema")
    status, _ = await _post(n1, pool_creds["n2"], wire.encode("job.cancel", {"job_id": "ok-1"}))
    assert status == 200
    assert [m.job_id for m in got] == ["ok-1"]


# --- 6. the web port and the peer port ------------------------------------------------------


async def _eof_within(reader: asyncio.StreamReader, limit_s: float) -> bool:
    """True when the server closes the connection within ``limit_s`` (nothing more is read)."""
    try:
        while await asyncio.wait_for(reader.read(4096), limit_s):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True
    return True


@pytest.fixture
async def web_server() -> AsyncIterator[WebServer]:
    status: Callable[[], dict[str, Any]] = lambda: {"node": {"name": "n1"}, "peers": [], "jobs": []}  # noqa: E731
    srv = WebServer(build_web_app(status, MetricsRegistry()), "127.0.0.1", 0, idle_timeout_s=0.3,
                    max_connections=3)
    await srv.start()
    yield srv
    await srv.stop()


async def test_the_web_port_closes_a_connection_that_never_finishes_its_headers(
    web_server: WebServer,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", web_server.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # and never the rest
    await writer.drain()
    assert await _eof_within(reader, 10.0)  # idle_timeout_s is 0.3; aiohttp's default was an hour
    writer.close()


async def test_the_web_port_caps_open_connections(web_server: WebServer) -> None:
    held = [await asyncio.open_connection("127.0.0.1", web_server.port) for _ in range(3)]
    for reader, writer in held:  # each is served, then idles (kept alive)
        writer.write(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
    reader, writer = await asyncio.open_connection("127.0.0.1", web_server.port)
    assert await _eof_within(reader, 5.0)  # the fourth is closed as it is accepted
    writer.close()
    assert web_server.refused == 1
    await asyncio.sleep(0.5)  # the held ones pass idle_timeout_s and are closed: room again
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{web_server.port}/") as r:
        assert r.status == 200
    for _, w in held:
        w.close()


async def test_the_peer_port_caps_unauthenticated_connections_but_not_members(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    n1 = await make_net("n1", handshake_timeout_s=1.0, max_unauthenticated_per_ip=4, max_unauthenticated=8)
    site = n1.transport.site
    assert site is not None
    port = n1.port
    assert port is not None
    # A host that opens connections and never says a word (no TLS ClientHello).
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
    closed = await asyncio.gather(*(_eof_within(r, 0.3) for r, _ in silent))
    assert sum(closed) == 26  # all but the per-address cap were closed at once
    assert site.unauthenticated == 4
    assert n1.auth_refusals["unauth_per_ip"] == 26
    # A member, from another address, is served while they hang.
    n2 = pool_creds["n2"]
    status, reply = await _post(n1, n2, wire.encode("heartbeat", _hb(n2)), local_addr=("127.0.0.3", 0))
    assert (status, reply.kind) == (200, "heartbeat")
    assert site.unauthenticated == 4  # the member's connection is not counted once it is through
    # The silent ones are closed at the handshake deadline.
    rest = [r for (r, _), c in zip(silent, closed, strict=True) if not c]
    assert all(await asyncio.gather(*(_eof_within(r, 10.0) for r in rest)))
    assert await n1.wait_until(lambda: site.unauthenticated == 0, 5.0)
    assert n1.auth_refusals["handshake_timeout"] == 4
    for _, w in silent:
        w.close()


async def test_the_peer_port_caps_unauthenticated_connections_in_total(make_net: Any) -> None:
    n1 = await make_net("n1", handshake_timeout_s=30.0, max_unauthenticated_per_ip=2, max_unauthenticated=5)
    port = n1.port
    assert port is not None
    # 8 connections from 4 addresses: only 5 fit
    conns = [await _connect_from(f"127.0.0.{10 + i}", port) for i in range(4) for _ in range(2)]
    closed = await asyncio.gather(*(_eof_within(r, 0.3) for r, _ in conns))
    assert sum(closed) == 3
    assert n1.auth_refusals["unauth_total"] == 3
    for _, w in conns:
        w.close()


def test_limits_are_config_keys_with_defaults(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    cfg: Config = fast_config(tmp_path, pool_creds["n1"])
    assert cfg.network.handshake_timeout_s == 5.0
    assert (cfg.network.max_unauthenticated, cfg.network.max_unauthenticated_per_ip) == (256, 16)
    assert (cfg.web.idle_timeout_s, cfg.web.max_connections) == (15.0, 64)
    assert cfg.election.max_term_jump == 1000
    assert cfg.launcher.env_allow == ()
    from frenzyd.config import CONFIG_REFERENCE

    for key in ("network.handshake_timeout_s", "network.max_unauthenticated",
                "network.max_unauthenticated_per_ip", "network.frame_caps", "network.mdns_max_entries",
                "network.mdns_entry_ttl_s", "web.idle_timeout_s",
                "web.max_connections", "election.max_term_jump", "launcher.env_allow"):
        assert f"`{key}`" in CONFIG_REFERENCE


async def test_strangers_holding_every_slot_do_not_lock_a_member_out(
    make_net: Any, pool_creds: dict[str, auth.Credentials]
) -> None:
    """bench_robustness's flood: strangers held all of max_unauthenticated, so a member that had to
    open a new connection was turned away at accept. A member's address is exempt from the total."""
    n1 = await make_net("n1", handshake_timeout_s=30.0, max_unauthenticated_per_ip=2, max_unauthenticated=4)
    port = n1.port
    assert port is not None
    n2 = pool_creds["n2"]
    hb = wire.encode("heartbeat", _hb(n2, address="127.0.0.3:7470"))
    assert (await _post(n1, n2, hb, local_addr=("127.0.0.3", 0)))[0] == 200  # n2 is a member now
    # strangers from 3 addresses fill the 4 slots (the 5th and 6th are refused)
    conns = [await _connect_from(f"127.0.0.{20 + i}", port) for i in range(3) for _ in range(2)]
    closed = await asyncio.gather(*(_eof_within(r, 0.3) for r, _ in conns))
    assert sum(closed) == 2
    assert n1.transport.site is not None
    assert n1.transport.site.unauthenticated == 4
    # A new connection from the member's address is let through to its handshake and served.
    status, reply = await _post(n1, n2, hb, local_addr=("127.0.0.3", 0))
    assert (status, reply.kind) == (200, "heartbeat")
    # A stranger from a new address is still refused by the total.
    refused = n1.auth_refusals["unauth_total"]
    r, w = await _connect_from("127.0.0.30", port)
    assert await _eof_within(r, 1.0)
    assert n1.auth_refusals["unauth_total"] == refused + 1
    w.close()
    for _, w in conns:
        w.close()


async def _connect_from(ip: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A plain TCP connection to the peer port from the loopback address ``ip``."""
    sock = socket.socket()
    sock.bind((ip, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)
