"""/metrics follows Prometheus' conventions and the README's metric names are the ones exported.

Parsed with ``prometheus_client.parser.text_string_to_metric_families`` (prometheus_client is a
runtime dependency of frenzyd)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from frenzyd.api.metrics import AUTH_REFUSALS, MESSAGES_DROPPED, MetricsRegistry
from frenzyd.daemon import Daemon
from frenzyd.net import auth

from .conftest import fast_config

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^frenzy_[a-z][a-z0-9_]*$")


def check_conventions(text: str) -> dict[str, str]:
    """Every family is ``frenzy_*`` in snake case; a counter's samples are ``NAME_total`` and its family
    name does not end in ``_total`` (the suffix is added once).  Returns family name -> type."""
    types = {}
    for fam in text_string_to_metric_families(text):
        assert NAME.match(fam.name), fam.name
        types[fam.name] = fam.type
        if fam.type == "counter":
            assert not fam.name.endswith("_total"), fam.name
            assert {s.name for s in fam.samples} <= {fam.name + "_total"}, (fam.name, fam.samples)
        else:
            assert not fam.name.endswith("_total"), f"{fam.name} is a {fam.type} named like a counter"
    return types


def test_one_family_per_counter_and_conventions() -> None:
    m = MetricsRegistry()
    m.refuse("unknown_ca")
    m.drop("oversized")
    m.add_count_source(AUTH_REFUSALS, "x", "reason", lambda: {"unknown_ca": 2, "expired": 1})
    m.add_count_source(MESSAGES_DROPPED, "x", "reason", lambda: {"version": 4})
    text = m.render().decode()
    check_conventions(text)
    samples = {(s.name, tuple(s.labels.items())): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    # the daemon's own tallies and the network's counting dicts land in the same family
    assert samples[("frenzy_auth_refusals_total", (("reason", "unknown_ca"),))] == 3
    assert samples[("frenzy_auth_refusals_total", (("reason", "expired"),))] == 1
    assert samples[("frenzy_peer_messages_dropped_total", (("reason", "oversized"),))] == 1
    assert samples[("frenzy_peer_messages_dropped_total", (("reason", "version"),))] == 4
    assert text.count("# TYPE frenzy_auth_refusals_total counter") == 1  # one family, not two names
    with pytest.raises(ValueError, match="without _total"):
        m.add_count_source("frenzy_things_total", "x", "reason", dict)
    with pytest.raises(ValueError, match="labelled"):
        m.add_count_source(AUTH_REFUSALS, "x", "kind", dict)


async def test_daemon_metrics_carry_the_readme_names(
    tmp_path: Path, pool_creds: dict[str, auth.Credentials]
) -> None:
    """A running daemon's /metrics: conventions hold, a refusal the network counts shows under the name
    the README gives, and every ``frenzy_*_total`` the README names is an exported counter."""
    d, stop = Daemon(fast_config(tmp_path, pool_creds["n3"])), asyncio.Event()
    task = asyncio.create_task(d.run(stop))
    try:
        await asyncio.wait_for(d.ready.wait(), 30)
        assert d.net is not None
        assert d.web is not None
        d.net.auth_refusals["unknown_ca"] += 1
        d.net.send_failures["timeout"] += 2
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{d.web.port}/metrics") as r:
            assert r.status == 200
            text = await r.text()
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    types = check_conventions(text)
    values = {(s.name, tuple(s.labels.items())): s.value
              for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert values[("frenzy_auth_refusals_total", (("reason", "unknown_ca"),))] == 1
    assert values[("frenzy_peer_send_failures_total", (("reason", "timeout"),))] == 2
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"\b(frenzy_[a-z0-9_]+)_total\b", readme))
    assert "frenzy_auth_refusals" in named
    missing = {n for n in named if types.get(n) != "counter"}
    assert not missing, f"the README names counters /metrics does not export: {sorted(missing)}"
