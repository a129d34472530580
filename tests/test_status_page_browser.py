"""The status page in a real browser (issue 17, Proof): headless Chromium, driven over the DevTools
protocol, loads the page of a two-node pool running jobs, finds its parts, sees a job's state change
appear without a reload, and meets no Content-Security-Policy violation.  It saves a screenshot
(``FRENZY_SCREENSHOT=docs/status-page.png`` writes the README's copy).

Chromium comes from Debian's ``chromium`` package (scripts/test installs it when root); without
it the test is skipped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from _pool import Daemon, NodeConf, wait_until  # noqa: E402

from frenzyd.net import auth  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")

SLEEPER = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class DevTools:
    """One page target over the Chrome DevTools protocol: commands by id, events kept in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self._waiting:
                self._waiting.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._next] = fut
        await self.ws.send_str(json.dumps({"id": self._next, "method": method, "params": params}))
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        return dict(reply.get("result") or {})

    async def js(self, expression: str) -> Any:
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    async def wait_js(self, expression: str, within_s: float, what: str) -> Any:
        deadline = time.monotonic() + within_s
        while True:
            value = await self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within_s:.0f}s waiting for {what}")
            await asyncio.sleep(0.25)

    def console(self) -> list[str]:
        """Console messages and log entries seen so far, as text."""
        out = []
        for e in self.events:
            if e["method"] == "Runtime.consoleAPICalled":
                args = e["params"]["args"]
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
            elif e["method"] == "Log.entryAdded":
                out.append(f"{e['params']['entry']['level']}: {e['params']['entry']['text']}")
            elif e["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {e['params']['exceptionDetails']}")
        return out


@contextlib.asynccontextmanager
async def chromium(tmp_path: Path) -> AsyncIterator[DevTools]:
    assert CHROMIUM is not None
    argv = [CHROMIUM, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'chromium'}",
            "--window-size=1400,1000", "about:blank"]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,  # noqa: ASYNC220
                            start_new_session=True)
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = await asyncio.to_thread(proc.stderr.readline)
            if not line and proc.poll() is not None:
                break
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(m.group(1)) if m else None
        assert port is not None, "chromium did not open its DevTools port"
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            page = next(t for t in targets if t["type"] == "page")
            async with s.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 << 20) as ws:
                tools = DevTools(ws)
                for domain in ("Runtime", "Log", "Page"):
                    await tools.send(f"{domain}.enable")
                # Runs before the page's own script, outside its CSP: records every violation.
                await tools.send("Page.addScriptToEvaluateOnNewDocument", source=(
                    "window.__csp = []; document.addEventListener('securitypolicyviolation', "
                    "e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));"))
                yield tools
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


async def test_status_page_in_chromium(tmp_path: Path) -> None:
    auth.create_pool(tmp_path / "pool")
    creds = {n: auth.add_node(tmp_path / "pool", n).out_dir for n in ("ws-a", "ws-b")}
    peer_ports, web_ports = _ports(2), _ports(2)
    devices = [[("A100-80GB", 2)], [("RTX-3090", 1), ("T4", 1)]]
    daemons = [Daemon(NodeConf(name=n, base=tmp_path / n, credentials=creds[n], devices=devices[i],
                               listen=f"127.0.0.1:{peer_ports[i]}", web=f"127.0.0.1:{web_ports[i]}",
                               peers=[f"127.0.0.1:{peer_ports[1 - i]}"], mdns=False, interfaces=["lo"],
                               priority=1 - i, rendezvous_ports=(29600 + 20 * i, 29619 + 20 * i)))
               for i, n in enumerate(("ws-a", "ws-b"))]
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "sleeper.py").write_text(SLEEPER)
    try:
        for d in daemons:
            d.start()
        a = daemons[0]

        def status(i: int = 0) -> dict[str, Any]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{web_ports[i]}/api/v1/status", timeout=5) as r:
                    return dict(json.loads(r.read()))
            except OSError:
                return {}

        def formed() -> bool:
            sts = [status(0), status(1)]
            return all(sum(p["alive"] for p in st.get("peers", [])) == 2 and st.get("coordinator")
                       for st in sts)

        await asyncio.to_thread(wait_until, formed, 90, "the pool to form")

        def submit(name: str, nproc: int, mem: str, seconds: int) -> str:
            out = a.client("run", "--detach", "--json", "--name", name, "--nproc", str(nproc),
                           "--mem-per-rank", mem, "--", str(job_dir / "sleeper.py"), str(seconds))
            return str(json.loads(out)["job"])

        def states(*jobs: str) -> list[str | None]:
            by_id = {j["id"]: j["state"] for j in status().get("jobs", [])}
            return [by_id.get(j) for j in jobs]

        smoke, big = await asyncio.gather(asyncio.to_thread(submit, "smoke-test", 1, "2GiB", 0),
                                          asyncio.to_thread(submit, "finetune-7b", 2, "30GiB", 600))
        sweep = await asyncio.to_thread(submit, "lr-sweep", 2, "30GiB", 600)
        want = ["succeeded", "running", "queued"]
        await asyncio.to_thread(wait_until, lambda: states(smoke, big, sweep) == want, 90,
                                "smoke-test to end, finetune-7b to run and lr-sweep to queue")

        async with chromium(tmp_path) as tab:
            await tab.send("Page.navigate", url=f"http://127.0.0.1:{web_ports[0]}/")
            await tab.wait_js("document.readyState === 'complete' && !!document.querySelector('#summary')",
                              30, "the page to load")
            await tab.js("window.__loadedOnce = 'yes'")  # gone if the page reloads
            parts = await tab.js("""({
                cards: document.querySelectorAll('#summary .card').length,
                nodes: [...document.querySelectorAll('table.nodes tbody tr')].map(r => r.dataset.node),
                gpus: document.querySelectorAll('.gpu .bar').length,
                leased: [...document.querySelectorAll('.gpu.leased .gtext')].map(e => e.textContent),
                legend: !!document.querySelector('.legend .key.lease'),
                sim: document.querySelectorAll('.tag.sim').length,
                jobs: [...document.querySelectorAll('table.jobs tbody tr')].map(r =>
                    [r.dataset.job, r.querySelector('.state').textContent]),
                queued: document.querySelector(`tr[data-job='""" + sweep + """'] td:last-child`).textContent,
                plan: document.querySelector(`tr[data-job='""" + big + """'] td:nth-child(4)`).textContent,
                barWidth: document.querySelector('.gpu.leased .seg').getBoundingClientRect().width,
            })""")
            assert parts["cards"] == 4, parts
            assert parts["nodes"] == ["ws-a", "ws-b"], parts
            assert parts["gpus"] == 4, parts
            assert parts["sim"] >= 4, parts
            assert parts["legend"], parts
            assert len(parts["leased"]) == 2, parts
            assert all("finetune-7b" in t for t in parts["leased"]), parts
            assert parts["jobs"] == [[big, "running"], [sweep, "queued"], [smoke, "succeeded"]], parts
            assert parts["queued"].startswith("#1 in the queue"), parts
            assert parts["plan"].startswith("2×A100-80GB dp2"), parts
            assert parts["barWidth"] > 0, parts  # the style sheet applied: CSP let /static/status.css in

            shot = tmp_path / "status-page.png"
            png = await tab.send("Page.captureScreenshot", format="png")
            shot.write_bytes(base64.b64decode(png["data"]))
            if os.environ.get("FRENZY_SCREENSHOT"):
                shutil.copyfile(shot, os.environ["FRENZY_SCREENSHOT"])

            await asyncio.to_thread(a.client, "cancel", big)
            await tab.wait_js(f"""(() => {{
                const big = document.querySelector("tr[data-job='{big}'] .state");
                const sweep = document.querySelector("tr[data-job='{sweep}'] .state");
                return big && big.textContent === 'cancelled' && sweep && sweep.textContent === 'running';
            }})()""", 60, "the cancel and the queued job's start to appear on the page")
            assert await tab.js("window.__loadedOnce") == "yes"  # updated in place, not reloaded
            assert await tab.js("performance.getEntriesByType('navigation').length") == 1
            assert "updated" in await tab.js("document.getElementById('updated').textContent")

            assert await tab.js("window.__csp") == []
            console = tab.console()
            assert not [c for c in console if "Content Security Policy" in c or "exception" in c], console
    finally:
        await asyncio.gather(*(asyncio.to_thread(d.stop) for d in daemons))
