"""Every header the gateway builds, in one place: what goes upstream (the one drop list), and what
the client gets back (the x-gateway-* headers, SSE and error headers)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

from gateway.errors import GatewayError, PayloadTooLarge
from gateway.fleet.registry import Backend
from gateway.pipeline.exchange import Exchange

# Never forwarded: hop-by-hop headers (RFC 9110 7.6.1), the client's credentials, and headers the
# gateway sets itself. The backend's own key is added per attempt.
DROP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
        "authorization",
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "api-key",
        "accept-encoding",
        "content-encoding",  # the gateway forwards the JSON it parsed: identity, whatever the client said
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        "x-client-ip",
        "true-client-ip",
        "cf-connecting-ip",
        "openai-organization",
        "openai-project",
    }
)
# Any other header whose name says it carries a credential (x-goog-api-key, anthropic-api-key,
# x-auth-token, ...) is dropped too: the backend's own key is the only one sent.
_CREDENTIAL_WORDS = ("api-key", "api_key", "apikey", "auth", "token", "secret", "password", "session-key")
SSE = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)


def upstream_headers(headers: Mapping[str, str], request_id: str) -> dict[str, str]:
    """The client's headers less the drop list (and any header its Connection names)."""
    named = headers.get("connection", "")
    also = {t.strip().lower() for t in named.split(",")} if named else ()
    out: dict[str, str] = {}
    for name, value in headers.items():
        if not _forwarded(name) or name in also:
            continue
        if not value.isascii():
            # The ASGI server gave the raw bytes as latin-1; aiohttp would encode them as UTF-8 again
            # (café -> cafÃ©). Send the client's bytes as they came, or drop a value that is not UTF-8.
            try:
                value = value.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                continue
        out[name] = value
    out["content-type"] = "application/json"
    out["accept-encoding"] = "identity"
    out["x-request-id"] = request_id
    return out


@functools.lru_cache(maxsize=1024)
def _forwarded(name: str) -> bool:
    """Whether a header of this (lower-case) name may go upstream; memoised, as clients send the
    same few names on every request (an SDK's dozen took ~1 us each through the word checks)."""
    return not (name in DROP or name.startswith("x-gateway-") or any(w in name for w in _CREDENTIAL_WORDS))


def for_backend(base: dict[str, str], backend: Backend) -> dict[str, str]:
    """The upstream headers with the backend's own key."""
    if backend.api_key is None:
        return base
    return {**base, **backend.auth_headers()}


def response_headers(ex: Exchange) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-request-id", ex.request_id.encode()),
        (b"x-gateway-pool", ex.pool.encode()),
        (b"x-gateway-backend", ex.backend_name.encode()),
        (b"x-gateway-rule", ex.rule.encode("latin-1", "replace")),
        *ex.headers,
    ]


def error_headers(err: GatewayError, body: bytes, ex: Exchange) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in err.headers().items()]
    headers += response_headers(ex)
    if isinstance(err, PayloadTooLarge):
        headers.append((b"connection", b"close"))
    return headers
