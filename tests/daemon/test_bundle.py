"""Enrolment as one file (issue 17): ``pool add-node --bundle`` and ``frenzyd enroll``, with a clear
error for a file that is not a bundle, a foreign or tampered one, a key that is not the
certificate's, an expired certificate and a bundle of another pool than the node's."""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from frenzy_client.cli import run_cli
from frenzyd.__main__ import main as frenzyd_main
from frenzyd.net import auth, bundle


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pools")
    auth.create_pool(base / "a")
    auth.create_pool(base / "b")
    return base


def _enroll(*args: str | Path) -> int:
    return frenzyd_main(["enroll", *map(str, args)])


def test_add_node_bundle_then_enroll(pools: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "ws-01.frenzy-node"
    assert run_cli(["pool", "add-node", str(pools / "a"), "ws-01", "--out", str(tmp_path / "creds"),
                    "--bundle", str(file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bundle"] == str(file)
    assert _mode(file) == 0o600
    assert auth.load_credentials(tmp_path / "creds").node_id == out["node_id"]  # --out still written
    doc = json.loads(file.read_text())
    assert set(doc["files"]) == {"ca.pem", "node.pem", "node.key", "node.json"}

    dest = tmp_path / "etc/node"
    owner = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert _enroll(file, "--dest", dest, "--owner", owner) == 0
    assert "installed node ws-01" in capsys.readouterr().out
    assert _mode(dest) == 0o700
    uid = pwd.getpwnam(owner).pw_uid
    for f in bundle.FILES:
        assert _mode(dest / f) == 0o600, f
        assert (dest / f).stat().st_uid == uid, f
    assert dest.stat().st_uid == uid
    creds = auth.load_credentials(dest)
    assert (creds.node_id, creds.pool_id) == (out["node_id"], out["pool_id"])
    assert [p.name for p in dest.parent.iterdir()] == ["node"]  # no temporary left

    # Again: the node already has credentials; another pool's bundle is refused even with --dest free.
    assert _enroll(file, "--dest", dest) == 2
    assert "already holds a node's credentials; pass --force" in capsys.readouterr().err
    other = tmp_path / "other.frenzy-node"
    assert run_cli(["pool", "add-node", str(pools / "b"), "ws-01", "--out", str(tmp_path / "cb"),
                    "--bundle", str(other)]) == 0
    assert _enroll(other, "--dest", dest) == 2
    assert "but this node belongs to pool" in capsys.readouterr().err
    assert auth.load_credentials(dest).node_id == out["node_id"]  # untouched
    assert _enroll(other, "--dest", dest, "--force") == 0
    assert auth.load_credentials(dest).pool_id == auth.pool_id_of((pools / "b/ca.pem").read_bytes())

    # add-node refuses an existing bundle file before it makes a key.
    assert run_cli(["pool", "add-node", str(pools / "a"), "ws-02", "--bundle", str(file)]) != 0
    assert "exists" in capsys.readouterr().err
    assert not (pools / "a/nodes/ws-02").exists()


def _doc(ca: bytes, cert: bytes, key: bytes) -> dict[str, object]:
    node_id, _ = auth.verify_node_cert(ca, cert)
    pool_id = auth.pool_id_of(ca)
    info = json.dumps({"node_id": node_id, "node_name": "ws-09", "pool_id": pool_id})
    return {"format": bundle.BUNDLE_FORMAT, "version": 1, "node_name": "ws-09", "node_id": node_id,
            "pool_id": pool_id, "files": {"ca.pem": ca.decode(), "node.pem": cert.decode(),
                                          "node.key": key.decode(), "node.json": info}}


def _refused(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> str:
    f = tmp_path / "bad.frenzy-node"
    f.write_bytes(data)
    assert _enroll(f, "--dest", tmp_path / "dest") == 2
    assert not (tmp_path / "dest").exists()
    return capsys.readouterr().err


def test_bad_bundles_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    now = dt.datetime.now(dt.UTC)
    ca_a, ca_a_key = auth.new_ca("a", now)
    ca_b, ca_b_key = auth.new_ca("b", now)
    key = auth.new_node_key()
    cert_a = auth.issue_node_cert(ca_a, ca_a_key, "ws-09", key, now)
    good = _doc(ca_a, cert_a, key)
    assert bundle.parse_bundle(json.dumps(good).encode()).node_name == "ws-09"

    assert "not a Frenzy node bundle (not JSON)" in _refused(tmp_path, b"\x00\x01garbage", capsys)
    assert "not a Frenzy node bundle (no \"format\"" in _refused(tmp_path, b'{"ca": 1}', capsys)
    assert _enroll(tmp_path / "missing.frenzy-node", "--dest", tmp_path / "dest") == 2
    assert "no bundle at" in capsys.readouterr().err
    files = good["files"]
    assert isinstance(files, dict)
    foreign = {**good, "files": {**files, "ca.pem": ca_b.decode()}}
    err = _refused(tmp_path, json.dumps(foreign).encode(), capsys)
    assert "does not belong to the CA in the bundle" in err
    wrong_key = {**good, "files": {**files, "node.key": auth.new_node_key().decode()}}
    err = _refused(tmp_path, json.dumps(wrong_key).encode(), capsys)
    assert "node.key is not the key of node.pem" in err
    old = now - dt.timedelta(days=auth.NODE_VALID_DAYS + 30)
    expired = _doc(ca_a, auth.issue_node_cert(ca_a, ca_a_key, "ws-09", key, old), key)
    err = _refused(tmp_path, json.dumps(expired).encode(), capsys)
    assert "expired on" in err
    assert "enrol the node again" in err
    future = _doc(ca_b, auth.issue_node_cert(ca_b, ca_b_key, "ws-09", key, now + dt.timedelta(days=3)), key)
    assert "check this machine's clock" in _refused(tmp_path, json.dumps(future).encode(), capsys)
