"""Gateway: everything one running gateway owns, as build.py assembles it (the composition root)
and as start_gateway, the endpoints and the tests reach it (app.state.gateway)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.access.gate import AccessGate
from gateway.config import GatewayConfig
from gateway.fleet.capacity import Capacity
from gateway.fleet.health import HealthChecker, HealthState
from gateway.fleet.registry import Registry
from gateway.fleet.scraper import LoadScraper
from gateway.metrics import GatewayMetrics
from gateway.pipeline.accounting import Accounting
from gateway.pipeline.admission import Admission
from gateway.pipeline.attempts import Attempts
from gateway.pipeline.enforcer import CapEnforcer
from gateway.pipeline.lifecycle import Lifecycle
from gateway.pipeline.prompt_tokens import PromptTokens
from gateway.pipeline.relay import Relay
from gateway.pipeline.router import Router
from gateway.protocols.response_store import ResponseStore
from gateway.tracing.base import NoTracing, Tracing
from gateway.upstream.client import UpstreamClient

if TYPE_CHECKING:
    from gateway.fleet.inference_pool import PoolFollower
    from gateway.fleet.kvevents.fleet import KVEventFleet


@dataclass
class Gateway:
    """Everything one running gateway owns; reachable as app.state.gateway for tests."""

    config: GatewayConfig
    metrics: GatewayMetrics
    registry: Registry
    capacity: Capacity
    health_state: HealthState
    upstream: UpstreamClient
    router: Router
    caps: CapEnforcer
    accounting: Accounting
    admission: Admission
    relay: Relay
    attempts: Attempts
    health: HealthChecker
    scraper: LoadScraper
    lifecycle: Lifecycle
    access: AccessGate
    responses: ResponseStore
    """Responses id -> the backend that holds it (kept across reloads)."""
    kv_events: KVEventFleet | None = None
    """The backends' KV-event subscribers; None unless a backend names `kv_events`."""
    tokens: PromptTokens | None = None
    tracing: Tracing = field(default_factory=lambda: NoTracing())
    """The tracer (NoTracing when tracing is off); built once per process, kept across reloads."""
    pool_followers: list[PoolFollower] = field(default_factory=list)
    """One per `inference_pool` backend entry: its pods, listed and watched."""
