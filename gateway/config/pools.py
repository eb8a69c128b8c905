"""A pool's section of gateway.yaml: its engine, balancer and backends (URLs, discovery, KV-event
streams, Kubernetes InferencePools), and the name each backend goes by."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from gateway.config.schema import NAME_PATTERN, BalancerKind, EngineKind, Section, http_url


class KVEventsSource(Section):
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


class InferencePoolRef(Section):
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
        return http_url(url, "api_server")


class BackendConfig(Section):
    url: str = ""
    """Required unless `inference_pool` names where the members come from."""
    name: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
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


class PoolConfig(Section):
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
    kv_saturation_waiting: Annotated[int, Field(ge=1)] | None = None
    """kv_events: an engine reporting this many queued requests (a fresh scrape) while it carries
    more than the pool's mean load is saturated. Unset: the load bound alone decides, which kept
    more of the cache at the same balance where the gateway sees every request
    (docs/routing-benchmark.md); set it where engines also serve traffic the gateway does not see."""
    kv_saturation_kv_usage: Annotated[float, Field(gt=0, le=1)] | None = None
    """kv_events: an engine reporting its KV cache this full (a fresh scrape) while it carries more
    than the pool's mean load is saturated. Unset, as kv_saturation_waiting."""
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


def backend_name(pool: str, index: int, backend: BackendConfig) -> str:
    return backend.name or f"{pool}-{index}"
