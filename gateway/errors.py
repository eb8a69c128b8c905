"""The errors the gateway raises, and the one OpenAI-shaped body they all render to; every
message is scrubbed of anything that looks like a credential (an engine may quote its key).

GatewayError                        -> {"error": {"message", "type", "param", "code"}}
 ├─ InvalidRequest          400       bad JSON, wrong types, invalid max_tokens, limits
 │   └─ ContextLengthExceeded 400     prompt (+ output) over the route's cap
 ├─ Unauthorized            401
 ├─ ModelNotAllowed         403       the client's key may not use this model
 ├─ NotFound                404       unknown model, unknown path
 ├─ MethodNotAllowed        405
 ├─ PayloadTooLarge         413
 ├─ UnsupportedMediaType    415
 ├─ HeaderTooLarge          431       request head over limits.max_header_bytes / max_headers
 ├─ RateLimited             429       a key's requests or tokens per minute; carries Retry-After
 ├─ Overloaded              429/503   no capacity; carries Retry-After
 ├─ NoHealthyBackend        503       carries Retry-After
 │   └─ ShuttingDown          503     the gateway is draining; also the last event of a cut stream
 ├─ UpstreamError           502       connect failure, bad upstream response
 ├─ UpstreamTimeout         504       no first byte in time
 └─ EngineError             any       an engine's own error, normalised by its adapter
"""

from __future__ import annotations

import json
import math
import re
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

# Credentials an engine may quote back in its error text (the Authorization header it received,
# a key in a URL or a config dump). Every message the gateway renders is scrubbed of them.
_CREDENTIALS = (
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=:\-]{4,}"), r"\1\2[redacted]"),
    (
        re.compile(
            r"(?i)\b([\w-]*(?:api[_-]?key|secret|password|passwd|token|authorization))"
            r"(\s*[\"']?\s*[:=]\s*[\"']?)(?!(?:bearer|basic)\b)[^\s\"',;&}\[]{3,}"
        ),
        r"\1\2[redacted]",
    ),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_\-]{6,}"), r"\1-[redacted]"),
)


def redact(text: str) -> str:
    """text with anything that looks like a credential replaced by `[redacted]`."""
    for pattern, replacement in _CREDENTIALS:
        text = pattern.sub(replacement, text)
    return text


MAX_RETRY_AFTER_S = 3600
"""The longest Retry-After the gateway passes on: a backend's `1e999` must not park a client for ever."""


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "gateway_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        message = redact(message)
        super().__init__(message)
        self.message = message
        self.code = code if code is not None else self.default_code
        self.param = param
        self.retry_after = retry_after
        self._status = status

    @property
    def status_code(self) -> int:
        return self._status or self.status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body(), separators=(",", ":")).encode()

    def headers(self) -> dict[str, str]:
        headers = {"x-gateway-error": "1"}
        if self.retry_after is not None:
            headers["retry-after"] = str(retry_after_seconds(self.retry_after))
        return headers


def retry_after_seconds(value: float) -> int:
    """A Retry-After value to send: whole seconds in [1, MAX_RETRY_AFTER_S]; NaN counts as 1."""
    if math.isnan(value):
        return 1
    return int(min(MAX_RETRY_AFTER_S, max(1.0, math.ceil(value)))) if math.isfinite(value) else MAX_RETRY_AFTER_S


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """A backend's Retry-After (delta seconds or an HTTP date) as seconds from now, clamped to
    [0, MAX_RETRY_AFTER_S]; None when absent, non-finite or not understood."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None or now is None:
            return None
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return min(float(MAX_RETRY_AFTER_S), max(0.0, seconds))


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class ModelNotAllowed(GatewayError):
    status = 403
    type = "invalid_request_error"
    default_code = "model_not_allowed"


class RateLimited(GatewayError):
    """A client key over its own limit: the client's quota, not the gateway's capacity. OpenAI's
    shape: type names the limit (`requests` or `tokens`), code is `rate_limit_exceeded`."""

    status = 429
    type = "requests"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, limit: str, retry_after: float, code: str | None = None) -> None:
        super().__init__(message, retry_after=retry_after, code=code)
        self.limit = limit

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.limit, "param": None, "code": self.code}}


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_media_type"


class HeaderTooLarge(GatewayError):
    status = 431
    type = "invalid_request_error"
    default_code = "request_header_fields_too_large"


class Overloaded(GatewayError):
    status = 429
    type = "rate_limit_error"
    default_code = "overloaded"


class NoHealthyBackend(GatewayError):
    status = 503
    type = "service_unavailable"
    default_code = "no_healthy_backend"


class ShuttingDown(NoHealthyBackend):
    """The gateway is stopping: a new request is refused, or one in flight was cut by the drain.
    It names the gateway, never the engine, so that no client (or operator) blames the backend."""

    default_code = "shutdown"

    def __init__(self, message: str = "The gateway is shutting down; this request was cut before it finished.") -> None:
        super().__init__(message, retry_after=1)


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    default_code = "bad_gateway"


class UpstreamTimeout(GatewayError):
    status = 504
    type = "upstream_error"
    default_code = "upstream_timeout"


class EngineError(GatewayError):
    """An engine's own error response, already normalised by its adapter."""

    type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        type_: str,
        code: str | None,
        param: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, code=code, param=param, status=status, retry_after=retry_after)
        self._type = type_

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self._type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        headers = super().headers()
        headers["x-gateway-error"] = "engine"
        return headers
