"""Pool trust: the pool CA, node certificates, node ids, and signing/verifying orders (pure over bytes).

The pool CA and every node key are Ed25519.  A node's id is derived from its
public key (stable across restarts and re-issued certificates); the pool id is
the SHA-256 fingerprint of the CA certificate (what zeroconf TXT records carry).
Signatures cover the exact bytes sent (never a re-serialisation).  Every failed
check raises :class:`~frenzyd.errors.AuthError` whose ``reason`` is one of
``AUTH_REASONS``, so callers count refusals by reason.

This is the only module that imports ``cryptography``.  Everything is plain
bytes in, values out, except three small functions at the end that read and
write a credential directory (``create_pool``, ``add_node``,
``load_credentials``).  ``cryptography.x509`` is imported inside the functions
that need it: it imports ``email.utils``, which imports ``socket``, and the pure
core must not carry ``socket`` (tests/test_core_purity.py) — no I/O happens here.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
import re
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from frenzyd.errors import AuthError, ConfigError, WireError
from frenzyd.net import wire

if TYPE_CHECKING:
    from cryptography import x509

AUTH_REASONS: Final = (
    "bad_certificate",  # not parseable, or not an Ed25519 node certificate
    "untrusted_certificate",  # not signed by this pool's CA (another pool)
    "expired_certificate",  # outside its validity period
    "bad_signature",  # the signature does not match the bytes
    "signer_mismatch",  # signed by a node other than the one that sent it
    "revoked_certificate",  # named by the pool CA's revocation list (frenzyd.net.revocation)
    "forged_revocation",  # a revocation list this pool's CA did not sign
)

CA_FILE: Final = "ca.pem"
CA_KEY_FILE: Final = "ca.key"
NODE_CERT_FILE: Final = "node.pem"
NODE_KEY_FILE: Final = "node.key"
NODE_INFO_FILE: Final = "node.json"
ISSUED_FILE: Final = "issued.jsonl"
"""In the pool directory: one JSON line per certificate :func:`add_node` issued (name, node id, serial,
fingerprint, dates), so ``pool remove-node NAME`` can name every certificate of a node."""
CA_VALID_DAYS: Final = 3650 * 2
NODE_VALID_DAYS: Final = 730
"""A node certificate's default lifetime (2 years; ``pool add-node --days``).  ``pool renew-node``
re-issues it for the same key (the node keeps its id); ``pool remove-node`` revokes it before then."""
MAX_NODE_VALID_DAYS: Final = 3650
NODE_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


# --- value types ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolInfo:
    """A pool created by :func:`create_pool`."""

    pool_dir: Path
    pool_id: str
    ca_cert: Path


@dataclass(frozen=True)
class NodeIdentity:
    """A node enrolled by :func:`add_node`; ``out_dir`` is usable as ``[pool] credentials``."""

    node_id: str
    node_name: str
    pool_id: str
    out_dir: Path


@dataclass(frozen=True)
class Credentials:
    """A node's loaded identity: ids, file paths (for TLS) and the PEM bytes (for signing)."""

    node_id: str
    node_name: str
    pool_id: str
    ca_cert: Path
    node_cert: Path
    node_key: Path
    ca_pem: bytes = field(repr=False)
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)


@dataclass(frozen=True)
class SignedOrder:
    """An order whose signature and signer certificate checked out."""

    signer_id: str
    signer_name: str
    message: wire.Message


# --- pure helpers -------------------------------------------------------------------------


def _x509() -> Any:
    from cryptography import x509 as mod

    return mod


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a valid node name, else raise ConfigError saying what is allowed."""
    if not NODE_NAME_RE.match(name):
        raise ConfigError(
            f"node name {name!r} is not allowed: use 1-63 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (e.g. 'ws-01')"
        )
    return name


def node_id_from_public_key(raw: bytes) -> str:
    """The node id: the first 16 bytes of SHA-256 over the raw Ed25519 public key, as 32 hex digits."""
    return hashlib.sha256(b"frenzy-node-id\0" + raw).hexdigest()[:32]


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _parse_errors() -> tuple[type[Exception], ...]:
    """What ``cryptography`` raises for a malformed certificate: at load, or later, when a lazily
    parsed field (issuer, version, extensions, key) is first read."""
    x = _x509()
    return (ValueError, TypeError, UnsupportedAlgorithm, x.InvalidVersion, x.DuplicateExtension,
            x.UnsupportedGeneralNameType)


def _load_cert(pem_or_der: bytes) -> x509.Certificate:
    x = _x509()
    try:
        with warnings.catch_warnings():
            # A non-positive serial number only warns (CryptographyDeprecationWarning): it is still
            # refused below unless the pool CA signed it, and a peer must not make us log per request.
            warnings.simplefilter("ignore")
            if pem_or_der.lstrip().startswith(b"-----BEGIN"):
                cert: x509.Certificate = x.load_pem_x509_certificate(pem_or_der)
            else:
                cert = x.load_der_x509_certificate(pem_or_der)
    except _parse_errors() as exc:
        raise AuthError("bad_certificate", f"cannot parse certificate: {str(exc)[:200]}") from exc
    return cert


def pool_id_of(ca_pem: bytes) -> str:
    """The pool id: SHA-256 of the CA certificate's DER encoding, 64 hex digits."""
    from cryptography.hazmat.primitives.serialization import Encoding

    return hashlib.sha256(_load_cert(ca_pem).public_bytes(Encoding.DER)).hexdigest()


def _name(common_name: str, org: str) -> x509.Name:
    x = _x509()
    from cryptography.x509.oid import NameOID

    name: x509.Name = x.Name(
        [x.NameAttribute(NameOID.ORGANIZATION_NAME, org), x.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )
    return name


def new_ca(pool_name: str, now: dt.datetime) -> tuple[bytes, bytes]:
    """Create a pool CA; return ``(ca_cert_pem, ca_key_pem)``.  ``now`` is timezone-aware UTC."""
    x = _x509()
    key = Ed25519PrivateKey.generate()
    subject = _name(f"Frenzy pool CA {pool_name}", "frenzy-pool")
    cert = (
        x.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_VALID_DAYS))
        .add_extension(x.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, None)
    )
    return _pem(cert), _key_pem(key)


def new_node_key() -> bytes:
    """A fresh Ed25519 node key as unencrypted PKCS#8 PEM."""
    return _key_pem(Ed25519PrivateKey.generate())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@functools.lru_cache(maxsize=16)
def _load_key(key_pem: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise AuthError("bad_certificate", f"cannot load the private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise AuthError("bad_certificate", "the private key is not Ed25519")
    return key


def issue_node_cert(
    ca_pem: bytes, ca_key_pem: bytes, node_name: str, node_key_pem: bytes, now: dt.datetime,
    *, valid_days: int = NODE_VALID_DAYS,
) -> bytes:
    """Sign a certificate for ``node_name``'s key with the pool CA, valid ``valid_days``; return its PEM.

    The certificate is good for both TLS roles (server and client auth) and for
    signing orders.  The node id is not stored in it: it is derived from the key.
    """
    return _issue(ca_pem, ca_key_pem, node_name, _load_key(node_key_pem).public_key(), now,
                  valid_days=valid_days)


def check_valid_days(days: int) -> int:
    """``days`` if it is a node certificate lifetime this pool issues, else ConfigError."""
    if not 1 <= days <= MAX_NODE_VALID_DAYS:
        raise ConfigError(f"--days {days}: a node certificate lasts 1 to {MAX_NODE_VALID_DAYS} days "
                          f"(default {NODE_VALID_DAYS}); renew it before then with 'pool renew-node'")
    return days


def _issue(ca_pem: bytes, ca_key_pem: bytes, node_name: str, node_pub: Ed25519PublicKey, now: dt.datetime,
           *, valid_days: int) -> bytes:
    x = _x509()
    from cryptography.x509.oid import ExtendedKeyUsageOID

    validate_node_name(node_name)
    check_valid_days(valid_days)
    ca = _load_cert(ca_pem)
    ca_key = _load_key(ca_key_pem)
    cert = (
        x.CertificateBuilder()
        .subject_name(_name(node_name, "frenzy-node"))
        .issuer_name(ca.subject)
        .public_key(node_pub)
        .serial_number(x.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=valid_days))
        .add_extension(x.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, None)
    )
    return _pem(cert)


def verify_node_cert(
    ca_pem: bytes, cert_pem_or_der: bytes, *, now: dt.datetime | None = None
) -> tuple[str, str]:
    """Check that a node certificate was issued by this pool's CA; return ``(node_id, node_name)``.

    Checks issuer name, the CA's signature over the certificate, that it is not a CA
    certificate, that its key is Ed25519, and (when ``now`` is given) its validity
    period.  Raises AuthError(``bad_certificate`` / ``untrusted_certificate`` /
    ``expired_certificate``).  The time-independent checks are memoised per
    (CA, certificate) — a peer presents the same certificate on every request.
    """
    try:
        node_id, name, not_before, not_after = _checked_cert(ca_pem, cert_pem_or_der)
    except _parse_errors() as exc:  # a field that only fails when read (issuer, version, extensions)
        raise AuthError("bad_certificate", f"malformed certificate: {str(exc)[:200]}") from exc
    if now is not None and not (not_before <= now <= not_after):
        raise AuthError("expired_certificate", f"valid {not_before:%Y-%m-%d} to {not_after:%Y-%m-%d}")
    return node_id, name


@functools.lru_cache(maxsize=1024)
def _checked_cert(ca_pem: bytes, cert_pem_or_der: bytes) -> tuple[str, str, dt.datetime, dt.datetime]:
    from cryptography.x509.oid import NameOID

    ca = _load_cert(ca_pem)
    cert = _load_cert(cert_pem_or_der)
    ca_pub = ca.public_key()
    if not isinstance(ca_pub, Ed25519PublicKey):
        raise AuthError("bad_certificate", "the pool CA key is not Ed25519")
    if cert.issuer != ca.subject:
        raise AuthError("untrusted_certificate", "issued by another CA (a node of another pool?)")
    try:
        ca_pub.verify(cert.signature, cert.tbs_certificate_bytes)
    except InvalidSignature as exc:
        raise AuthError("untrusted_certificate", "not signed by this pool's CA") from exc
    node_pub = cert.public_key()
    if not isinstance(node_pub, Ed25519PublicKey):
        raise AuthError("bad_certificate", "the node key is not Ed25519")
    x = _x509()
    try:
        bc = cert.extensions.get_extension_for_class(x.BasicConstraints).value
    except x.ExtensionNotFound as exc:
        raise AuthError("bad_certificate", "no basicConstraints extension") from exc
    if bc.ca:
        raise AuthError("bad_certificate", "a CA certificate cannot be a node certificate")
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    name = str(names[0].value) if names else ""
    node_id = node_id_from_public_key(_raw_public(node_pub))
    return node_id, name, cert.not_valid_before_utc, cert.not_valid_after_utc


@functools.lru_cache(maxsize=1024)
def _cert_public_key(cert_pem_or_der: bytes) -> Ed25519PublicKey:
    try:
        pub = _load_cert(cert_pem_or_der).public_key()
    except _parse_errors() as exc:
        raise AuthError("bad_certificate", f"malformed certificate key: {str(exc)[:200]}") from exc
    if not isinstance(pub, Ed25519PublicKey):
        raise AuthError("bad_certificate", "the node key is not Ed25519")
    return pub


def certificate_dates(cert_pem_or_der: bytes) -> tuple[dt.datetime, dt.datetime]:
    """``(not_before, not_after)`` of a certificate, timezone-aware UTC; AuthError if unparseable."""
    try:
        cert = _load_cert(cert_pem_or_der)
        dates = cert.not_valid_before_utc, cert.not_valid_after_utc
    except _parse_errors() as exc:
        raise AuthError("bad_certificate", f"malformed certificate: {str(exc)[:200]}") from exc
    return dates


def key_matches_cert(key_pem: bytes, cert_pem_or_der: bytes) -> bool:
    """Whether ``key_pem`` is the private key of the certificate (AuthError if either is unreadable)."""
    return _raw_public(_load_key(key_pem).public_key()) == _raw_public(_cert_public_key(cert_pem_or_der))


def certificate_fingerprint(cert_pem_or_der: bytes) -> str:
    """SHA-256 of the certificate's DER encoding, 64 hex digits (what a revocation list names)."""
    from cryptography.hazmat.primitives.serialization import Encoding

    return hashlib.sha256(_load_cert(cert_pem_or_der).public_bytes(Encoding.DER)).hexdigest()


def certificate_serial(cert_pem_or_der: bytes) -> str:
    """The certificate's serial number in lower-case hex (no leading zeros)."""
    return format(_load_cert(cert_pem_or_der).serial_number, "x")


def ca_sign(ca_pem: bytes, ca_key_pem: bytes, data: bytes) -> bytes:
    """The pool CA's Ed25519 signature over exactly ``data``; ConfigError when the key is not the CA's."""
    key = _load_key(ca_key_pem)
    pub = _load_cert(ca_pem).public_key()
    if not isinstance(pub, Ed25519PublicKey) or _raw_public(pub) != _raw_public(key.public_key()):
        raise ConfigError("ca.key is not the key of ca.pem: use the pool directory made by 'pool init'")
    return key.sign(data)


def verify_ca_signature(ca_pem: bytes, data: bytes, sig: bytes) -> None:
    """Raise AuthError(``forged_revocation``) unless ``sig`` is the pool CA's signature over ``data``."""
    pub = _load_cert(ca_pem).public_key()
    if not isinstance(pub, Ed25519PublicKey):
        raise AuthError("bad_certificate", "the pool CA key is not Ed25519")
    try:
        pub.verify(sig, data)
    except InvalidSignature as exc:
        raise AuthError("forged_revocation", "not signed by this pool's CA") from exc


def peer_identity_from_der(ca_pem: bytes, der: bytes, *, now: dt.datetime | None = None) -> tuple[str, str]:
    """``(node_id, node_name)`` of a TLS peer from its DER certificate; AuthError if not of this pool."""
    if not der:
        raise AuthError("bad_certificate", "the peer presented no certificate")
    return verify_node_cert(ca_pem, der, now=now)


def sign(creds: Credentials, data: bytes) -> bytes:
    """Ed25519 signature of ``creds``' node key over exactly ``data`` (64 bytes)."""
    return _load_key(creds.key_pem).sign(data)


def verify_signed(
    ca_pem: bytes, cert_pem: bytes, data: bytes, sig: bytes, *, now: dt.datetime | None = None
) -> str:
    """Verify ``sig`` over ``data`` by the holder of ``cert_pem`` (a node of this pool); return its id.

    Raises AuthError(``bad_signature`` or a certificate reason) — never returns a falsy value.
    """
    node_id, _ = verify_node_cert(ca_pem, cert_pem, now=now)
    pub = _cert_public_key(cert_pem)
    try:
        pub.verify(sig, data)
    except InvalidSignature as exc:
        raise AuthError("bad_signature", "the signature does not match the order's bytes") from exc
    return node_id


def seal_order(creds: Credentials, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """Encode ``kind``/``body`` and sign the exact frame bytes; return a ``signed`` envelope body.

    Send it as ``wire.encode(wire.SIGNED_KIND, envelope)``.  Orders that start or
    stop processes carry the coordinator's ``term`` in ``body``; the receiver
    checks it against its election state after :func:`open_order`.
    """
    frame = wire.encode(kind, body)
    return {"frame": frame, "cert": creds.cert_pem, "sig": sign(creds, frame)}


def open_order(
    ca_pem: bytes,
    envelope: wire.Message,
    *,
    sender_id: str | None = None,
    now: dt.datetime | None = None,
    max_bytes: int = wire.DEFAULT_MAX,
    caps: Mapping[str, int] | None = None,
) -> SignedOrder:
    """Verify a ``signed`` envelope and decode the inner frame it signs.

    ``sender_id`` (the TLS peer's node id), when given, must be the signer: a node
    cannot relay another node's order.  Raises AuthError or wire.FrameRejected.
    """
    if envelope.kind != wire.SIGNED_KIND:
        raise wire.FrameRejected("schema", f"expected a {wire.SIGNED_KIND!r} envelope, got {envelope.kind!r}")
    body = envelope.body
    signer = verify_signed(ca_pem, body["cert"], body["frame"], body["sig"], now=now)
    if sender_id is not None and signer != sender_id:
        raise AuthError("signer_mismatch", f"order signed by {signer[:12]} but sent by {sender_id[:12]}")
    inner = wire.decode(body["frame"], max_bytes=max_bytes, caps=caps)
    if inner.kind == wire.SIGNED_KIND:
        raise wire.FrameRejected("schema", "a signed envelope cannot contain another envelope")
    _, name = verify_node_cert(ca_pem, body["cert"])
    return SignedOrder(signer_id=signer, signer_name=name, message=inner)


# --- the credential directory (the only file I/O here) --------------------------------------


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_pool(pool_dir: Path, *, name: str | None = None) -> PoolInfo:
    """Create a new pool CA in ``pool_dir`` (``ca.pem``, and ``ca.key`` readable by the owner only).

    Refuses to overwrite an existing pool.  Keep ``ca.key`` off the peers: it is only
    needed to enrol nodes.
    """
    pool_dir = Path(pool_dir)
    if (pool_dir / CA_KEY_FILE).exists() or (pool_dir / CA_FILE).exists():
        raise ConfigError(f"{pool_dir} already holds a pool CA; choose an empty directory for a new pool")
    pool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert_pem, key_pem = new_ca(name or pool_dir.resolve().name or "pool", _utcnow())
    _write_private(pool_dir / CA_KEY_FILE, key_pem)
    (pool_dir / CA_FILE).write_bytes(cert_pem)
    (pool_dir / "nodes").mkdir(exist_ok=True, mode=0o700)
    return PoolInfo(pool_dir=pool_dir, pool_id=pool_id_of(cert_pem), ca_cert=pool_dir / CA_FILE)


def add_node(pool_dir: Path, name: str, out_dir: Path | None = None, *,
             valid_days: int = NODE_VALID_DAYS) -> NodeIdentity:
    """Enrol node ``name``: write ``ca.pem``, ``node.pem``, ``node.key`` (0600), ``node.json`` to ``out_dir``.

    ``out_dir`` defaults to ``pool_dir/nodes/NAME``.  Refuses to overwrite an existing
    node key (a node keeps its id by keeping its key).
    """
    validate_node_name(name)
    pool_dir = Path(pool_dir)
    try:
        ca_pem = (pool_dir / CA_FILE).read_bytes()
        ca_key_pem = (pool_dir / CA_KEY_FILE).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{pool_dir} is not a pool directory (no {exc.filename}); create one with "
            f"'frenzy-client pool init {pool_dir}'"
        ) from exc
    out = Path(out_dir) if out_dir is not None else pool_dir / "nodes" / name
    if (out / NODE_KEY_FILE).exists():
        raise ConfigError(f"{out} already holds a node key; choose another --out directory")
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_pem = new_node_key()
    cert_pem = issue_node_cert(ca_pem, ca_key_pem, name, key_pem, _utcnow(), valid_days=valid_days)
    node_id, _ = verify_node_cert(ca_pem, cert_pem)
    pool_id = pool_id_of(ca_pem)
    _write_private(out / NODE_KEY_FILE, key_pem)
    (out / NODE_CERT_FILE).write_bytes(cert_pem)
    (out / CA_FILE).write_bytes(ca_pem)
    info = {"node_id": node_id, "node_name": name, "pool_id": pool_id}
    (out / NODE_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
    _record_issued(pool_dir, name, node_id, cert_pem)
    return NodeIdentity(node_id=node_id, node_name=name, pool_id=pool_id, out_dir=out)


@dataclass(frozen=True)
class RenewedCert:
    """A certificate :func:`renew_node` issued: for the same key, so the same node id."""

    node_id: str
    node_name: str
    path: Path
    not_after: dt.datetime


def renew_node(pool_dir: Path, node: Path, *, out: Path | None = None,
               valid_days: int = NODE_VALID_DAYS) -> RenewedCert:
    """Issue a new certificate for the key of the node certificate ``node`` (a ``node.pem``, or the
    credentials directory holding it; expired is fine, another pool's is not) and write it to ``out``
    (default: in place of the old one, same mode).  Only the public key is needed: the node's private
    key never leaves the node.  The daemon reads its certificate at start: restart it after copying."""
    pool_dir = Path(pool_dir)
    node = Path(node)
    old_path = node / NODE_CERT_FILE if node.is_dir() else node
    try:
        ca_pem = (pool_dir / CA_FILE).read_bytes()
        ca_key_pem = (pool_dir / CA_KEY_FILE).read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(f"{pool_dir} is not a pool directory with its CA key (no {exc.filename})") from exc
    try:
        old = old_path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the node certificate {old_path}: {exc.strerror}") from exc
    node_id, name = verify_node_cert(ca_pem, old)  # no date check: an expired certificate is renewed
    cert_pem = _issue(ca_pem, ca_key_pem, name, _cert_public_key(old), _utcnow(), valid_days=valid_days)
    dest = Path(out) if out is not None else old_path
    mode = old_path.stat().st_mode & 0o777 if dest == old_path else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(cert_pem)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _record_issued(pool_dir, name, node_id, cert_pem)
    return RenewedCert(node_id, name, dest, certificate_dates(cert_pem)[1])


def _record_issued(pool_dir: Path, name: str, node_id: str, cert_pem: bytes) -> None:
    not_before, not_after = certificate_dates(cert_pem)
    line = {"name": name, "node_id": node_id, "serial": certificate_serial(cert_pem),
            "fingerprint": certificate_fingerprint(cert_pem), "not_before": not_before.isoformat(),
            "not_after": not_after.isoformat()}
    fd = os.open(pool_dir / ISSUED_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(json.dumps(line) + "\n")


def issued_certificates(pool_dir: Path) -> list[dict[str, str]]:
    """What :func:`add_node` recorded in ``pool_dir/issued.jsonl`` (oldest first; unreadable lines skipped),
    plus the certificates of ``pool_dir/nodes/*/node.pem`` (enrolments from before the record)."""
    pool_dir = Path(pool_dir)
    out: list[dict[str, str]] = []
    seen: set[str] = set()
    try:
        lines = (pool_dir / ISSUED_FILE).read_text().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and all(isinstance(item.get(k), str) for k in ("name", "node_id")):
            out.append({k: str(v) for k, v in item.items()})
            seen.add(str(item.get("fingerprint")))
    for cert in sorted((pool_dir / "nodes").glob(f"*/{NODE_CERT_FILE}")):
        try:
            pem = cert.read_bytes()
            node_id, name = verify_node_cert((pool_dir / CA_FILE).read_bytes(), pem)
            fp = certificate_fingerprint(pem)
        except (OSError, AuthError):
            continue
        if fp not in seen:
            out.append({"name": name, "node_id": node_id, "serial": certificate_serial(pem),
                        "fingerprint": fp})
    return out


def load_credentials(cred_dir: Path) -> Credentials:
    """Load and check a directory written by :func:`add_node` (CA, certificate and matching key).

    Raises ConfigError for missing files and AuthError when the certificate is not
    from the CA or the key does not match it.
    """
    cred_dir = Path(cred_dir)
    paths = {f: cred_dir / f for f in (CA_FILE, NODE_CERT_FILE, NODE_KEY_FILE)}
    data: dict[str, bytes] = {}
    for f, p in paths.items():
        try:
            data[f] = p.read_bytes()
        except FileNotFoundError as exc:
            raise ConfigError(
                f"node credentials incomplete: {p} is missing; create them with "
                f"'frenzy-client pool add-node POOL_DIR NAME --out {cred_dir}'"
            ) from exc
        except PermissionError as exc:
            raise ConfigError(f"cannot read {p}: run frenzyd as the user that owns it") from exc
    ca_pem, cert_pem, key_pem = data[CA_FILE], data[NODE_CERT_FILE], data[NODE_KEY_FILE]
    node_id, name = verify_node_cert(ca_pem, cert_pem, now=_utcnow())
    key = _load_key(key_pem)
    if node_id != node_id_from_public_key(_raw_public(key.public_key())):
        raise AuthError("bad_certificate", f"{paths[NODE_KEY_FILE]} does not match {paths[NODE_CERT_FILE]}")
    try:
        pool_id = pool_id_of(ca_pem)
    except (AuthError, WireError) as exc:
        raise ConfigError(f"{paths[CA_FILE]} is not a certificate: {exc}") from exc
    return Credentials(
        node_id=node_id,
        node_name=name,
        pool_id=pool_id,
        ca_cert=paths[CA_FILE],
        node_cert=paths[NODE_CERT_FILE],
        node_key=paths[NODE_KEY_FILE],
        ca_pem=ca_pem,
        cert_pem=cert_pem,
        key_pem=key_pem,
    )
