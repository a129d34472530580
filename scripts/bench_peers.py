#!/usr/bin/env python3
"""Benchmark of the peer mechanisms: wire codec, order signing, and mutual-TLS request cost on loopback.

Measured side by side in one run:
  * wire: encode + decode of a heartbeat frame carrying an 8-GPU report;
  * orders: seal (encode + Ed25519 sign) and open (certificate check + verify + decode);
  * transport: one peer request/reply through ``PeerNetwork.send`` (aiohttp, mutual TLS 1.3,
    Ed25519, keep-alive) against the same aiohttp server and client without TLS (plain HTTP,
    no authentication) — the ratio is what the pool's authentication costs per message;
  * connection set-up: a fresh connection per request (TLS handshake) vs plain TCP.
Both ends run in this one process and event loop, so latencies include both sides' work.

    python scripts/bench_peers.py [--tiny] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402
from benchmeta import provenance, write_results  # noqa: E402

from frenzyd.config import config_from_dict  # noqa: E402
from frenzyd.net import auth, tls, wire  # noqa: E402
from frenzyd.net.election import ElectionState  # noqa: E402
from frenzyd.net.network import CONNECTIONS_PER_PEER, CONTENT_TYPE, MSG_PATH, PeerNetwork  # noqa: E402

wire.register_kind("bench.echo", wire.Schema(required={"seq": int}, optional={"pad": bytes}))


def _us(total_s: float, n: int) -> float:
    return total_s / n * 1e6


def bench_wire(n: int) -> dict[str, float]:
    body = {
        "node_id": "ab" * 16,
        "name": "ws-01",
        "address": "10.0.0.1:7470",
        "priority": 0,
        "term": 3,
        "coordinator": "cd" * 16,
        "report": {
            "python": "3.11.7",
            "torch": "2.13.0",
            "gpus": [
                {
                    "uuid": f"GPU-{i:032x}",
                    "type": "A100-80GB",
                    "memory_bytes": 80 << 30,
                    "free_bytes": 79 << 30,
                    "simulated": False,
                    "leased_to": None,
                }
                for i in range(8)
            ],
        },
    }
    frame = wire.encode("heartbeat", body)
    t0 = time.perf_counter()
    for _ in range(n):
        wire.encode("heartbeat", body)
    t1 = time.perf_counter()
    for _ in range(n):
        wire.decode(frame)
    t2 = time.perf_counter()
    return {"frame_bytes": len(frame), "encode_us": _us(t1 - t0, n), "decode_us": _us(t2 - t1, n)}


def bench_orders(creds: auth.Credentials, n: int) -> dict[str, float]:
    body = {"job_id": "j" * 16, "term": 7, "seq": 1}
    wire.register_kind("bench.order", wire.Schema(required={"job_id": str, "term": int, "seq": int}))
    t0 = time.perf_counter()
    envs = [auth.seal_order(creds, "bench.order", body) for _ in range(n)]
    t1 = time.perf_counter()
    msgs = [wire.Message(1, wire.SIGNED_KIND, e) for e in envs]
    for m in msgs:
        auth.open_order(creds.ca_pem, m, sender_id=creds.node_id)
    t2 = time.perf_counter()
    return {"seal_us": _us(t1 - t0, n), "open_us": _us(t2 - t1, n)}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _latencies(call: Any, n: int, concurrency: int) -> dict[str, float]:
    lat: list[float] = []
    seq = iter(range(n))

    async def worker() -> None:
        for i in seq:
            t = time.perf_counter()
            await call(i)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {
        "p50_ms": _pct(lat, 0.5) * 1e3,
        "p99_ms": _pct(lat, 0.99) * 1e3,
        "mean_ms": statistics.fmean(lat) * 1e3,
        "req_per_s": n / wall,
    }


async def bench_transport(tmp: Path, a: auth.Credentials, b: auth.Credentials, n: int) -> dict[str, Any]:
    def cfg(c: auth.Credentials) -> Any:
        return config_from_dict(
            {
                "node": {"name": c.node_name, "data_dir": str(tmp / c.node_name)},
                "network": {"listen": "127.0.0.1:0", "mdns": False},
                "pool": {"credentials": str(c.node_cert.parent)},
                "timing": {"heartbeat_s": 60.0, "peer_timeout_s": 600.0},
            },
            {},
            base=tmp,
        )

    async def echo(peer: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"detail": str(body["seq"])}

    na = PeerNetwork(cfg(a), a, ElectionState(a.node_id, 0, started_at=0.0, grace_s=1e9))
    nb = PeerNetwork(cfg(b), b, ElectionState(b.node_id, 0, started_at=0.0, grace_s=1e9))
    nb.on("bench.echo", echo)
    await na.start()
    await nb.start()
    # Plain-HTTP baseline: the same aiohttp stack, the same codec and handler work, no TLS.
    app = web.Application()

    async def plain_handler(request: web.Request) -> web.Response:
        msg = wire.decode(await request.read())
        reply = await echo("x", msg.body)
        return web.Response(body=wire.encode("ok", reply), content_type=CONTENT_TYPE)

    app.router.add_post(MSG_PATH, plain_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    plain_url = f"http://127.0.0.1:{site.port}{MSG_PATH}"
    out: dict[str, Any] = {}
    try:
        na.add_address(nb.address, source="static")
        await na.heartbeat_once()  # learn b's identity and address
        assert b.node_id in na.live_peers(), "the two nodes did not mesh"

        async def mtls(i: int) -> None:
            await na.send(b.node_id, "bench.echo", {"seq": i})

        plain_conn = aiohttp.TCPConnector(limit_per_host=CONNECTIONS_PER_PEER)  # same pool as PeerNetwork
        async with aiohttp.ClientSession(connector=plain_conn) as plain:

            async def http(i: int) -> None:
                async with plain.post(plain_url, data=wire.encode("bench.echo", {"seq": i})) as r:
                    wire.decode(await r.read())

            for conc in (1, 16):
                await _latencies(mtls, min(50, n), conc)  # warm-up (connections, caches)
                await _latencies(http, min(50, n), conc)
                out[f"mtls_c{conc}"] = await _latencies(mtls, n, conc)
                out[f"plain_c{conc}"] = await _latencies(http, n, conc)

        # Fresh connection per request: what a TLS 1.3 handshake with Ed25519 costs.
        n_conn = max(20, n // 10)
        host, port = nb.address.rsplit(":", 1)
        ctx = tls.client_context(a)

        async def tls_connect(i: int) -> None:
            _, w = await asyncio.open_connection(host, int(port), ssl=ctx)
            w.close()
            await w.wait_closed()

        async def tcp_connect(i: int) -> None:
            _, w = await asyncio.open_connection("127.0.0.1", site.port)
            w.close()
            await w.wait_closed()

        out["connect_tls"] = await _latencies(tls_connect, n_conn, 1)
        out["connect_tcp"] = await _latencies(tcp_connect, n_conn, 1)
    finally:
        await runner.cleanup()
        await na.stop()
        await nb.stop()
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a few hundred operations (CI)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    prov = provenance()
    n_codec, n_orders, n_req = (2000, 200, 200) if args.tiny else (50000, 3000, 3000)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        auth.create_pool(tmp / "pool")
        a = auth.load_credentials(auth.add_node(tmp / "pool", "bench-a").out_dir)
        b = auth.load_credentials(auth.add_node(tmp / "pool", "bench-b").out_dir)
        results: dict[str, Any] = {
            "wire": bench_wire(n_codec),
            "orders": bench_orders(a, n_orders),
            "transport": asyncio.run(bench_transport(tmp, a, b, n_req)),
        }
    result = {
        "sizes": {"codec_ops": n_codec, "order_ops": n_orders, "requests": n_req},
        "results": results,
    }
    w, o, t = results["wire"], results["orders"], results["transport"]
    print(
        f"wire   heartbeat frame {w['frame_bytes']} B: encode {w['encode_us']:.1f} us, "
        f"decode {w['decode_us']:.1f} us"
    )
    print(f"orders seal {o['seal_us']:.1f} us, open (cert check + verify + decode) {o['open_us']:.1f} us")
    print(f"{'transport':<22}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>10}")
    for key in ("mtls_c1", "plain_c1", "mtls_c16", "plain_c16", "connect_tls", "connect_tcp"):
        r = t[key]
        print(f"{key:<22}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}{r['req_per_s']:>10.0f}")
    for c in (1, 16):
        ratio = t[f"mtls_c{c}"]["req_per_s"] / t[f"plain_c{c}"]["req_per_s"]
        print(f"mTLS/plain throughput at concurrency {c}: {ratio:.2f}")
    if args.out:
        write_results(args.out, result, prov)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
