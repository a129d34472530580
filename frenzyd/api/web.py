"""Read-only status web server: an HTML page a person reads, the status JSON, and Prometheus metrics.

``GET /`` renders the status JSON of DESIGN.md §6 server-side (no scripts; it
refreshes itself every few seconds); ``GET /api/v1/status`` is that JSON;
``GET /metrics`` is the Prometheus text format.  Every other method is refused
(405) by aiohttp.  Binds to 127.0.0.1 unless the config says otherwise.  A connection that sends
no complete request within ``[web] idle_timeout_s`` is closed, and at most ``[web]
max_connections`` are open at once (more are closed as they arrive).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from frenzyd.api.metrics import CONTENT_TYPE, MetricsRegistry

log = logging.getLogger(__name__)

StatusProvider = Callable[[], Mapping[str, Any]]

_STATUS: web.AppKey[StatusProvider] = web.AppKey("status")
_METRICS: web.AppKey[MetricsRegistry] = web.AppKey("metrics")

REFRESH_S = 5
GIB = 1024**3


def build_web_app(status: StatusProvider, metrics: MetricsRegistry) -> web.Application:
    """The web application; ``status()`` is called on every request (cheap, no I/O)."""
    app = web.Application(client_max_size=4096)
    app[_STATUS] = status
    app[_METRICS] = metrics
    metrics.bind_status(status)
    app.router.add_get("/", _page)
    app.router.add_get("/api/v1/status", _status_json)
    app.router.add_get("/metrics", _metrics)
    return app


def _snapshot(request: web.Request, path: str) -> Mapping[str, Any]:
    request.app[_METRICS].web_requests.labels(path=path).inc()
    try:
        return request.app[_STATUS]()
    except Exception as exc:
        log.exception("status provider failed")
        raise web.HTTPServiceUnavailable(text=f"status unavailable: {exc}") from exc


async def _status_json(request: web.Request) -> web.Response:
    st = _snapshot(request, "/api/v1/status")
    return web.Response(text=json.dumps(st, default=str), content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[_METRICS]
    metrics.web_requests.labels(path="/metrics").inc()
    return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _page(request: web.Request) -> web.Response:
    st = _snapshot(request, "/")
    return web.Response(text=render_page(st), content_type="text/html", headers=PAGE_HEADERS)


PAGE_HEADERS = {
    # The page is static HTML with one inline style sheet: nothing else may load or run.
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _short(node_id: object) -> str:
    s = "" if node_id is None else str(node_id)
    return s[:12]


def _bytes(n: object) -> int:
    """A byte count from a report, 0 for anything that is not one (reports are checked at the edge;
    the page does not rely on it)."""
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


def _gib(n: object) -> str:
    try:
        return f"{int(n) / GIB:.1f}"  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        return "?"


def render_page(st: Mapping[str, Any]) -> str:
    """The status page for one status JSON object (every value HTML-escaped)."""
    node = st.get("node") or {}
    coord = st.get("coordinator")
    peers = list(st.get("peers") or [])
    jobs = list(st.get("jobs") or [])
    names = {p.get("id"): p.get("name") for p in peers}

    out: list[str] = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<meta http-equiv='refresh' content='{REFRESH_S}'>",
        f"<title>Frenzy pool: {_e(node.get('name'))}</title>",
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1.5em}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#eee}"
        ".dead{color:#999}.sim{color:#a60}code{font-size:90%}tr.running td:nth-child(2){color:#070}"
        "tr.failed td:nth-child(2){color:#b00}tr.queued td:nth-child(2){color:#a60}</style></head><body>",
        f"<h1>Frenzy pool — {_e(node.get('name'))}</h1>",
        f"<p>This node: <b>{_e(node.get('name'))}</b> (<code>{_e(_short(node.get('id')))}</code>), "
        f"role <b>{_e(node.get('role'))}</b>, term {_e(node.get('term'))}.<br>",
    ]
    if coord:
        out.append(
            f"Coordinator: <b>{_e(coord.get('name'))}</b> (<code>{_e(_short(coord.get('id')))}</code>), "
            f"term {_e(coord.get('term'))}.</p>"
        )
    else:
        out.append("Coordinator: <b>none yet</b> (election in progress or no live peers).</p>")

    # GPUs by type across live peers
    by_type: dict[str, list[int]] = {}
    for p in peers:
        if not p.get("alive"):
            continue
        for g in p.get("gpus") or []:
            row = by_type.setdefault(str(g.get("type")), [0, 0, 0, 0])
            row[0] += 1
            row[1] += 0 if g.get("leased_to") else 1
            row[2] += _bytes(g.get("free_bytes"))
            row[3] += 1 if g.get("simulated") else 0
    out.append(f"<h2>GPUs by type ({sum(r[0] for r in by_type.values())})</h2>")
    out.append("<table><tr><th>type</th><th>GPUs</th><th>not leased</th><th>free memory (GiB)</th>"
               "<th>simulated</th></tr>")
    for gtype, (n, unleased, free, sim) in sorted(by_type.items()):
        out.append(f"<tr><td>{_e(gtype)}</td><td>{n}</td><td>{unleased}</td><td>{_gib(free)}</td>"
                   f"<td>{sim}</td></tr>")
    out.append("</table>")

    out.append(f"<h2>Peers ({sum(1 for p in peers if p.get('alive'))} alive of {len(peers)})</h2>")
    out.append("<table><tr><th>name</th><th>id</th><th>address</th><th>alive</th><th>GPUs</th></tr>")
    for p in sorted(peers, key=lambda p: str(p.get("name"))):
        gpus = []
        for g in p.get("gpus") or []:
            mem = f"{_gib(g.get('free_bytes'))}/{_gib(g.get('memory_bytes'))}"
            label = f"{_e(g.get('type'))} {mem} GiB free"
            if g.get("leased_to"):
                label += f", job <code>{_e(g.get('leased_to'))}</code>"
            if g.get("simulated"):
                label = f"<span class='sim'>{label} (simulated)</span>"
            gpus.append(label)
        cls = "" if p.get("alive") else " class='dead'"
        out.append(
            f"<tr{cls}><td>{_e(p.get('name'))}</td><td><code>{_e(_short(p.get('id')))}</code></td>"
            f"<td>{_e(p.get('address'))}</td><td>{'yes' if p.get('alive') else 'no'}</td>"
            f"<td>{'<br>'.join(gpus) or '—'}</td></tr>"
        )
    out.append("</table>")

    now = time.time()
    counts = {s: sum(1 for j in jobs if j.get("state") == s) for s in JOB_ORDER}
    out.append(f"<h2>Jobs ({len(jobs)}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + ")</h2>")
    out.append("<table><tr><th>job</th><th>state</th><th>attempt</th><th>why / where</th><th>plan</th>"
               "<th>ranks</th><th>submitter</th><th>age</th><th>ran for</th></tr>")
    for j in sorted(jobs, key=_job_order):
        plan = j.get("plan")
        plan_text = _plan_text(plan) if isinstance(plan, Mapping) else "—"
        ranks = ", ".join(
            f"{_e(r.get('rank'))}@{_e(names.get(r.get('peer')) or _short(r.get('peer')))}"
            f":{_e(r.get('gpu'))}"
            for r in j.get("ranks") or []
        )
        sub = j.get("submitter")
        state = str(j.get("state"))
        phase = j.get("phase")
        detailed = phase and phase not in (state, "done", "running")
        shown_state = f"{_e(state)} ({_e(phase)})" if detailed else _e(state)
        why = _e(j.get("reason") or j.get("message") or "")
        if state == "queued" and j.get("queue_position"):
            why = f"#{_e(j['queue_position'])} in the queue; {why}"
        name = f"<b>{_e(j['name'])}</b><br>" if j.get("name") else ""
        out.append(
            f"<tr class='{_e(state)}'><td>{name}<code>{_e(j.get('id'))}</code></td><td>{shown_state}</td>"
            f"<td>{_e(j.get('attempt') or '—')}</td><td>{why or '—'}</td><td>{plan_text}</td>"
            f"<td>{ranks or '—'}</td><td>{_e(names.get(sub) or j.get('submitter_name') or _short(sub))}</td>"
            f"<td>{_duration(now - _num(j.get('created_at')))}</td>"
            f"<td>{_ran_for(j, now)}</td></tr>"
        )
    out.append("</table>")
    out.append("<p><a href='/api/v1/status'>status JSON</a> · <a href='/metrics'>metrics</a></p>")
    out.append("</body></html>")
    return "\n".join(out)


JOB_ORDER = ("running", "queued", "failed", "cancelled", "succeeded")


def _num(x: object) -> float:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0


def _job_order(j: Mapping[str, Any]) -> tuple[int, float, float]:
    """Running first, then queued by position, then finished jobs newest first."""
    state = j.get("state")
    if state == "running":
        return (0, -_num(j.get("updated_at")), 0.0)
    if state == "queued":
        return (1, _num(j.get("queue_position")), _num(j.get("created_at")))
    return (2, -_num(j.get("updated_at")), 0.0)


def _duration(seconds: float) -> str:
    """``42s``, ``7m 05s``, ``3h 12m``, ``2d 4h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _ran_for(j: Mapping[str, Any], now: float) -> str:
    if j.get("state") == "queued" or not j.get("updated_at"):
        return "—"
    end = now if j.get("state") == "running" else _num(j.get("updated_at"))
    started = _num(j.get("started_at")) or _num(j.get("created_at"))
    return _duration(end - started) if started else "—"


def _value(v: object) -> str:
    """A plan value for a person: floats to 3 significant digits, the rest as is."""
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _plan_text(plan: Mapping[str, Any]) -> str:
    """A plan as a person reads it: shape first, memory in GiB, then anything else the plan carries."""
    shown = {
        "gpus", "gpu_type", "dp", "tp", "pp", "zero", "bytes_per_gpu", "gpu_memory_bytes", "source", "policy",
    }
    head = (
        f"{_e(plan.get('gpus', '?'))} × {_e(plan.get('gpu_type', '?'))}: dp {_e(plan.get('dp', 1))}, "
        f"tp {_e(plan.get('tp', 1))}, pp {_e(plan.get('pp', 1))}, ZeRO-{_e(plan.get('zero', 0))}"
    )
    if "bytes_per_gpu" in plan:
        head += f"; {_e(_gib(plan['bytes_per_gpu']))} GiB per GPU"
        if "gpu_memory_bytes" in plan:
            head += f" of {_e(_gib(plan['gpu_memory_bytes']))}"
        if plan.get("source"):
            head += f" ({_e(plan['source'])})"
    if plan.get("policy"):
        head += f"; placed by {_e(plan['policy'])}"
    rest = ", ".join(f"{_e(k)}={_e(_value(v))}" for k, v in plan.items() if k not in shown)
    return f"{head}<br><small>{rest}</small>" if rest else head


class _Closed(asyncio.Protocol):
    """A connection over the cap: closed as soon as it is accepted."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _CappedSite(web.TCPSite):
    """A TCP site that closes connections beyond ``max_connections`` as they are accepted (within one
    accept burst of the listen backlog, which is kept at most ``max_connections``)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, max_connections: int,
                 on_refused: Callable[[], None]) -> None:
        super().__init__(runner, host, port, backlog=max(1, min(128, max_connections)))
        self._max_connections = max_connections
        self._on_refused = on_refused

    async def start(self) -> None:
        server = self._runner.server
        assert server is not None
        self._runner._reg_site(self)  # what BaseSite.start does; TCPSite.start would bind unguarded
        cap, refused = self._max_connections, self._on_refused

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= cap:
                refused()
                return _Closed()
            return server()

        self._server = await asyncio.get_running_loop().create_server(
            protocol, self._host, self._port, backlog=self._backlog)


class WebServer:
    """Runs an application on host:port inside the caller's event loop (port 0 picks a free port).

    ``idle_timeout_s``: a connection that has not sent a complete request (its headers) within this,
    from connecting or from its last response, is closed.  ``max_connections``: open connections
    at once; more are closed as they arrive (``refused`` counts them).
    """

    def __init__(self, app: web.Application, host: str = "127.0.0.1", port: int = 7480, *,
                 idle_timeout_s: float = 15.0, max_connections: int = 64) -> None:
        self.app, self.host, self.port = app, host, port
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.refused = 0
        self._runner: web.AppRunner | None = None

    def _refused(self) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 1000 == 0:
            log.warning("web: %d connection(s) refused: over [web] max_connections = %d",
                        self.refused, self.max_connections)

    async def start(self) -> int:
        """Listen; return the bound port."""
        # aiohttp's keep-alive timer also runs from the moment a connection opens and closes it
        # while no complete request has arrived: it is the header timeout as well as the idle one.
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.idle_timeout_s)
        await self._runner.setup()
        site = _CappedSite(self._runner, self.host, self.port, self.max_connections, self._refused)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
