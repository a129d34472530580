"""Web: a real aiohttp server on 127.0.0.1 serving the status page, the JSON and /metrics."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from frenzyd.api.metrics import MetricsRegistry
from frenzyd.api.web import WebServer, build_web_app

GIB = 1024**3

STATUS: dict[str, Any] = {
    "node": {"id": "aaaa1111bbbb2222", "name": "ws-01", "role": "coordinator", "term": 3},
    "coordinator": {"id": "aaaa1111bbbb2222", "name": "ws-01", "term": 3},
    "peers": [
        {"id": "aaaa1111bbbb2222", "name": "ws-01", "address": "10.77.1.2:7470", "alive": True,
         "gpus": [{"uuid": "SIM-ws-01-0", "type": "A100-80GB", "memory_bytes": 80 * GIB,
                   "free_bytes": 80 * GIB, "simulated": True, "leased_to": "job-1"},
                  {"uuid": "SIM-ws-01-1", "type": "A100-80GB", "memory_bytes": 80 * GIB,
                   "free_bytes": 80 * GIB, "simulated": True, "leased_to": None}]},
        {"id": "cccc3333", "name": "ws-02<script>", "address": "10.77.1.3:7470", "alive": True,
         "gpus": [{"uuid": "GPU-x", "type": "RTX-3090", "memory_bytes": 24 * GIB,
                   "free_bytes": 20 * GIB, "simulated": False, "leased_to": None, "offered": False}]},
        {"id": "dddd4444", "name": "ws-03", "address": "10.77.1.4:7470", "alive": False,
         "gpus": [{"uuid": "SIM-ws-03-0", "type": "T4", "memory_bytes": 16 * GIB,
                   "free_bytes": 16 * GIB, "simulated": True, "leased_to": None}]},
    ],
    "jobs": [
        {"id": "job-0", "state": "succeeded", "submitter": "aaaa1111bbbb2222", "plan": None, "ranks": [],
         "created_at": 1000.0, "started_at": 1010.0, "updated_at": 1100.0},
        {"id": "job-1", "state": "running", "submitter": "cccc3333", "name": "my-run", "attempt": 2,
         "phase": "running", "plan": {"gpu_type": "A100-80GB", "gpus": 1, "dp": 1,
                                      "step_time_s": 0.001560604356923077}, "ranks": [
             {"rank": 0, "peer": "aaaa1111bbbb2222", "gpu": "SIM-ws-01-0"}]},
        {"id": "job-2", "state": "queued", "submitter": "aaaa1111bbbb2222", "plan": None, "ranks": [],
         "phase": "waiting", "queue_position": 1, "reason": "no GPU type in this pool fits it now"},
    ],
}


class Box:
    def __init__(self) -> None:
        self.status: dict[str, Any] = copy.deepcopy(STATUS)
        self.fail = False

    def __call__(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("provider broke")
        return self.status


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Box, MetricsRegistry]]:
    box = Box()
    metrics = MetricsRegistry()
    srv = WebServer(build_web_app(box, metrics), "127.0.0.1", 0)
    port = await srv.start()
    try:
        yield f"http://127.0.0.1:{port}", box, metrics
    finally:
        await srv.stop()


async def get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, s.get(url) as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


async def test_status_json_is_the_providers(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, box, _ = server
    code, ctype, _ = await get(base + "/api/v1/status")
    assert code == 200
    assert ctype.startswith("application/json")
    async with aiohttp.ClientSession() as s, s.get(base + "/api/v1/status") as r:
        assert await r.json() == box.status
    box.status["node"]["term"] = 4
    async with aiohttp.ClientSession() as s, s.get(base + "/api/v1/status") as r:
        assert (await r.json())["node"]["term"] == 4  # live, not cached


async def test_html_page_shows_peers_gpus_jobs_and_escapes(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, _, _ = server
    code, ctype, page = await get(base + "/")
    assert code == 200
    assert ctype.startswith("text/html")
    assert "Coordinator: <b>ws-01</b>" in page
    assert "term 3" in page
    assert "<script>" not in page
    assert "ws-02&lt;script&gt;" in page
    assert "A100-80GB 80.0/80.0 GiB free, job <code>job-1</code>" in page
    assert "(simulated)" in page
    assert "2 alive of 3" in page
    assert "<code>job-2</code></td><td>queued" in page
    assert "#1 in the queue; no GPU type in this pool fits it now" in page
    assert "<b>my-run</b>" in page
    assert "0@ws-01:SIM-ws-01-0" in page
    assert "1 × A100-80GB: dp 1, tp 1, pp 1, ZeRO-0" in page
    assert "step_time_s=0.00156<" in page  # not 0.001560604356923077
    # running first, then queued, then finished
    assert page.index("job-1</code>") < page.index("job-2</code>") < page.index("job-0</code>")
    assert "1m 30s" in page  # job-0 ran from 1010 to 1100


async def test_page_forbids_everything_but_its_own_style(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, _, _ = server
    async with aiohttp.ClientSession() as s, s.get(base + "/") as resp:
        csp = resp.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp
    assert "script-src" not in csp  # no script may run


async def test_page_without_coordinator(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, box, _ = server
    box.status = {"node": {"id": "x", "name": "lonely", "role": "peer", "term": 0}, "coordinator": None,
                  "peers": [], "jobs": []}
    _, _, page = await get(base + "/")
    assert "Coordinator: <b>none yet</b>" in page


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_parse_and_follow_status(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, box, metrics = server
    metrics.drop("oversized")
    metrics.drop("oversized")
    metrics.refuse("unknown_ca")
    counts = {"malformed": 5}
    metrics.add_count_source("frenzy_wire_rejects", "Frames rejected at decode", "reason", lambda: counts)
    code, ctype, text = await get(base + "/metrics")
    assert code == 200
    assert ctype.startswith("text/plain")
    m = parse(text)
    assert m[("frenzy_election_term", ())] == 3
    assert m[("frenzy_is_coordinator", ())] == 1
    assert m[("frenzy_peers_alive", ())] == 2
    assert m[("frenzy_peers_known", ())] == 3
    assert m[("frenzy_gpus", (("simulated", "true"), ("state", "leased"), ("type", "A100-80GB")))] == 1
    assert m[("frenzy_gpus", (("simulated", "true"), ("state", "offered"), ("type", "A100-80GB")))] == 1
    assert m[("frenzy_gpus", (("simulated", "false"), ("state", "withheld"), ("type", "RTX-3090")))] == 1
    assert not any(k[0] == "frenzy_gpus" and ("type", "T4") in k[1] for k in m)  # dead peer not counted
    assert m[("frenzy_gpu_free_bytes", (("type", "RTX-3090"),))] == 20 * GIB
    assert m[("frenzy_jobs", (("state", "running"),))] == 1
    assert m[("frenzy_jobs", (("state", "cancelled"),))] == 0
    assert m[("frenzy_peer_messages_dropped_total", (("reason", "oversized"),))] == 2
    assert m[("frenzy_auth_refusals_total", (("reason", "unknown_ca"),))] == 1
    assert m[("frenzy_wire_rejects_total", (("reason", "malformed"),))] == 5
    counts["malformed"] = 7
    next(j for j in box.status["jobs"] if j["id"] == "job-1")["state"] = "succeeded"
    m = parse((await get(base + "/metrics"))[2])
    assert m[("frenzy_wire_rejects_total", (("reason", "malformed"),))] == 7
    assert m[("frenzy_jobs", (("state", "succeeded"),))] == 2
    assert m[("frenzy_web_requests_total", (("path", "/metrics"),))] == 2


async def test_broken_provider_gives_503_and_metrics_still_serve(
    server: tuple[str, Box, MetricsRegistry],
) -> None:
    base, box, _ = server
    box.fail = True
    code, _, text = await get(base + "/api/v1/status")
    assert code == 503
    assert "provider broke" in text
    code, _, text = await get(base + "/metrics")
    assert code == 200
    assert "frenzy_web_requests_total" in text


async def test_read_only(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, _, _ = server
    async with aiohttp.ClientSession() as s:
        for path in ("/", "/api/v1/status", "/metrics"):
            async with s.post(base + path, data=b"x") as r:
                assert r.status == 405
        async with s.get(base + "/nope") as r:
            assert r.status == 404
