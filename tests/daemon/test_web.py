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
         "phase": "running", "plan": {"gpu_type": "A100-80GB", "gpus": 1, "dp": 1, "bytes_per_gpu": 20 * GIB,
                                      "step_time_s": 0.001560604356923077}, "ranks": [
             {"rank": 0, "peer": "aaaa1111bbbb2222", "gpu": "SIM-ws-01-0"}],
         "owner": {"user": "alice", "uid": 1001}, "created_at": 1000.0, "started_at": 1010.0,
         "progress": {"step": 30, "steps": 120, "loss": 2.5, "eta_s": 90.0}},
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
    # summary
    assert "<b>ws-01</b> <span class='dim'>term 3</span>" in page
    assert "<b>2</b> live of 3" in page
    assert "<b>1</b> free · 1 leased · 1 withheld" in page  # the dead peer's T4 is not counted
    assert "<b>1</b> running · <b>1</b> queued" in page
    # escaping: the only script is the page's own file
    assert page.count("<script") == 1
    assert "<script src='/static/status.js'></script>" in page
    assert "ws-02&lt;script&gt;" in page
    # GPUs: a leased GPU is the job's (its plan's bytes, then the rest of the lease), not "free"
    assert "job <b>my-run</b>: 20.0 of 80.0 GiB" in page
    assert "<span class='seg job w25'></span><span class='seg lease w75'></span>" in page
    assert "80.0 of 80.0 GiB free" in page  # SIM-ws-01-1, not leased
    assert "<span class='bad'>withheld</span>: not offered" in page  # offered: false, no reason given
    assert "<span class='seg other w17'></span><span class='seg free w83'></span>" in page  # 4 of 24 GiB used
    assert "<span class='tag real'>real</span>" in page
    assert "<span class='tag sim'>sim</span>" in page
    assert "<span class='tag coord'>coordinator</span>" in page
    for key in ("job's memory (its plan)", "rest of a leased GPU", "used outside Frenzy", "free"):
        assert key in page
    # jobs: running first, then queued, then finished; shape, user, progress, position and reason
    assert page.index("data-job='job-1'") < page.index("data-job='job-2'") < page.index("data-job='job-0'")
    assert "<b>my-run</b>" in page
    assert "<td>alice</td>" in page
    assert "1×A100-80GB dp1<br><span class='dim'>20.0 GiB per GPU</span>" in page
    progress = ("<span class='seg job w25'></span></span>step 30/120"
                "<span class='dim'> · loss 2.5 · 1m 30s left")
    assert progress in page
    assert "attempt 2" in page
    assert "ranks on ws-01:0" in page
    assert "<b>#1</b> in the queue: no GPU type in this pool fits it now" in page
    assert "step_time_s" not in page  # no raw floats
    assert "1m 30s" in page  # job-0 ran from 1010 to 1100


async def test_live_part_and_static_files(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, box, _ = server
    code, ctype, live = await get(base + "/live")
    assert code == 200
    assert ctype.startswith("text/html")
    assert "<html" not in live
    assert "id='summary'" in live
    next(j for j in box.status["jobs"] if j["id"] == "job-2")["state"] = "running"
    _, _, live = await get(base + "/live")
    assert "<b>2</b> running · <b>0</b> queued" in live
    code, ctype, js = await get(base + "/static/status.js")
    assert code == 200
    assert ctype.startswith("text/javascript")
    assert 'fetch("/live"' in js
    code, ctype, css = await get(base + "/static/status.css")
    assert ctype.startswith("text/css")
    assert ".w0{width:0%}" in css
    assert ".w100{width:100%}" in css


async def test_page_allows_only_its_own_files(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, _, _ = server
    async with aiohttp.ClientSession() as s, s.get(base + "/") as resp:
        csp = resp.headers["Content-Security-Policy"]
        page = await resp.text()
    assert "default-src 'none'" in csp
    assert "script-src 'self'" in csp
    assert "style-src 'self'" in csp
    assert "unsafe" not in csp
    assert " style=" not in page  # no inline style attribute either
    assert "<style" not in page


async def test_page_without_coordinator(server: tuple[str, Box, MetricsRegistry]) -> None:
    base, box, _ = server
    box.status = {"node": {"id": "x", "name": "lonely", "role": "peer", "term": 0}, "coordinator": None,
                  "peers": [], "jobs": []}
    _, _, page = await get(base + "/")
    assert "<b class='bad'>none yet</b>" in page
    assert "no jobs yet" in page


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
