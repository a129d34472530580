"""``frenzy-client doctor`` in network namespaces (issue 17, Proof): it finds a broken multicast path
between two live peers and an expired certificate, and says the fix for each."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from _pool import PY, Daemon, NodeConf, env, full_mesh, make_pool, wait_until  # noqa: E402

from frenzyd.net import auth  # noqa: E402
from tests.netns import NetnsLab, skip_reason  # noqa: E402

pytestmark = [pytest.mark.netns]


def _doctor(lab: NetnsLab, host: int, config: Path) -> tuple[int, dict[str, Any]]:
    res = lab.run(host, [PY, "-m", "frenzy_client", "doctor", "--config", str(config), "--json",
                         "--mdns-seconds", "2"], env=env(), timeout=90)
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def _checks(report: dict[str, Any], area: str, status: str) -> list[str]:
    return [c["detail"] for c in report["checks"] if c["area"] == area and c["status"] == status]


def _expired_credentials(pool: Path, out: Path) -> None:
    """A node of ``pool`` whose certificate ran out yesterday (issued by the pool's own CA)."""
    key = auth.new_node_key()
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=auth.NODE_VALID_DAYS + 1)
    ca, ca_key = (pool / "ca.pem").read_bytes(), (pool / "ca.key").read_bytes()
    cert = auth.issue_node_cert(ca, ca_key, "ws-old", key, old)
    out.mkdir(mode=0o700)
    (out / "node.key").write_bytes(key)
    (out / "node.key").chmod(0o600)
    (out / "node.pem").write_bytes(cert)
    (out / "ca.pem").write_bytes((pool / "ca.pem").read_bytes())


def test_doctor_finds_broken_multicast_and_expired_certificate(tmp_path: Path) -> None:
    if (why := skip_reason()) is not None:
        if os.environ.get("FRENZY_REQUIRE_NETNS") == "1":
            pytest.fail(f"CI needs the namespace tests, but: {why}")
        pytest.skip(why)
    creds = make_pool(tmp_path / "pool", ["ws-a", "ws-b"])
    with NetnsLab(3) as lab:
        addr = [h.address for h in lab.hosts]
        daemons = []
        for i, name in enumerate(("ws-a", "ws-b")):
            conf = NodeConf(name=name, base=tmp_path / name, credentials=creds[name],
                            devices=[("T4", 1)], listen=f"{addr[i]}:7470", interfaces=["eth0"],
                            peers=[f"{addr[1 - i]}:7470"], mdns=True)
            daemons.append(Daemon(conf, spawn=lambda argv, i=i, **kw: lab.popen(i, argv, **kw)))
        try:
            for d in daemons:
                d.start()
            wait_until(lambda: full_mesh(daemons), 90, "the two daemons to form a pool")
            config_a = daemons[0].conf.config_path

            # Multicast passes: ws-b answers mDNS, the clocks agree, the certificate is good.
            code, report = _doctor(lab, 0, config_a)
            assert any("ws-b" in d and "answers mDNS" in d for d in _checks(report, "mdns", "ok")), report
            assert _checks(report, "multicast", "fail") == [], report
            assert any(d.startswith("ws-b: ") for d in _checks(report, "clock", "ok")), report
            assert any("valid until" in d for d in _checks(report, "certificate", "ok")), report
            assert code == 0, report

            # The bridge stops flooding multicast (a switch dropping mDNS): unicast still carries the
            # pool (static peers), and doctor names the peer multicast no longer reaches.
            for i in range(3):
                port = f"{lab.tag}b{i}"[-15:]
                subprocess.run(["bridge", "-n", lab.bridge_ns, "link", "set", "dev", port, "mcast_flood",
                                "off"], check=True, capture_output=True, timeout=30)
            code, report = _doctor(lab, 0, config_a)
            broken = _checks(report, "multicast", "fail")
            assert any("ws-b" in d and "multicast does not pass" in d for d in broken), report
            fix = next(c["fix"] for c in report["checks"]
                       if c["area"] == "multicast" and c["status"] == "fail")
            assert "UDP 5353" in fix
            assert code == 1
            assert report["ok"] is False

            # An expired certificate, issued by this pool's CA, on a node whose daemon cannot start.
            _expired_credentials(tmp_path / "pool", tmp_path / "old-creds")
            old = NodeConf(name="ws-old", base=tmp_path / "ws-old", credentials=tmp_path / "old-creds",
                           devices=[("T4", 1)], listen=f"{addr[2]}:7470", interfaces=["eth0"],
                           peers=[f"{addr[0]}:7470"], web="127.0.0.1:7499")
            code, report = _doctor(lab, 2, old.write())
            expired = [c for c in report["checks"] if c["area"] == "certificate" and c["status"] == "fail"]
            assert len(expired) == 1, report
            assert "expired on" in expired[0]["detail"]
            assert "frenzyd enroll" in expired[0]["fix"]
            assert _checks(report, "daemon", "fail"), report  # nothing listens on its web port
            assert any(addr[0] in d for d in _checks(report, "ports", "ok")), report  # ws-a still reachable
            assert code == 1
        finally:
            for d in daemons:
                d.stop()
