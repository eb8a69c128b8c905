"""The gateway's own sections of gateway.yaml: its server and client keys, budgets, Redis, tracing,
sharing, limits, timeouts, retries, health checks and the routing switches."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal, get_args

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.config.schema import NAME_PATTERN, PlatformName, Priority, Section, http_url


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 4000
    drain_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    request_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    """Time a client has to send a whole request, headers and body (slowloris); 0 disables."""
    api_keys: tuple[SecretStr, ...] = ()
    """Client keys accepted as `Authorization: Bearer ...`, each the key itself or `sha256:<hex>`
    of it; an empty list (and no `keys:`) means no client auth."""

    @model_validator(mode="after")
    def _no_empty_keys(self) -> ServerConfig:
        # An unset ${KEY:-} must not silently turn client auth off (or lock every client out).
        if any(not k.get_secret_value().strip() for k in self.api_keys):
            raise ValueError("api_keys: a key is empty (is its environment variable set?)")
        for k in self.api_keys:
            _check_hashed(k.get_secret_value(), "api_keys")
        return self


_SHA256 = re.compile(r"^sha256:[0-9a-fA-F]{64}$")


def _check_hashed(key: str, where: str) -> None:
    if key.startswith("sha256:") and not _SHA256.match(key):
        raise ValueError(f"{where}: a `sha256:` key must be followed by 64 hex digits")


class BudgetConfig(Section):
    period: Literal["day", "month"]
    """A UTC calendar day or month: the budget starts again at its first second."""
    input_tokens: Annotated[int, Field(ge=1)] | None = None
    """Prompt tokens the key may use in the period, by the engines' reported usage."""
    output_tokens: Annotated[int, Field(ge=1)] | None = None
    """Completion tokens the key may use in the period, by the engines' reported usage."""

    @model_validator(mode="after")
    def _check_limit(self) -> BudgetConfig:
        if self.input_tokens is None and self.output_tokens is None:
            raise ValueError("a budget needs input_tokens, output_tokens or both")
        return self


class ClientKeyConfig(Section):
    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=64)]
    """Names the key in gateway_rate_limited_total and its Redis counters; never the key itself."""
    key: SecretStr
    """The key itself (e.g. `${TEAM_A_KEY}`), or `sha256:<64 hex digits>` of it."""
    models: tuple[str, ...] = ()
    """Model names or globs this key may use; empty means every model."""
    requests_per_minute: Annotated[int, Field(ge=1)] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = None
    """Prompt plus completion tokens, counted when each request ends."""
    priority: Priority | None = None
    """The class of this key's requests when the queue is in use; unset: the route's, else `default`."""
    max_priority: Priority | None = None
    """The highest class an `x-gateway-priority` header may ask for; unset: the key's own class."""
    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0
    """This key's share of its class while saturated, relative to the other keys in the class."""
    budgets: Annotated[tuple[BudgetConfig, ...], Field(max_length=4)] = ()
    """Token budgets per UTC day or month; past one, the key's requests get 429 until it resets."""

    @model_validator(mode="after")
    def _check_key(self) -> ClientKeyConfig:
        if not self.key.get_secret_value().strip():
            raise ValueError("key is empty (is its environment variable set?)")
        _check_hashed(self.key.get_secret_value(), "key")
        order = get_args(Priority)
        if self.max_priority is not None and order.index(self.max_priority) > order.index(self.priority or "default"):
            raise ValueError("max_priority is below the key's own priority")
        return self


class RedisConfig(Section):
    url: SecretStr
    """Where the per-key limit counters live, shared by every replica: `redis://host:6379/0`.
    Secret, as it may hold a password."""
    fail_open: bool = True
    """When Redis cannot be reached: true serves the request unlimited, false answers 503."""
    timeout_s: Annotated[float, Field(gt=0)] = 0.25
    """Longest wait for one Redis call before it counts as unreachable."""
    key_prefix: str = "gateway:rl:"

    @model_validator(mode="after")
    def _check_url(self) -> RedisConfig:
        if not re.match(r"^(redis|rediss|unix)://\S+$", self.url.get_secret_value()):
            raise ValueError("url must be redis://, rediss:// or unix://")
        return self


class TracingConfig(Section):
    """OpenTelemetry traces, exported over OTLP/HTTP (docs/tracing.md). The block's presence turns
    tracing on; the standard OTEL_* environment variables fill in whatever it leaves unset."""

    enabled: bool = True
    endpoint: str | None = None
    """The collector's OTLP/HTTP base URL (`http://collector:4318`; `/v1/traces` is appended);
    unset: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, else http://localhost:4318."""
    service_name: str | None = None
    """The resource's service.name; unset: OTEL_SERVICE_NAME, else `llm-gateway`."""
    sample_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    """The share of new traces recorded (a parent's decision is followed); unset:
    OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, else every trace."""
    headers: Mapping[str, SecretStr] = {}
    """Headers sent with every export (a collector's key); secret, as they may hold one."""
    capture_content: bool = False
    """Record the prompt and a non-stream answer as span events (off: no text leaves the gateway)."""
    max_content_chars: Annotated[int, Field(ge=1, le=1 << 20)] = 4096
    """The longest prompt or answer text one event holds; longer is cut off there."""

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, endpoint: str | None) -> str | None:
        return http_url(endpoint, "endpoint")


class SharingConfig(Section):
    min_share: Annotated[float, Field(gt=0, le=0.5)] = 0.05
    """While a class has requests waiting, at least this fraction of the slots that free up go to
    it, however busy the classes above it are: no class starves."""
    output_estimate_tokens: Annotated[int, Field(ge=1)] = 256
    """A request's output tokens for fair share when it sets no max_tokens (real usage corrects it)."""
    reserved: Mapping[Literal["interactive", "default"], Annotated[int, Field(ge=0)]] = {}
    """Slots of each backend's max_in_flight held back for a class and those above it: a request
    of a lower class sees the backend as full that many slots early, so that a higher one arriving
    finds a slot free instead of waiting for one to end. A backend's last slot is never held back
    (every class can always run somewhere). The held slots idle when no higher class sends."""

    def held_back(self, rank: int) -> int:
        """Slots held back from a request of class `rank` (0 = interactive, the highest)."""
        return sum(self.reserved.get(c, 0) for c in get_args(Priority)[:rank] if c != "batch")


class LimitsConfig(Section):
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    """The request line and headers together; past it the client gets 431 and the connection closes."""
    max_headers: Annotated[int, Field(ge=8)] = 100
    """Header fields in one request; past it, 431."""
    max_body_bytes: Annotated[int, Field(ge=1024)] = 10 * 1024 * 1024
    max_json_depth: Annotated[int, Field(ge=2, le=10_000)] = 64
    max_json_nodes: Annotated[int, Field(ge=1000)] = 1_000_000
    """Values in the body's JSON (every scalar, object and array); counted before parsing."""
    max_json_containers: Annotated[int, Field(ge=100)] = 100_000
    """Objects and arrays in the body's JSON; counted before parsing."""
    max_n: Annotated[int, Field(ge=1)] = 8
    max_messages: Annotated[int, Field(ge=1)] = 10_000
    queue_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    """How long a request may wait for a slot when every backend of its pool is at max_in_flight."""
    max_queue: Annotated[int, Field(ge=0)] = 1000
    """Requests waiting for a slot, gateway-wide; past it a request gets 429 at once."""
    max_response_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    """A non-stream upstream answer is read whole, up to this; past it the client gets 502
    `response_too_large` and the backend a failure (streams are relayed chunk by chunk, unbounded)."""
    max_event_bytes: Annotated[int, Field(ge=1024)] = 2 * 1024 * 1024
    """One upstream SSE event (a stream's unit, up to its blank line); past it the stream is cut
    with the protocol's error event, the upstream closed and the backend charged a failure."""
    max_response_ids: Annotated[int, Field(ge=1)] = 100_000
    """Responses ids the gateway remembers the backend of (LRU, ~17 MB at the default); a request
    naming a forgotten one gets OpenAI's 404 response_not_found, as for an unknown id."""


class TimeoutsConfig(Section):
    connect_s: Annotated[float, Field(gt=0)] = 5.0
    first_byte_s: Annotated[float, Field(gt=0)] = 300.0
    """Upstream response headers must arrive within this; long prefills are allowed for."""
    idle_s: Annotated[float, Field(gt=0)] = 120.0
    """Longest gap between two upstream chunks. There is deliberately no total cap on a stream."""
    keepalive_s: Annotated[float, Field(ge=0)] = 15.0
    """While a stream waits for its first byte, send an SSE comment this often (0 disables)."""


class RetryConfig(Section):
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    budget_ratio: Annotated[float, Field(ge=0, le=1)] = 0.2
    budget_min: Annotated[int, Field(ge=0)] = 3


class HealthConfig(Section):
    interval_s: Annotated[float, Field(gt=0)] = 5.0
    timeout_s: Annotated[float, Field(gt=0)] = 5.0
    failed_checks: Annotated[int, Field(ge=1)] = 2
    """Consecutive failed active checks before a healthy backend is marked unhealthy: one slow
    answer from a busy engine must not take it out of rotation."""
    slow_start_s: Annotated[float, Field(ge=0)] = 30.0
    """A backend re-admitted after an outage ramps from no share to its full share over this long
    (least_load and prefix_affinity; 0 disables)."""
    unhealthy_after: Annotated[int, Field(ge=1)] = 5
    """Consecutive passive failures (connect errors, 5xx) before a backend is ejected."""
    scrape_interval_s: Annotated[float, Field(ge=0.25)] = 1.0
    """How often each backend's /metrics is scraped for load; 0.25 s is the floor by design."""
    scrape_stale_s: Annotated[float, Field(gt=0)] = 10.0


class SharedPrefixConfig(Section):
    block_chars: Annotated[int, Field(ge=16)] = 512
    """Fingerprint block size, in UTF-8 bytes of the canonical prompt."""
    min_prefix_chars: Annotated[int, Field(ge=16)] = 1024
    min_seen: Annotated[int, Field(ge=1, le=1000)] = 2
    window_s: Annotated[float, Field(gt=0)] = 600.0
    max_entries: Annotated[int, Field(ge=16)] = 65_536


class RoutingConfig(Section):
    platform: PlatformName = "auto"
    shared_prefix: SharedPrefixConfig = SharedPrefixConfig()
