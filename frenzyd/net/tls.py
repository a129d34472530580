"""TLS contexts for daemon-to-daemon traffic: mutual TLS 1.3, pool CA only, Ed25519 node certificates.

Peers are identified by the node id in their certificate (``auth.peer_identity_from_der``),
not by host name: addresses come from unauthenticated mDNS or static config, so the
host-name check is off and membership is proved by the CA signature alone.

Server contexts can count failed handshakes by reason: under TLS 1.3 a client whose
certificate is not from the pool CA completes its side of the handshake and only sees
the refusal on its first read, while the server's handshake fails — the counter sees it.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from frenzyd.net.auth import Credentials

OnHandshakeFailure = Callable[[str], None]


def handshake_failure_reason(exc: ssl.SSLError) -> str:
    """Map an OpenSSL handshake error onto a refusal reason for counters."""
    code = (exc.reason or "").upper()
    if "CERTIFICATE_VERIFY_FAILED" in code or "UNKNOWN_CA" in code or "BAD_CERTIFICATE" in code:
        return "untrusted_certificate"
    if "NO_CERTIFICATE" in code or "PEER_DID_NOT_RETURN" in code or "CERTIFICATE_REQUIRED" in code:
        return "no_certificate"
    if "VERSION" in code or "PROTOCOL" in code:
        return "tls_version"
    return "tls_handshake"


def _base(ctx: ssl.SSLContext, creds: Credentials) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(certfile=str(creds.node_cert), keyfile=str(creds.node_key))
    ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii"))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def server_context(creds: Credentials, on_failure: OnHandshakeFailure | None = None) -> ssl.SSLContext:
    """A server context that requires a client certificate from the pool CA.

    ``on_failure(reason)`` is called for every failed handshake (counted by the caller).
    """
    ctx = _base(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), creds)
    if on_failure is not None:
        callback = on_failure

        class _CountingSSLObject(ssl.SSLObject):
            def do_handshake(self) -> None:
                try:
                    super().do_handshake()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    raise
                except ssl.SSLError as exc:
                    callback(handshake_failure_reason(exc))
                    raise

        ctx.sslobject_class = _CountingSSLObject
    return ctx


def client_context(creds: Credentials) -> ssl.SSLContext:
    """A client context presenting the node certificate and trusting only the pool CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # identity is the node id in the certificate, checked by the caller
    return _base(ctx, creds)
