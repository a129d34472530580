"""TLS contexts with real sockets on 127.0.0.1: Ed25519 mutual TLS 1.3 works, identities come from the
certificates, and everything else (another CA, no certificate, TLS 1.2) is refused and counted."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator

import pytest

from frenzyd.net import auth, tls


class Failures(list[str]):
    """Handshake failures seen by the server; ``wait(n)`` awaits the n-th one (bounded)."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def record(self, reason: str) -> None:
        self.append(reason)
        self.changed.set()

    async def wait(self, n: int = 1) -> list[str]:
        async with asyncio.timeout(5.0):
            while len(self) < n:
                self.changed.clear()
                await self.changed.wait()
        return list(self)


@pytest.fixture
async def server(
    pool_creds: dict[str, auth.Credentials],
) -> AsyncIterator[tuple[int, Failures, list[tuple[str, str]]]]:
    failures = Failures()
    seen: list[tuple[str, str]] = []
    ca = pool_creds["n1"].ca_pem

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        seen.append(auth.peer_identity_from_der(ca, der))
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(
        handle, "127.0.0.1", 0, ssl=tls.server_context(pool_creds["n1"], failures.record)
    )
    port = srv.sockets[0].getsockname()[1]
    yield port, failures, seen
    srv.close()
    await srv.wait_closed()


async def _read_first(port: int, ctx: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        return await asyncio.wait_for(reader.read(100), 5.0)
    except (ConnectionError, ssl.SSLError):
        return b""
    finally:
        writer.close()


async def test_pool_member_connects_with_tls13_and_is_identified(server, pool_creds) -> None:
    port, failures, seen = server
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=tls.client_context(pool_creds["n2"])
    )
    obj = writer.get_extra_info("ssl_object")
    assert obj.version() == "TLSv1.3"
    server_id = auth.peer_identity_from_der(pool_creds["n1"].ca_pem, obj.getpeercert(binary_form=True))
    assert server_id == (pool_creds["n1"].node_id, "n1")
    assert await reader.read(100) == b"hello"
    writer.close()
    assert seen == [(pool_creds["n2"].node_id, "n2")]
    assert failures == []


async def test_other_ca_is_refused_on_the_first_read_not_at_connect(server, pool_creds) -> None:
    port, failures, seen = server
    ctx = tls.client_context(pool_creds["alien"])
    ctx.load_verify_locations(cadata=pool_creds["n1"].ca_pem.decode())  # it trusts us; we must not trust it
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)  # "connects" under TLS 1.3
    try:
        try:
            data = await asyncio.wait_for(reader.read(100), 5.0)
        except (ConnectionError, ssl.SSLError):
            data = b""
        assert data == b""
    finally:
        writer.close()
    assert await failures.wait() == ["untrusted_certificate"]
    assert seen == []


async def test_no_client_certificate_is_refused(server, pool_creds) -> None:
    port, failures, _ = server
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=pool_creds["n1"].ca_pem.decode())
    assert await _read_first(port, ctx) == b""
    assert await failures.wait() == ["no_certificate"]


async def test_tls12_is_refused(server, pool_creds) -> None:
    port, failures, _ = server
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=pool_creds["n1"].ca_pem.decode())
    ctx.load_cert_chain(str(pool_creds["n2"].node_cert), str(pool_creds["n2"].node_key))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    assert await failures.wait() == ["tls_version"]


async def test_client_refuses_a_server_of_another_pool(pool_creds) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls.server_context(pool_creds["alien"]))
    port = srv.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.open_connection("127.0.0.1", port, ssl=tls.client_context(pool_creds["n1"]))
    finally:
        srv.close()
        await srv.wait_closed()
