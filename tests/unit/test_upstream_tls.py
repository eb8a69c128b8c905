"""The upstream HTTP client over TLS (gateway/upstream/pool.py's https origins) against a real local
TLS "backend" (asyncio.start_server with a server SSLContext) whose certificate is signed by a
throwaway CA made at test time with the `openssl` CLI. The client trusts what
ssl.create_default_context() trusts, so the tests choose its trust store through SSL_CERT_FILE (and
point SSL_CERT_DIR at an empty folder, so that the system store plays no part): trusted, the answer
comes back and the connection is kept alive; untrusted or for another name, the handshake fails
before a byte of the request is sent and that is a connect error that does not name the URL. Each
test runs under a 5 s asyncio.timeout (in `serve`); the same tests run again on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shutil
import ssl
import subprocess
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from gateway.upstream.client import UpstreamClient, UpstreamConnectError, error_kind
from tests.unit.raw_server import RawServer, serving

pytestmark = pytest.mark.unit

ANSWER = b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": []}'
REQUEST = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'

X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY = 20
X509_V_ERR_HOSTNAME_MISMATCH = 62
"""OpenSSL's verify codes (x509_vfy.h) for an unknown CA and for a certificate of another name."""

OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = placeholder

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid

[other_name_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:other.invalid
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""
"""Our own config (not the system's), with the extensions a strict verifier (Python 3.13's
VERIFY_X509_STRICT) wants: key usages, key identifiers, and the names in subjectAltName."""


# -- certificates -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Certs:
    ca: Path
    """The throwaway CA's certificate (PEM): the bundle that makes the backend trusted."""
    other_ca: Path
    """Another throwaway CA, which signed nothing here: a bundle that trusts no backend of ours."""
    server_cert: Path
    """Signed by `ca`, for DNS localhost and IP 127.0.0.1."""
    server_key: Path
    other_name_cert: Path
    """Signed by `ca`, for DNS other.invalid only."""
    other_name_key: Path
    empty_dir: Path
    """An empty SSL_CERT_DIR: the system's certificate folder is not consulted."""


def _openssl(folder: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=folder, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed ({done.returncode}): {done.stderr}")


def _new_key_args(key: Path) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key)]


def _make_leaf(folder: Path, cnf: Path, ca: tuple[Path, Path], name: str, extensions: str) -> tuple[Path, Path]:
    cert, key, csr = folder / f"{name}.pem", folder / f"{name}.key", folder / f"{name}.csr"
    _openssl(folder, "req", "-new", "-config", str(cnf), "-subj", f"/CN={name}", *_new_key_args(key), "-out", str(csr))
    _openssl(
        folder,
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca[0]),
        "-CAkey",
        str(ca[1]),
        "-set_serial",
        str(secrets.randbits(63)),
        "-days",
        "2",
        "-extfile",
        str(cnf),
        "-extensions",
        extensions,
        "-out",
        str(cert),
    )
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not installed: it makes these tests' throwaway CA and certificates")
    folder = tmp_path_factory.mktemp("tls")
    cnf = folder / "openssl.cnf"
    cnf.write_text(OPENSSL_CNF)
    cas: dict[str, tuple[Path, Path]] = {}
    for name, subject in (("ca", "/CN=gateway test CA"), ("other_ca", "/CN=gateway unrelated test CA")):
        cert, key = folder / f"{name}.pem", folder / f"{name}.key"
        _openssl(
            folder,
            "req",
            "-x509",
            "-config",
            str(cnf),
            "-extensions",
            "ca_ext",
            "-subj",
            subject,
            "-days",
            "2",
            "-set_serial",
            str(secrets.randbits(63)),
            *_new_key_args(key),
            "-out",
            str(cert),
        )
        cas[name] = cert, key
    server = _make_leaf(folder, cnf, cas["ca"], "localhost", "server_ext")
    other_name = _make_leaf(folder, cnf, cas["ca"], "other.invalid", "other_name_ext")
    empty = folder / "no-certs"
    empty.mkdir()
    return Certs(cas["ca"][0], cas["other_ca"][0], *server, *other_name, empty)


def trust(monkeypatch: pytest.MonkeyPatch, bundle: Path, certs: Certs) -> None:
    """Make `bundle` the whole trust store of the next ssl.create_default_context()."""
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    monkeypatch.setenv("SSL_CERT_DIR", str(certs.empty_dir))


# -- the TLS backend --------------------------------------------------------------------------------


def ok(body: bytes = ANSWER) -> bytes:
    """A whole content-length answer, kept alive (HTTP/1.1's default)."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    return head + body


class TlsBackend(RawServer):
    """An HTTP/1.1 backend on 127.0.0.1 that speaks only TLS and answers every request with ok()."""

    quiet = (*RawServer.quiet, ssl.SSLError)  # the client ended TLS
    settle = 3  # closed TLS transports take a few loop turns

    def __init__(self, cert: Path, key: Path) -> None:
        super().__init__()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.context.sni_callback = self._on_hello
        self.hellos: list[str | None] = []
        """The server name (SNI) of every TLS ClientHello, None where the client sent none; a
        handshake the client then rejects is counted here and not in `connections`."""
        self.tls_versions: list[str | None] = []
        self.requests: list[tuple[int, bytes]] = []
        """(connection index, request bytes) in the order they were read."""

    def _on_hello(self, sslobj: ssl.SSLObject | ssl.SSLSocket, name: str | None, context: ssl.SSLContext) -> None:
        self.hellos.append(name)

    def url(self, host: str, path: str = "/v1/chat/completions") -> str:
        return f"https://{host}:{self.port}{path}"

    async def start(self) -> None:
        await self.listen(self.context)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        self.tls_versions.append(ssl_object.version() if ssl_object is not None else None)
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            self.requests.append((index, head + body))
            writer.write(ok())
            await writer.drain()


def serve(cert: Path, key: Path) -> contextlib.AbstractAsyncContextManager[tuple[TlsBackend, UpstreamClient]]:
    """A started TLS backend and a fresh client (so a fresh default SSL context, made at its first
    https connection), both closed after; the whole test within 5 s."""
    return serving(TlsBackend(cert, key), first_byte_s=3.0)


def headers_of(request: bytes) -> list[tuple[str, str]]:
    head = request.split(b"\r\n\r\n", 1)[0].decode()
    return [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in head.split("\r\n")[1:])]


async def refused(client: UpstreamClient, url: str) -> UpstreamConnectError:
    """The connect error a request to url raises, checked not to name the URL."""
    with pytest.raises(UpstreamConnectError) as caught:
        await client.post(url, REQUEST, {"content-type": "application/json"}, "b1")
    exc = caught.value
    assert exc.message == "Could not connect to backend b1."
    assert url not in str(exc) and "localhost" not in str(exc) and "127.0.0.1" not in str(exc)
    assert exc.status_code == 502 and exc.code == "upstream_connect_error" and error_kind(exc) == "connect"
    return exc


# -- trusted ----------------------------------------------------------------------------------------


async def test_a_backend_signed_by_the_trusted_ca_answers_over_one_kept_alive_tls_connection(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs.ca, certs)
    async with serve(certs.server_cert, certs.server_key) as (backend, client):
        url = backend.url("localhost")
        for _ in range(2):
            resp = await client.post(url, REQUEST, {"content-type": "application/json"}, "b1")
            assert resp.status == 200
            assert resp.headers["content-type"] == "application/json"
            assert resp.headers["content-length"] == str(len(ANSWER))
            assert await resp.read(2.0, 1000) == ANSWER
            resp.release()
        assert backend.connections == 1 and backend.hellos == ["localhost"]  # one handshake, then reuse
        assert backend.tls_versions[0] in ("TLSv1.2", "TLSv1.3")
        assert [index for index, _ in backend.requests] == [0, 0]
        assert all(request.endswith(b"\r\n\r\n" + REQUEST) for _, request in backend.requests)
        assert all(request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") for _, request in backend.requests)


async def test_the_host_header_and_server_name_over_tls_are_the_urls_host_and_port(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs.ca, certs)
    async with serve(certs.server_cert, certs.server_key) as (backend, client):
        caller = {"Host": "elsewhere", "authorization": "Bearer k"}
        resp = await client.post(backend.url("localhost"), REQUEST, caller, "b1")
        assert await resp.read(2.0, 1000) == ANSWER
        resp.release()
        status, body = await client.get(backend.url("localhost", "/health?full=1"), caller, 2.0, "b1")
        assert (status, body) == (200, ANSWER)
        assert len(backend.requests) == 2 and backend.connections == 1
        for (_, request), line in zip(
            backend.requests, (b"POST /v1/chat/completions HTTP/1.1", b"GET /health?full=1 HTTP/1.1"), strict=True
        ):
            assert request.split(b"\r\n", 1)[0] == line
            fields = headers_of(request)
            assert [value for name, value in fields if name == "host"] == [f"localhost:{backend.port}"]
            assert ("authorization", "Bearer k") in fields
        assert backend.hellos == ["localhost"]  # SNI: the URL's host name, without the port


async def test_a_backend_addressed_by_ip_is_verified_against_the_ip_in_its_certificate(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs.ca, certs)
    async with serve(certs.server_cert, certs.server_key) as (backend, client):
        status, body = await client.get(backend.url("127.0.0.1", "/v1/models"), {}, 2.0, "b1")
        assert (status, body) == (200, ANSWER)
        fields = headers_of(backend.requests[0][1])
        assert [value for name, value in fields if name == "host"] == [f"127.0.0.1:{backend.port}"]
        assert backend.hellos == [None]  # no SNI for an IP address (RFC 6066 section 3)


# -- not trusted ------------------------------------------------------------------------------------


async def test_a_backend_signed_by_an_untrusted_ca_is_a_connect_error_and_nothing_is_sent(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs.other_ca, certs)  # a bundle that holds some CA, not the backend's
    async with serve(certs.server_cert, certs.server_key) as (backend, client):
        url = backend.url("localhost")
        exc = await refused(client, url)
        cause = exc.__context__
        assert isinstance(cause, ssl.SSLCertVerificationError), repr(cause)
        assert cause.verify_code == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY, cause.verify_message
        assert exc.__cause__ is None and exc.__suppress_context__  # raised from None: no URL in a traceback
        assert backend.hellos == ["localhost"]  # the handshake was tried...
        assert backend.connections == 0 and backend.requests == []  # ...and failed before any request
        await refused(client, url)  # still refused: no connection was pooled
        assert backend.hellos == ["localhost", "localhost"] and backend.requests == []


async def test_an_empty_trust_store_trusts_no_backend(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = certs.empty_dir.parent / "empty-bundle.pem"
    empty.write_bytes(b"")
    trust(monkeypatch, empty, certs)
    async with serve(certs.server_cert, certs.server_key) as (backend, client):
        exc = await refused(client, backend.url("localhost"))
        assert isinstance(exc.__context__, ssl.SSLCertVerificationError), repr(exc.__context__)
        assert backend.connections == 0 and backend.requests == []


async def test_a_trusted_certificate_for_another_name_is_a_connect_error(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    trust(monkeypatch, certs.ca, certs)
    async with serve(certs.other_name_cert, certs.other_name_key) as (backend, client):
        exc = await refused(client, backend.url("localhost"))
        cause = exc.__context__
        assert isinstance(cause, ssl.SSLCertVerificationError), repr(cause)
        assert cause.verify_code == X509_V_ERR_HOSTNAME_MISMATCH, cause.verify_message
        assert backend.hellos == ["localhost"] and backend.connections == 0 and backend.requests == []


# -- the same on uvloop -----------------------------------------------------------------------------

ON_UVLOOP: list[Callable[[Certs, pytest.MonkeyPatch], Coroutine[Any, Any, None]]] = [
    test_a_backend_signed_by_the_trusted_ca_answers_over_one_kept_alive_tls_connection,
    test_the_host_header_and_server_name_over_tls_are_the_urls_host_and_port,
    test_a_backend_addressed_by_ip_is_verified_against_the_ip_in_its_certificate,
    test_a_backend_signed_by_an_untrusted_ca_is_a_connect_error_and_nothing_is_sent,
    test_a_trusted_certificate_for_another_name_is_a_connect_error,
]


@pytest.mark.parametrize("test", ON_UVLOOP, ids=[test.__name__.removeprefix("test_") for test in ON_UVLOOP])
def test_on_uvloop(
    test: Callable[[Certs, pytest.MonkeyPatch], Coroutine[Any, Any, None]],
    certs: Certs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uvloop = pytest.importorskip("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(test(certs, monkeypatch))
