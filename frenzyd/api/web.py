"""Read-only status web server: an HTML page a person reads, the status JSON, and Prometheus metrics.

``GET /`` is the status page (``status_page``: the status JSON of DESIGN.md §6 rendered
server-side); ``GET /live`` its changing part, which ``/static/status.js`` swaps in every few
seconds; ``GET /api/v1/status`` is the JSON; ``GET /metrics`` the Prometheus text format.
Every other method is refused (405) by aiohttp.  Binds to 127.0.0.1 unless the config says
otherwise.  A connection that sends no complete request within ``[web] idle_timeout_s`` is
closed, and at most ``[web] max_connections`` are open at once (more are closed as they arrive).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from frenzyd.api.metrics import CONTENT_TYPE, MetricsRegistry
from frenzyd.api.status_page import SCRIPT, render_live, render_page, stylesheet

log = logging.getLogger(__name__)

StatusProvider = Callable[[], Mapping[str, Any]]
StatusRefresh = Callable[[], Awaitable[None]]
"""Awaited before a page or the status JSON is built (the daemon's ``refresh_status``)."""

_STATUS: web.AppKey[StatusProvider] = web.AppKey("status")
_METRICS: web.AppKey[MetricsRegistry] = web.AppKey("metrics")
_REFRESH: web.AppKey[StatusRefresh | None] = web.AppKey("refresh")

__all__ = ["PAGE_HEADERS", "WebServer", "build_web_app", "render_page"]


def build_web_app(status: StatusProvider, metrics: MetricsRegistry,
                  refresh: StatusRefresh | None = None) -> web.Application:
    """The web application; ``status()`` is called on every request (cheap, no I/O), after
    ``refresh()`` for the page and the JSON (not for ``/metrics``, which shows this node's own view)."""
    app = web.Application(client_max_size=4096)
    app[_STATUS] = status
    app[_REFRESH] = refresh
    app[_METRICS] = metrics
    metrics.bind_status(status)
    app.router.add_get("/", _page)
    app.router.add_get("/live", _live)
    app.router.add_get("/static/status.js", _script)
    app.router.add_get("/static/status.css", _style)
    app.router.add_get("/api/v1/status", _status_json)
    app.router.add_get("/metrics", _metrics)
    return app


async def _snapshot(request: web.Request, path: str) -> Mapping[str, Any]:
    request.app[_METRICS].web_requests.labels(path=path).inc()
    if (refresh := request.app[_REFRESH]) is not None:
        await refresh()
    try:
        return request.app[_STATUS]()
    except Exception as exc:
        log.exception("status provider failed")
        raise web.HTTPServiceUnavailable(text=f"status unavailable: {exc}") from exc


async def _status_json(request: web.Request) -> web.Response:
    st = await _snapshot(request, "/api/v1/status")
    return web.Response(text=json.dumps(st, default=str), content_type="application/json")


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[_METRICS]
    metrics.web_requests.labels(path="/metrics").inc()
    return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def _page(request: web.Request) -> web.Response:
    st = await _snapshot(request, "/")
    return web.Response(text=render_page(st), content_type="text/html", headers=PAGE_HEADERS)


async def _live(request: web.Request) -> web.Response:
    st = await _snapshot(request, "/live")
    return web.Response(text=render_live(st), content_type="text/html", headers=PAGE_HEADERS)


async def _script(request: web.Request) -> web.Response:
    return web.Response(text=SCRIPT, content_type="text/javascript", headers=STATIC_HEADERS)


async def _style(request: web.Request) -> web.Response:
    return web.Response(text=_CSS, content_type="text/css", headers=STATIC_HEADERS)


_CSS = stylesheet()

PAGE_HEADERS = {
    # Only the server's own script, style sheet and status fetches: no inline script or style, no
    # other origin, no frames, no forms.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "max-age=300"}


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
