"""The gateway's configuration: frozen pydantic models for gateway.yaml (reading the file, `${ENV}`
substitution and the errors that name a YAML path are gateway/config_loader.py's). A leaf module: it
imports nothing else from the gateway."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

EngineKind = Literal["vllm", "sglang", "llamacpp", "trtllm", "lmdeploy", "nim", "ollama", "openai", "sim"]
BalancerKind = Literal["least_load", "prefix_affinity", "round_robin", "session", "first_healthy", "kv_events"]
PlatformName = Literal["auto", "mac", "no_nvidia_gpu", "nvidia_gpu"]
Priority = Literal["interactive", "default", "batch"]
"""Priority classes, highest first (gateway/policy/priority.py ranks them; docs/sharing.md)."""

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Model):
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


class BudgetConfig(_Model):
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


class ClientKeyConfig(_Model):
    name: Annotated[str, Field(pattern=_NAME_PATTERN, max_length=64)]
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


class RedisConfig(_Model):
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


class TracingConfig(_Model):
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
        if endpoint is not None and not re.match(r"^https?://[^\s/]+", endpoint):
            raise ValueError("endpoint must be an http:// or https:// URL")
        return endpoint


class SharingConfig(_Model):
    min_share: Annotated[float, Field(gt=0, le=0.5)] = 0.05
    """While a class has requests waiting, at least this fraction of the slots that free up go to
    it, however busy the classes above it are: no class starves."""
    output_estimate_tokens: Annotated[int, Field(ge=1)] = 256
    """A request's output tokens for fair share when it sets no max_tokens (real usage corrects it)."""
    reserved: dict[Literal["interactive", "default"], Annotated[int, Field(ge=0)]] = {}
    """Slots of each backend's max_in_flight held back for a class and those above it: a request
    of a lower class sees the backend as full that many slots early, so that a higher one arriving
    finds a slot free instead of waiting for one to end. A backend's last slot is never held back
    (every class can always run somewhere). The held slots idle when no higher class sends."""

    def held_back(self, rank: int) -> int:
        """Slots held back from a request of class `rank` (0 = interactive, the highest)."""
        return sum(self.reserved.get(c, 0) for c in get_args(Priority)[:rank] if c != "batch")


class LimitsConfig(_Model):
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


class TimeoutsConfig(_Model):
    connect_s: Annotated[float, Field(gt=0)] = 5.0
    first_byte_s: Annotated[float, Field(gt=0)] = 300.0
    """Upstream response headers must arrive within this; long prefills are allowed for."""
    idle_s: Annotated[float, Field(gt=0)] = 120.0
    """Longest gap between two upstream chunks. There is deliberately no total cap on a stream."""
    keepalive_s: Annotated[float, Field(ge=0)] = 15.0
    """While a stream waits for its first byte, send an SSE comment this often (0 disables)."""


class RetryConfig(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    budget_ratio: Annotated[float, Field(ge=0, le=1)] = 0.2
    budget_min: Annotated[int, Field(ge=0)] = 3


class HealthConfig(_Model):
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


class SharedPrefixConfig(_Model):
    block_chars: Annotated[int, Field(ge=16)] = 512
    """Fingerprint block size, in UTF-8 bytes of the canonical prompt."""
    min_prefix_chars: Annotated[int, Field(ge=16)] = 1024
    min_seen: Annotated[int, Field(ge=1, le=1000)] = 2
    window_s: Annotated[float, Field(gt=0)] = 600.0
    max_entries: Annotated[int, Field(ge=16)] = 65_536


class RoutingConfig(_Model):
    platform: PlatformName = "auto"
    shared_prefix: SharedPrefixConfig = SharedPrefixConfig()


class KVEventsSource(_Model):
    """Where an engine publishes its KV events (vLLM's and SGLang's `--kv-events-config`)."""

    endpoint: str
    """The engine's PUB socket as a subscriber connects to it: `tcp://HOST:PORT` for an engine
    started with `"endpoint": "tcp://*:PORT"` (which makes it bind)."""
    replay_endpoint: str | None = None
    """The engine's replay (ROUTER) socket, `tcp://HOST:PORT`; without it a missed batch stays missed."""
    topic: str = ""
    """The engine's `topic` (a prefix filter; empty: every message)."""

    @model_validator(mode="after")
    def _check_endpoints(self) -> KVEventsSource:
        for name, value in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint)):
            if value is None:
                continue
            if not re.match(r"^(tcp://[^*\s]+:\d+|ipc://\S+)$", value):
                raise ValueError(
                    f"{name} must be tcp://HOST:PORT (the engine's host, not *) or ipc://PATH, got {value!r}"
                )
        return self


class InferencePoolRef(_Model):
    """A Kubernetes InferencePool (inference.networking.k8s.io/v1) whose ready pods are this entry's
    members: each pod IP x each of the pool's targetPorts (gateway/fleet/inference_pool.py)."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)]
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)] | None = None
    """Unset: the NAMESPACE variable, else the service account's namespace, else `default`."""
    api_server: str | None = None
    """The API server's base URL; unset: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    (in-cluster). `http://127.0.0.1:8001` for `kubectl proxy`."""
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    """Read again for every request: bound service-account tokens rotate. A missing file: no token."""
    ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    """The CA an https:// API server's certificate is checked against."""

    @field_validator("api_server")
    @classmethod
    def _check_api_server(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/\s]+", url):
            raise ValueError("api_server must be an http:// or https:// URL")
        return url


class BackendConfig(_Model):
    url: str = ""
    """Required unless `inference_pool` names where the members come from."""
    name: Annotated[str, Field(pattern=_NAME_PATTERN)] | None = None
    api_key: SecretStr | None = None
    model: str | None = None
    """The model name this backend serves; sent upstream in place of the client's name."""
    context_window: Annotated[int, Field(ge=16)] | None = None
    """Tokens a request may use on this backend (prompt + output), for an engine that reports none;
    it wins over the window the gateway discovers. The effective cap is min(route cap, window)."""
    discover_models: bool = True
    """Ask the engine what it serves and its window, with each health round (routing by model,
    /v1/models, the window as a cap); false: only `model:` and `context_window:` count."""
    max_in_flight: Annotated[int, Field(ge=1)] | None = None
    discover: bool = False
    """Resolve the URL's host name every health round and make each address a backend: the
    headless-Service DNS of Kubernetes, where one name lists every engine pod."""
    kv_events: KVEventsSource | None = None
    """The engine's KV-event stream, for the `kv_events` balancer (needs the `kv-events` extra)."""
    inference_pool: InferencePoolRef | None = None
    """Members from a Kubernetes InferencePool's ready pods, kept current by a list and watch."""

    @model_validator(mode="after")
    def _check_kv_events(self) -> BackendConfig:
        if self.kv_events is not None and (self.discover or self.inference_pool is not None):
            raise ValueError("kv_events names one engine's stream: give each engine its own entry")
        return self

    @model_validator(mode="after")
    def _check_url(self) -> BackendConfig:
        if self.inference_pool is not None:
            if self.url or self.discover:
                raise ValueError("inference_pool gives the members' addresses: no url or discover with it")
            return self
        if not re.match(r"^https?://[^/\s]+", self.url):
            raise ValueError(f"url must be http(s)://host[:port][/path], got {self.url!r}")
        return self


class PoolConfig(_Model):
    engine: EngineKind
    flavour: Literal["vllm", "sglang", "llamacpp"] = "vllm"
    """For `engine: sim` only: which engine's API the simulator speaks (and the gateway expects)."""
    balancer: BalancerKind = "least_load"
    backends: Annotated[tuple[BackendConfig, ...], Field(min_length=1)]
    session_header: str = "x-session-id"
    affinity_epsilon: Annotated[float, Field(ge=0)] = 0.25
    """prefix_affinity spills to the next choice past (1+epsilon) x the pool's mean load."""
    affinity_slack: Annotated[int, Field(ge=0)] = 4
    """prefix_affinity: the favourite may also run this many requests above the mean load, so that
    small pools at low load keep their caches instead of spilling on every chance imbalance."""
    kv_epsilon: Annotated[float, Field(ge=0)] = 0.5
    """kv_events: the backend holding the longest cached prefix keeps the request until it would
    carry more than (1+kv_epsilon) x the pool's mean load (requests decided and not yet started
    count), then the least loaded takes it. Looser than affinity_epsilon: hot conversations even
    the load, and a cold one moved costs its whole prefix (docs/routing-benchmark.md)."""
    kv_slack: Annotated[int, Field(ge=0)] = 4
    """kv_events: that backend may also carry this many requests above the pool's mean load (as
    affinity_slack, the same default): fewer spills for a less even load; so may a conversation's
    hash home while this gateway does not know the prompt's ids; a conversation known to be held
    nowhere gets none."""
    kv_saturation_waiting: Annotated[int, Field(ge=1)] | None = 4
    """kv_events: an engine reporting this many queued requests (a fresh scrape) while it carries
    more than the pool's mean load is saturated."""
    kv_saturation_kv_usage: Annotated[float, Field(gt=0, le=1)] | None = 0.95
    """kv_events: an engine reporting its KV cache this full (a fresh scrape) while it carries more
    than the pool's mean load is saturated."""
    tokenizer: Annotated[str, Field(min_length=1)] | None = None
    """kv_events: a directory with the pool's model's tokenizer.json and chat template
    (tokenizer_config.json or chat_template.jinja): prompts' token ids are encoded by the gateway
    before routing instead of asked of the engines (pipeline/chat_tokenizer.py)."""

    @model_validator(mode="after")
    def _check_tokenizer(self) -> PoolConfig:
        if self.tokenizer is not None and self.balancer != "kv_events":
            raise ValueError(
                f"`tokenizer` is read by the kv_events balancer only; this pool's balancer is {self.balancer}"
            )
        return self


class RuleWhen(_Model):
    shared_prefix: bool | None = None
    platform: Literal["mac", "no_nvidia_gpu", "nvidia_gpu"] | None = None
    header: Mapping[str, str] | None = None
    model: str | None = None
    min_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    max_prompt_tokens: Annotated[int, Field(ge=0)] | None = None
    has_tools: bool | None = None
    stream: bool | None = None


class RuleConfig(_Model):
    name: str | None = None
    when: RuleWhen = RuleWhen()
    pool: str


class CapsConfig(_Model):
    max_context_tokens: Annotated[int, Field(ge=16)] | None = None
    on_exceed: Literal["reject", "truncate_oldest"] = "reject"
    default_max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_tokens_limit: Annotated[int, Field(ge=1)] | None = None
    exact_margin: Annotated[float, Field(ge=0, le=1)] = 0.15
    """Within this fraction of the cap, count tokens exactly with the engine instead of estimating."""


class RouteConfig(_Model):
    model: Annotated[str, Field(min_length=1)]
    """Client-facing model name, or a glob such as `llama-*`."""
    name: str | None = None
    upstream_model: str | None = None
    pools: Annotated[tuple[str, ...], Field(min_length=1)]
    rules: tuple[RuleConfig, ...] = ()
    caps: CapsConfig = CapsConfig()
    priority: Priority | None = None
    """The class of this route's requests for keys that set none (the lower of the two when both do)."""
    reasoning_content: Literal["off", "copy"] = "off"
    """On chat completions: `copy` sets `reasoning_content` from `reasoning` (vLLM 0.32 sends only the
    latter; many clients read the former) in answers and stream chunks; `off` relays the bytes as sent."""

    @field_validator("reasoning_content", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return "off" if value is False else value  # YAML reads a bare `off` as false

    aliases: Mapping[str, str] = {}
    """Client-facing names of this route that stand for a served model: `{my-model: Qwen/Qwen3-0.6B}`."""

    @property
    def label(self) -> str:
        return self.name or self.model

    @property
    def is_glob(self) -> bool:
        model = self.model  # three `in` tests, not any() over a generator: read on every request
        return "*" in model or "?" in model or "[" in model


class GatewayConfig(_Model):
    server: ServerConfig = ServerConfig()
    limits: LimitsConfig = LimitsConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    retry: RetryConfig = RetryConfig()
    health: HealthConfig = HealthConfig()
    routing: RoutingConfig = RoutingConfig()
    keys: tuple[ClientKeyConfig, ...] = ()
    sharing: SharingConfig = SharingConfig()
    redis: RedisConfig | None = None
    tracing: TracingConfig | None = None
    pools: Mapping[Annotated[str, Field(pattern=_NAME_PATTERN)], PoolConfig]
    routes: Annotated[tuple[RouteConfig, ...], Field(min_length=1)]
    aliases: Mapping[str, str] = {}
    """Client-facing names for served models, for every route: checked before any route's own."""

    @model_validator(mode="after")
    def _check_references(self) -> GatewayConfig:
        problems: list[str] = []
        for i, route in enumerate(self.routes):
            for j, ref in enumerate(route.pools):
                if ref not in self.pools:
                    problems.append(f"routes.{i}.pools.{j}: unknown pool {ref!r}")
            for j, rule in enumerate(route.rules):
                if rule.pool not in route.pools:
                    problems.append(f"routes.{i}.rules.{j}.pool: {rule.pool!r} is not in this route's pools")
        seen: set[str] = set()
        for pool_name, pool in self.pools.items():
            for j, backend in enumerate(pool.backends):
                name = backend_name(pool_name, j, backend)
                if name in seen:
                    problems.append(f"pools.{pool_name}.backends.{j}.name: duplicate backend name {name!r}")
                seen.add(name)
        for where, aliases in (
            ("aliases", self.aliases),
            *((f"routes.{i}.aliases", r.aliases) for i, r in enumerate(self.routes)),
        ):
            for alias, target in aliases.items():
                if not alias or any(c in alias for c in "*?[") or not target:
                    problems.append(f"{where}.{alias}: an alias is a plain name for a non-empty model name")
        names = [k.name for k in self.keys]
        for name in {x for x in names if names.count(x) > 1}:
            problems.append(f"keys: duplicate key name {name!r}")
        labels = [r.label for r in self.routes]
        for label in {x for x in labels if labels.count(x) > 1}:
            problems.append(f"routes: duplicate route name {label!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def route_for(self, model: str) -> RouteConfig | None:
        """Exact names win over globs; among globs, the first listed wins."""
        for route in self.routes:
            if not route.is_glob and route.model == model:
                return route
        for route in self.routes:
            if route.is_glob and fnmatch.fnmatchcase(model, route.model):
                return route
        return None


def with_inference_pool(config: GatewayConfig, name: str | None, namespace: str | None) -> GatewayConfig:
    """The config with its one `inference_pool` entry renamed (`gateway epp --pool-name`,
    `--pool-namespace`); ValueError when it has none or several."""
    if name is None and namespace is None:
        return config
    found = [(p, i) for p, pool in config.pools.items() for i, b in enumerate(pool.backends) if b.inference_pool]
    if len(found) != 1:
        raise ValueError(
            f"--pool-name/--pool-namespace rename the one backend entry with inference_pool:, and the config has "
            f"{len(found)} (the entry says which engine, model and limits the pool's pods have)"
        )
    (pool_name, index), pool = found[0], config.pools[found[0][0]]
    entry = pool.backends[index]
    assert entry.inference_pool is not None
    update: dict[str, str] = {}
    if name is not None:
        update["name"] = name
    if namespace is not None:
        update["namespace"] = namespace
    ref = InferencePoolRef.model_validate({**entry.inference_pool.model_dump(), **update})
    backends = list(pool.backends)
    backends[index] = entry.model_copy(update={"inference_pool": ref})
    pools = dict(config.pools)
    pools[pool_name] = pool.model_copy(update={"backends": tuple(backends)})
    return config.model_copy(update={"pools": pools})


def backend_name(pool: str, index: int, backend: BackendConfig) -> str:
    return backend.name or f"{pool}-{index}"
