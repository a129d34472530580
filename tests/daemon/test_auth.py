"""Pool trust: CA and node certificates, stable node ids, signed orders, and every refusal's reason."""

from __future__ import annotations

import datetime as dt
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frenzyd.errors import AuthError, ConfigError
from frenzyd.net import auth, wire

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, auth.Credentials]:
    d = tmp_path_factory.mktemp("pools")
    auth.create_pool(d / "lab")
    auth.create_pool(d / "other")
    return {
        "a": auth.load_credentials(auth.add_node(d / "lab", "ws-a").out_dir),
        "b": auth.load_credentials(auth.add_node(d / "lab", "ws-b", d / "b-out").out_dir),
        "x": auth.load_credentials(auth.add_node(d / "other", "ws-a").out_dir),
    }


def test_pool_and_node_files_and_permissions(tmp_path: Path) -> None:
    info = auth.create_pool(tmp_path / "pool")
    assert len(info.pool_id) == 64
    assert len(f"pool={info.pool_id}") < 255
    assert stat.S_IMODE((tmp_path / "pool" / "ca.key").stat().st_mode) == 0o600
    node = auth.add_node(tmp_path / "pool", "ws-01", tmp_path / "node")
    assert stat.S_IMODE((tmp_path / "node" / "node.key").stat().st_mode) == 0o600
    assert not (tmp_path / "node" / "ca.key").exists()
    meta = json.loads((tmp_path / "node" / "node.json").read_text())
    assert meta == {"node_id": node.node_id, "node_name": "ws-01", "pool_id": info.pool_id}
    creds = auth.load_credentials(tmp_path / "node")
    assert (creds.node_id, creds.node_name, creds.pool_id) == (node.node_id, "ws-01", info.pool_id)
    assert creds.node_id == auth.load_credentials(tmp_path / "node").node_id  # stable across loads


def test_refuses_to_overwrite_and_explains(tmp_path: Path) -> None:
    auth.create_pool(tmp_path / "p")
    with pytest.raises(ConfigError, match="already holds a pool CA"):
        auth.create_pool(tmp_path / "p")
    auth.add_node(tmp_path / "p", "n1", tmp_path / "n1")
    with pytest.raises(ConfigError, match="already holds a node key"):
        auth.add_node(tmp_path / "p", "n1", tmp_path / "n1")
    with pytest.raises(ConfigError, match="pool init"):
        auth.add_node(tmp_path / "nothing", "n2")
    with pytest.raises(ConfigError, match="not allowed"):
        auth.add_node(tmp_path / "p", "bad name/../x")
    (tmp_path / "n1" / "node.key").unlink()
    with pytest.raises(ConfigError, match="add-node"):
        auth.load_credentials(tmp_path / "n1")


def test_key_and_certificate_must_match(tmp_path: Path) -> None:
    auth.create_pool(tmp_path / "p")
    auth.add_node(tmp_path / "p", "n1", tmp_path / "n1")
    auth.add_node(tmp_path / "p", "n2", tmp_path / "n2")
    (tmp_path / "n1" / "node.key").chmod(0o600)
    (tmp_path / "n1" / "node.key").write_bytes((tmp_path / "n2" / "node.key").read_bytes())
    with pytest.raises(AuthError) as info:
        auth.load_credentials(tmp_path / "n1")
    assert info.value.reason == "bad_certificate"


def test_node_ids_differ_and_same_name_in_other_pool_is_another_node(
    pools: dict[str, auth.Credentials],
) -> None:
    a, b, x = pools["a"], pools["b"], pools["x"]
    assert len({a.node_id, b.node_id, x.node_id}) == 3
    assert a.pool_id == b.pool_id != x.pool_id
    assert auth.verify_node_cert(a.ca_pem, b.cert_pem, now=NOW) == (b.node_id, "ws-b")


def test_certificate_of_another_pool_is_untrusted(pools: dict[str, auth.Credentials]) -> None:
    a, x = pools["a"], pools["x"]
    with pytest.raises(AuthError) as info:
        auth.verify_node_cert(a.ca_pem, x.cert_pem)
    assert info.value.reason == "untrusted_certificate"
    with pytest.raises(AuthError) as info:
        auth.peer_identity_from_der(a.ca_pem, b"")
    assert info.value.reason == "bad_certificate"
    with pytest.raises(AuthError) as info:
        auth.peer_identity_from_der(a.ca_pem, b"\x30\x03garbage")
    assert info.value.reason == "bad_certificate"


def test_forged_issuer_name_is_caught_by_the_signature(pools: dict[str, auth.Credentials]) -> None:
    a = pools["a"]
    # An attacker's CA with the very same subject as the lab CA (names are public).
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    lab_ca = x509.load_pem_x509_certificate(a.ca_pem)
    evil_key = Ed25519PrivateKey.generate()
    evil_ca = (
        x509.CertificateBuilder()
        .subject_name(lab_ca.subject)
        .issuer_name(lab_ca.subject)
        .public_key(evil_key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(evil_key, None)
    )
    evil_key_pem = evil_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    node_key = auth.new_node_key()
    forged = auth.issue_node_cert(evil_ca.public_bytes(Encoding.PEM), evil_key_pem, "ws-a", node_key, NOW)
    with pytest.raises(AuthError) as info:
        auth.verify_node_cert(a.ca_pem, forged)
    assert info.value.reason == "untrusted_certificate"


def test_expired_certificate(pools: dict[str, auth.Credentials]) -> None:
    a = pools["a"]
    with pytest.raises(AuthError) as info:
        auth.verify_node_cert(a.ca_pem, a.cert_pem, now=NOW + dt.timedelta(days=20 * 365))
    assert info.value.reason == "expired_certificate"


def test_ca_certificate_is_not_a_node_certificate(pools: dict[str, auth.Credentials]) -> None:
    a = pools["a"]
    with pytest.raises(AuthError) as info:
        auth.verify_node_cert(a.ca_pem, a.ca_pem)
    assert info.value.reason == "bad_certificate"


def test_sign_verify_exact_bytes(pools: dict[str, auth.Credentials]) -> None:
    a, b, x = pools["a"], pools["b"], pools["x"]
    data = wire.encode("ok", {"detail": "launch"})
    sig = auth.sign(a, data)
    assert auth.verify_signed(a.ca_pem, a.cert_pem, data, sig, now=NOW) == a.node_id
    for bad_data, bad_cert, bad_sig, reason in [
        (data + b"\x00", a.cert_pem, sig, "bad_signature"),
        (data, b.cert_pem, sig, "bad_signature"),
        (data, a.cert_pem, sig[:-1] + bytes([sig[-1] ^ 1]), "bad_signature"),
        (data, x.cert_pem, auth.sign(x, data), "untrusted_certificate"),
    ]:
        with pytest.raises(AuthError) as info:
            auth.verify_signed(a.ca_pem, bad_cert, bad_data, bad_sig)
        assert info.value.reason == reason


def test_sealed_order_round_trip_and_refusals(pools: dict[str, auth.Credentials]) -> None:
    a, b = pools["a"], pools["b"]
    env = auth.seal_order(a, "ok", {"detail": "start", "term": 7})
    msg = wire.decode(wire.encode(wire.SIGNED_KIND, env))
    order = auth.open_order(a.ca_pem, msg, sender_id=a.node_id, now=NOW)
    assert (order.signer_id, order.signer_name) == (a.node_id, "ws-a")
    assert order.message.body == {"detail": "start", "term": 7}
    with pytest.raises(AuthError) as info:  # relayed by b: refused
        auth.open_order(a.ca_pem, msg, sender_id=b.node_id)
    assert info.value.reason == "signer_mismatch"
    # Changing the term in the frame (re-serialised) breaks the signature.
    tampered = dict(env, frame=wire.encode("ok", {"detail": "start", "term": 8}))
    with pytest.raises(AuthError) as info:
        auth.open_order(a.ca_pem, wire.Message(1, wire.SIGNED_KIND, tampered))
    assert info.value.reason == "bad_signature"
    # An envelope in an envelope is refused; a signed garbage frame is a wire rejection.
    nested = {"frame": wire.encode(wire.SIGNED_KIND, env), "cert": a.cert_pem}
    nested["sig"] = auth.sign(a, nested["frame"])
    with pytest.raises(wire.FrameRejected):
        auth.open_order(a.ca_pem, wire.Message(1, wire.SIGNED_KIND, nested))
    junk = {"frame": b"\xc1junk", "cert": a.cert_pem, "sig": auth.sign(a, b"\xc1junk")}
    with pytest.raises(wire.FrameRejected) as rej:
        auth.open_order(a.ca_pem, wire.Message(1, wire.SIGNED_KIND, junk))
    assert rej.value.reason == "malformed"


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=80))
def test_random_certificates_and_signatures_only_raise_auth_error(cert: bytes, sig: bytes) -> None:
    ca = _CA_PEM[0]
    reason = "accepted"
    try:
        auth.verify_signed(ca, cert, b"data", sig)
    except AuthError as exc:
        reason = exc.reason
    assert reason in auth.AUTH_REASONS


_CA_PEM: list[bytes] = [auth.new_ca("prop", NOW)[0]]


def test_cli_pool_init_and_add_node_json(tmp_path: Path, root: Path) -> None:
    env_py = [sys.executable, "-m", "frenzy_client"]
    run = subprocess.run(
        [*env_py, "pool", "init", str(tmp_path / "pool"), "--json"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    pool = json.loads(run.stdout)
    run = subprocess.run(
        [
            *env_py,
            "pool",
            "add-node",
            str(tmp_path / "pool"),
            "ws-01",
            "--out",
            str(tmp_path / "n"),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    node = json.loads(run.stdout)
    assert node["pool_id"] == pool["pool_id"]
    assert auth.load_credentials(Path(node["credentials"])).node_id == node["node_id"]
    again = subprocess.run(
        [*env_py, "pool", "init", str(tmp_path / "pool")],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    )
    assert again.returncode == 1
    assert "already holds a pool CA" in again.stderr
    assert "Traceback" not in again.stderr
