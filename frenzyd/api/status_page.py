"""The status page a person reads: the status JSON of DESIGN §6 rendered as HTML (pure; every value escaped).

One renderer serves both the first load (``GET /``: :func:`render_page`) and the page's refresh
(``GET /live``: :func:`render_live`, the part that changes, which ``static/status.js`` swaps in
without reloading).  The page uses no inline script or style, so its Content-Security-Policy can
allow only the server's own ``/static`` files.

At a glance: a pool summary; each node with its GPUs as memory bars (a leased GPU is the job's:
its plan's bytes and the rest of the lease; an unleased one shows what other processes use),
simulated and real GPUs told apart, with a legend; jobs running first (newest first), then queued
(by position, with the reason they wait), then the latest finished ones.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

GIB: Final = 1024**3
REFRESH_S: Final = 3
FINISHED_SHOWN: Final = 15
"""Finished jobs listed (newest first); older ones are counted, not listed."""
JOB_ORDER: Final = ("running", "queued", "failed", "cancelled", "succeeded")
DASH: Final = "<span class='dim'>—</span>"


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _num(x: object) -> float:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else 0.0


def _bytes(n: object) -> int:
    """A byte count from a report, 0 for anything that is not one."""
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


def _gib(n: object) -> str:
    b = _bytes(n)
    return f"{b / GIB:.1f}" if b < 100 * GIB else f"{b / GIB:.0f}"


def _short(node_id: object) -> str:
    return "" if node_id is None else str(node_id)[:12]


def duration(seconds: float) -> str:
    """``42s``, ``7m 05s``, ``3h 12m``, ``2d 4h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def plan_shape(plan: Mapping[str, Any]) -> str:
    """A plan as a shape: ``2×A100-80GB dp2``, ``4×RTX-3090 dp2 tp2 ZeRO-1`` (plain text)."""
    shape = f"{plan.get('gpus', '?')}×{plan.get('gpu_type', '?')} dp{plan.get('dp', 1)}"
    for key in ("tp", "pp"):
        if _num(plan.get(key)) > 1:
            shape += f" {key}{plan.get(key)}"
    if _num(plan.get("zero")) > 0:
        shape += f" ZeRO-{plan.get('zero')}"
    return shape


def _user(j: Mapping[str, Any]) -> str:
    owner = j.get("owner")
    if isinstance(owner, Mapping) and owner.get("user"):
        return str(owner["user"])
    return str(j.get("user") or "")


def job_order(j: Mapping[str, Any]) -> tuple[int, float, float]:
    """Running first (newest first), then queued by position, then finished jobs newest first."""
    state = j.get("state")
    if state == "running":
        return (0, -_num(j.get("started_at") or j.get("created_at")), 0.0)
    if state == "queued":
        return (1, _num(j.get("queue_position")) or 1e9, _num(j.get("created_at")))
    return (2, -_num(j.get("finished_at") or j.get("updated_at")), 0.0)


# --- the page --------------------------------------------------------------------------------------


def render_page(st: Mapping[str, Any], now: float | None = None) -> str:
    """The whole page: head (no inline script or style), the live part, the refresh script."""
    node = st.get("node") or {}
    return "\n".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<noscript><meta http-equiv='refresh' content='{REFRESH_S * 2}'></noscript>",
        f"<title>Frenzy pool — {_e(node.get('name'))}</title>",
        "<link rel='stylesheet' href='/static/status.css'></head><body>",
        f"<header><h1>Frenzy pool <small>as {_e(node.get('name'))} sees it</small></h1>"
        "<span id='updated' class='ok'>live</span></header>",
        f"<main id='live' data-refresh='{REFRESH_S}'>",
        render_live(st, now),
        "</main>",
        "<footer><a href='/api/v1/status'>status JSON</a> · <a href='/metrics'>metrics</a> · read-only; "
        f"refreshes every {REFRESH_S} s</footer>",
        "<script src='/static/status.js'></script>",
        "</body></html>",
    ])


def render_live(st: Mapping[str, Any], now: float | None = None) -> str:
    """The part of the page that changes: summary, nodes and GPUs, jobs."""
    now = now if now is not None else _num((st.get("node") or {}).get("time")) or time.time()
    peers = [p for p in st.get("peers") or () if isinstance(p, Mapping)]
    jobs = [j for j in st.get("jobs") or () if isinstance(j, Mapping)]
    by_id = {j.get("id"): j for j in jobs}
    return "\n".join([_summary(st, peers, jobs), _nodes(st, peers, by_id), _jobs(peers, jobs, now)])


def _summary(st: Mapping[str, Any], peers: Sequence[Mapping[str, Any]],
             jobs: Sequence[Mapping[str, Any]]) -> str:
    node = st.get("node") or {}
    coord = st.get("coordinator")
    live = [p for p in peers if p.get("alive")]
    gpus = [g for p in live for g in p.get("gpus") or () if isinstance(g, Mapping)]
    leased = sum(1 for g in gpus if g.get("leased_to"))
    withheld = sum(1 for g in gpus if not g.get("leased_to") and g.get("offered") is False)
    free = len(gpus) - leased - withheld
    sim = sum(1 for g in gpus if g.get("simulated"))
    avail = sum(_bytes(g.get("free_bytes")) for g in gpus
                if not g.get("leased_to") and g.get("offered") is not False)
    counts = {s: sum(1 for j in jobs if j.get("state") == s) for s in JOB_ORDER}
    finished = counts["succeeded"] + counts["failed"] + counts["cancelled"]
    coord_text = (f"<b>{_e(coord.get('name'))}</b> <span class='dim'>term {_e(coord.get('term'))}</span>"
                  if isinstance(coord, Mapping) else "<b class='bad'>none yet</b> <span class='dim'>election "
                  "in progress or no live peers</span>")
    cards = [
        ("Nodes", f"<b>{len(live)}</b> live of {len(peers)}"),
        ("Coordinator", coord_text),
        ("GPUs", f"<b>{free}</b> free · {leased} leased · {withheld} withheld"
                 f"<br><span class='dim'>{len(gpus) - sim} real, {sim} simulated; {_gib(avail)} GiB free to "
                 "lease</span>"),
        ("Jobs", f"<b>{counts['running']}</b> running · <b>{counts['queued']}</b> queued"
                 f"<br><span class='dim'>{finished} finished ({counts['failed']} failed)</span>"),
    ]
    out = ["<section class='summary' id='summary'>"]
    for title, body in cards:
        out.append(f"<div class='card'><h2>{title}</h2><p>{body}</p></div>")
    out.append("</section>")
    others = st.get("other_versions") or ()
    if others:
        out.append(f"<p class='bad'>{len(others)} node(s) speak another protocol version: upgrade them.</p>")
    out.append(f"<p class='dim'>This node: {_e(node.get('name'))} "
               f"(<code>{_e(_short(node.get('id')))}</code>), "
               f"{_e(node.get('role'))}.</p>")
    return "\n".join(out)


LEGEND: Final = (
    "<p class='legend'><span class='key job'></span>job's memory (its plan) "
    "<span class='key lease'></span>rest of a leased GPU "
    "<span class='key other'></span>used outside Frenzy (owner, desktop) "
    "<span class='key free'></span>free "
    "<span class='tag real'>real</span> NVML GPU <span class='tag sim'>sim</span> declared, simulated "
    "<span class='tag withheld'>withheld</span> not offered (reason shown)</p>"
)


def _nodes(st: Mapping[str, Any], peers: Sequence[Mapping[str, Any]],
           by_id: Mapping[Any, Mapping[str, Any]]) -> str:
    me = (st.get("node") or {}).get("id")
    coord = (st.get("coordinator") or {}).get("id") if isinstance(st.get("coordinator"), Mapping) else None
    out = [f"<section id='nodes'><h2>Nodes and GPUs</h2>{LEGEND}",
           "<table class='nodes'><thead><tr><th>node</th><th>address</th><th>state</th><th>GPUs</th></tr>"
           "</thead>"
           "<tbody>"]
    for p in sorted(peers, key=lambda p: (not p.get("alive"), str(p.get("name")))):
        badges = ""
        if p.get("id") == coord:
            badges += " <span class='tag coord'>coordinator</span>"
        if p.get("id") == me:
            badges += " <span class='tag me'>this node</span>"
        gpus = "".join(_gpu(g, by_id) for g in p.get("gpus") or () if isinstance(g, Mapping)) or \
            "<span class='dim'>no GPU</span>"
        alive = p.get("alive")
        out.append(f"<tr class='{'alive' if alive else 'dead'}' data-node='{_e(p.get('name'))}'>"
                   f"<td><b>{_e(p.get('name'))}</b>{badges}<br>"
                   f"<code class='dim'>{_e(_short(p.get('id')))}</code></td>"
                   f"<td>{_e(p.get('address'))}</td><td>{'live' if alive else 'silent'}</td>"
                   f"<td class='gpus'>{gpus}</td></tr>")
    out.append("</tbody></table></section>")
    return "\n".join(out)


def _pct(part: int, whole: int) -> int:
    return max(0, min(100, round(100 * part / whole))) if whole > 0 else 0


def _gpu(g: Mapping[str, Any], by_id: Mapping[Any, Mapping[str, Any]]) -> str:
    """One GPU: type, real/simulated, a memory bar that counts its lease, and what it is doing."""
    total = _bytes(g.get("memory_bytes"))
    free = min(_bytes(g.get("free_bytes")), total)
    job_id = g.get("leased_to")
    kind = "sim" if g.get("simulated") else "real"
    segs: list[tuple[str, int]]
    if job_id:
        job = by_id.get(job_id) or {}
        plan = job.get("plan") if isinstance(job.get("plan"), Mapping) else {}
        job_bytes = min(_bytes((plan or {}).get("bytes_per_gpu")), total)
        segs = [("job", job_bytes), ("lease", total - job_bytes)]
        name = job.get("name") or str(job_id)[:12]
        what = (f"job <b>{_e(name)}</b>: {_gib(job_bytes)} of {_gib(total)} GiB" if job_bytes else
                f"job <b>{_e(name)}</b> holds it ({_gib(total)} GiB)")
        state = "leased"
    else:
        other = total - free
        segs = [("other", other), ("free", free)]
        if g.get("offered") is False:
            what = f"<span class='bad'>withheld</span>: {_e(g.get('reason') or 'not offered')}"
            state = "withheld"
        else:
            used = f", {_gib(other)} used outside Frenzy" if other else ""
            what = f"{_gib(free)} of {_gib(total)} GiB free{used}"
            state = "free"
    bar = "".join(f"<span class='seg {cls} w{_pct(n, total)}'></span>" for cls, n in segs if _pct(n, total))
    title = f"{g.get('type')} {g.get('uuid')}"
    return (f"<div class='gpu {state}' data-gpu='{_e(g.get('uuid'))}' title='{_e(title)}'>"
            f"<span class='gname'>{_e(g.get('type'))}</span> <span class='tag {kind}'>{kind}</span>"
            f"<span class='bar'>{bar}</span><span class='gtext'>{what}</span></div>")


def _progress(j: Mapping[str, Any]) -> str:
    prog = j.get("progress")
    if not isinstance(prog, Mapping) or not isinstance(prog.get("step"), int):
        return "<span class='dim'>—</span>"
    step, steps = prog["step"], prog.get("steps")
    text = f"step {step}" + (f"/{steps}" if isinstance(steps, int) and steps > 0 else "")
    bar = ""
    if isinstance(steps, int) and steps > 0:
        bar = f"<span class='bar small'><span class='seg job w{_pct(step, steps)}'></span></span>"
    loss = prog.get("loss")
    extra = f" · loss {loss:.3g}" if isinstance(loss, float | int) and not isinstance(loss, bool) else ""
    eta = prog.get("eta_s")
    if isinstance(eta, int | float) and not isinstance(eta, bool) and j.get("state") == "running":
        extra += f" · {duration(eta)} left"
    return f"{bar}{text}<span class='dim'>{extra}</span>"


def _jobs(peers: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]], now: float) -> str:
    names = {p.get("id"): p.get("name") for p in peers}
    ordered = sorted(jobs, key=job_order)
    active = [j for j in ordered if j.get("state") in ("running", "queued")]
    finished = [j for j in ordered if j.get("state") not in ("running", "queued")]
    shown = active + finished[:FINISHED_SHOWN]
    out = ["<section id='jobs'><h2>Jobs</h2>",
           "<table class='jobs'><thead><tr><th>job</th><th>user</th><th>state</th><th>plan</th>"
           "<th>progress</th>"
           "<th>age</th><th>ran for</th><th>where / why</th></tr></thead><tbody>"]
    if not shown:
        out.append("<tr><td colspan='8' class='dim'>no jobs yet: frenzy-client run ...</td></tr>")
    for j in shown:
        state = str(j.get("state"))
        phase = j.get("phase")
        state_html = f"<span class='state {_e(state)}'>{_e(state)}</span>"
        if phase and phase not in (state, "done", "running"):
            state_html += f"<br><span class='dim'>{_e(phase)}</span>"
        if j.get("attempt") and _num(j.get("attempt")) > 1:
            state_html += f"<br><span class='dim'>attempt {_e(j.get('attempt'))}</span>"
        plan = j.get("plan")
        plan_html = _e(plan_shape(plan)) if isinstance(plan, Mapping) else "<span class='dim'>—</span>"
        if isinstance(plan, Mapping) and plan.get("bytes_per_gpu"):
            plan_html += f"<br><span class='dim'>{_gib(plan['bytes_per_gpu'])} GiB per GPU</span>"
        reason = _e(j.get("reason") or j.get("message") or "")
        if state == "queued":
            pos = j.get("queue_position")
            where = f"<b>#{_e(pos)}</b> in the queue" if pos else "queued"
            where += f": {reason}" if reason else ""
        elif state == "running":
            where = ", ".join(f"{_e(names.get(r.get('peer')) or _short(r.get('peer')))}:{_e(r.get('rank'))}"
                              for r in j.get("ranks") or () if isinstance(r, Mapping)) or reason
            where = f"ranks on {where}" if where and j.get("ranks") else where
        else:
            where = reason
        name = j.get("name") or ""
        job_cell = (f"<b>{_e(name)}</b><br><code class='dim'>{_e(j.get('id'))}</code>" if name
                    else f"<code>{_e(j.get('id'))}</code>")
        out.append(
            f"<tr class='{_e(state)}' data-job='{_e(j.get('id'))}'><td>{job_cell}</td>"
            f"<td>{_e(_user(j)) or DASH}</td><td>{state_html}</td>"
            f"<td>{plan_html}</td><td>{_progress(j)}</td>"
            f"<td>{duration(now - _num(j.get('created_at'))) if j.get('created_at') else '—'}</td>"
            f"<td>{_ran_for(j, now)}</td><td>{where or '—'}</td></tr>")
    out.append("</tbody></table>")
    if len(finished) > FINISHED_SHOWN:
        out.append(f"<p class='dim'>and {len(finished) - FINISHED_SHOWN} older finished job(s): "
                   "frenzy-client jobs --json</p>")
    out.append("</section>")
    return "\n".join(out)


def _ran_for(j: Mapping[str, Any], now: float) -> str:
    state = j.get("state")
    started = _num(j.get("started_at"))
    if state == "queued" or not started:
        return "—"
    end = now if state == "running" else _num(j.get("finished_at")) or _num(j.get("updated_at"))
    return duration(end - started) if end >= started else "—"


def stylesheet() -> str:
    """The page's CSS (served as ``/static/status.css``): widths for bar segments as classes ``w0``..
    ``w100``, so the page needs no inline style."""
    widths = "".join(f".w{i}{{width:{i}%}}" for i in range(101))
    return BASE_CSS + widths + "\n"


BASE_CSS: Final = """\
:root{--job:#2f6fdf;--lease:#a9c4f5;--other:#e89a3c;--free:#e6efe6;--bad:#c0392b;--ok:#1e8449}
body{font-family:system-ui,sans-serif;margin:0 1.5em 1.5em;color:#222;background:#fafafa}
header{display:flex;align-items:baseline;justify-content:space-between;border-bottom:1px solid #ddd}
h1{font-size:1.4em;margin:.6em 0}h1 small{font-weight:normal;color:#777;font-size:.7em}
h2{font-size:1.1em;margin:1em 0 .4em}
#updated{font-size:.85em;color:#777}#updated.stale{color:var(--bad);font-weight:bold}
.summary{display:flex;flex-wrap:wrap;gap:.8em}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.2em .9em;min-width:13em}
.card h2{font-size:.8em;text-transform:uppercase;color:#777;margin:.5em 0 0}.card p{margin:.3em 0 .6em}
table{border-collapse:collapse;background:#fff;width:100%}
td,th{border-bottom:1px solid #e3e3e3;padding:.35em .6em;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-size:.85em}
tr.dead{color:#999}.dim{color:#777;font-size:.9em}.bad{color:var(--bad)}code{font-size:.85em}
.tag{display:inline-block;font-size:.7em;padding:0 .4em;border-radius:3px;border:1px solid;margin-left:.3em}
.tag.sim{color:#8a5a00;border-color:#d9a441;background:#fff6e0}.tag.real{color:#1e6b34;border-color:#5cb85c}
.tag.withheld{color:var(--bad);border-color:var(--bad)}.tag.coord{color:#5b2c83;border-color:#8e44ad}
.tag.me{color:#555;border-color:#aaa}
.gpu{display:flex;align-items:center;gap:.5em;margin:.15em 0;white-space:nowrap}
.gpu .gname{min-width:7.5em;font-weight:600}.gpu.withheld .bar{outline:2px solid var(--bad)}
.bar{display:inline-flex;width:14em;height:.9em;background:var(--free);border:1px solid #bbb;
border-radius:3px;overflow:hidden;flex:none}.bar.small{width:6em;height:.7em;margin-right:.4em;vertical-align:middle}
.seg{display:block;height:100%}.seg.job{background:var(--job)}.seg.lease{background:var(--lease)}
.seg.other{background:var(--other)}.seg.free{background:var(--free)}
.gtext{font-size:.85em;color:#444;white-space:normal}
.legend{font-size:.85em;color:#555}.key{display:inline-block;width:1em;height:.8em;margin:0 .3em 0 .8em;
border:1px solid #bbb;vertical-align:middle}.key.job{background:var(--job)}.key.lease{background:var(--lease)}
.key.other{background:var(--other)}.key.free{background:var(--free)}
.state{font-weight:600}.state.running{color:var(--ok)}.state.failed{color:var(--bad)}
.state.queued{color:#b9770e}.state.cancelled{color:#777}.state.succeeded{color:#2471a3}
tr.running{background:#f3fbf4}.jobs td{white-space:nowrap}.jobs td:last-child{white-space:normal}
footer{margin-top:1.5em;font-size:.85em;color:#777}
"""

SCRIPT: Final = """\
// Frenzy status page: swap in the live part every few seconds, without reloading the page.
// Served as /static/status.js (the page's Content-Security-Policy forbids inline scripts).
"use strict";
(function () {
  const main = document.getElementById("live");
  const stamp = document.getElementById("updated");
  if (!main || !stamp) { return; }
  const every = 1000 * (Number(main.dataset.refresh) || 3);
  let busy = false;
  async function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    try {
      const r = await fetch("/live", { cache: "no-store", headers: { "Accept": "text/html" } });
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      // The server escaped every value; DOMParser runs no script.
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      main.replaceChildren(...doc.body.childNodes);
      stamp.textContent = "updated " + new Date().toLocaleTimeString();
      stamp.className = "ok";
    } catch (err) {
      stamp.textContent = "cannot reach the daemon (" + err.message + "); retrying";
      stamp.className = "stale";
    } finally {
      busy = false;
    }
  }
  setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);
})();
"""
