"""Membership: the backends of each pool (configured, or discovered in DNS), and their state
record (health flags, in-flight count, last scraped load). Capacity, health transitions and
discovery are their own modules (fleet/capacity.py, fleet/health.py, fleet/discovery.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from engines.adapters import adapter_for
from engines.base import EngineAdapter, EngineLoad, ServedModel
from gateway.config import BackendConfig, GatewayConfig, backend_name
from gateway.policy.balancer import Candidate
from gateway.policy.models import EMPTY_INDEX, ModelIndex, build_index


@dataclass(eq=False)
class Backend:
    pool: str
    name: str
    engine: str
    url: str
    api_key: str | None
    model: str | None
    max_in_flight: int | None
    adapter: EngineAdapter
    context_window: int | None = None
    """The config's `context_window:`; wins over a discovered one."""
    discover_models: bool = True
    """Whether fleet/catalog.py asks the engine what it serves."""
    served: tuple[ServedModel, ...] = ()
    """What the engine's /v1/models last listed (fleet/catalog.py)."""
    names: tuple[str, ...] = ()
    """The model names it serves: the config's `model:`, else the discovered ids."""
    window: int | None = None
    """Its context window in tokens: the config's, else the discovered one of the model it serves."""
    healthy: bool = False
    checked: bool = False
    consecutive_failures: int = 0
    failed_checks: int = 0
    in_flight: int = 0
    decided: int = 0
    """Requests routed here whose attempt has not started (pipeline/router.py's kv_events plans)."""
    load: EngineLoad | None = None
    in_flight_at_scrape: int = 0
    """in_flight when `load` was taken: the engine's count less this is what other clients (other
    gateway replicas among them) had on it then."""
    labels: dict[str, str] = field(default_factory=dict)
    retired: bool = False
    readmitted_at: float | None = None
    """time.monotonic() of the return from an outage, for slow start."""
    """Gone from DNS: takes no new requests, and leaves the registry when its last one ends."""

    def __post_init__(self) -> None:
        self.set_served(self.served)

    def set_served(self, served: tuple[ServedModel, ...]) -> None:
        """Take what discovery found; the names and the window follow (the config's win)."""
        self.served = served
        self.names = (self.model,) if self.model else tuple(m.id for m in served)
        found = next((m for m in served if m.id == self.model), None) if self.model else None
        if found is None and len(served) == 1:
            found = served[0]
        self.window = self.context_window or (found.window if found else None)

    def auth_headers(self) -> dict[str, str]:
        """The backend's own key, for every call the gateway makes to it."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def has_room(self, held_back: int = 0) -> bool:
        """Below its max_in_flight (or it has none), less `held_back` slots kept for higher classes;
        the last slot is never held back."""
        limit = self.max_in_flight
        if limit is None:
            return True
        return self.in_flight < (max(1, limit - held_back) if held_back else limit)

    def candidate(self, now: float, stale_s: float, slow_start_s: float = 0.0) -> Candidate:
        fresh = self.load is not None and now - self.load.scraped_at <= stale_s
        ramp = 1.0
        if self.readmitted_at is not None and slow_start_s > 0:
            ramp = min(1.0, max(0.0, (now - self.readmitted_at) / slow_start_s))
        return Candidate(
            name=self.name,
            in_flight=self.in_flight,
            load=self.load,
            load_fresh=fresh,
            max_in_flight=self.max_in_flight,
            ramp=ramp,
            decided=self.decided,
            in_flight_at_scrape=self.in_flight_at_scrape,
        )


@dataclass(eq=False)
class Discovered:
    """A `discover: true` backend entry: its members are the addresses its host name resolves to
    (fleet/discovery.py keeps them current); or an `inference_pool` entry, whose members are its
    pods' `ip:port` endpoints (fleet/inference_pool.py)."""

    pool: str
    base: str
    config: BackendConfig
    adapter: EngineAdapter
    members: dict[str, Backend] = field(default_factory=dict)
    """address -> the backend made for it"""
    synced: bool = True
    """False for an `inference_pool` entry until its first list of pods has been applied."""

    @property
    def host(self) -> str:
        return urlsplit(self.config.url).hostname or ""

    @property
    def port(self) -> int:
        url = urlsplit(self.config.url)
        return url.port or (443 if url.scheme == "https" else 80)

    @staticmethod
    def suffix(address: str) -> str:
        return address.replace("[", "").replace("]", "").replace(":", "-")

    def member_name(self, address: str) -> str:
        return f"{self.base}-{self.suffix(address)}"

    def url_for(self, address: str) -> str:
        if self.config.inference_pool is not None:  # the address is a pod's ip:port
            return f"http://{address}"
        url = urlsplit(self.config.url.rstrip("/"))
        host = f"[{address}]" if ":" in address else address
        return urlunsplit((url.scheme, f"{host}:{self.port}", url.path, "", ""))


class Registry:
    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self.pools: dict[str, list[Backend]] = {}
        self.by_name: dict[str, Backend] = {}
        self.discovered: list[Discovered] = []
        self.pool_entries: list[Discovered] = []
        """`inference_pool` entries: their members come from the Kubernetes API, not DNS."""
        self.models: ModelIndex = EMPTY_INDEX
        """Model name -> pool -> serving backends; replaced whole by fleet/catalog.py on a change."""
        for pool_name, pool in config.pools.items():
            members = []
            # A simulator speaks one real engine's API exactly, so it is driven by that adapter.
            adapter = adapter_for(pool.flavour if pool.engine == "sim" else pool.engine)
            for i, b in enumerate(pool.backends):
                if b.discover or b.inference_pool is not None:
                    entries = self.discovered if b.discover else self.pool_entries
                    entry = Discovered(pool_name, backend_name(pool_name, i, b), b, adapter, synced=b.discover)
                    entries.append(entry)
                    continue
                backend = Backend(
                    pool=pool_name,
                    name=backend_name(pool_name, i, b),
                    engine=pool.engine,
                    url=b.url.rstrip("/"),
                    api_key=(b.api_key.get_secret_value() or None) if b.api_key else None,
                    model=b.model,
                    max_in_flight=b.max_in_flight,
                    adapter=adapter,
                    context_window=b.context_window,
                    discover_models=b.discover_models,
                )
                members.append(backend)
                self.by_name[backend.name] = backend
            self.pools[pool_name] = members
        self.rebuild_models()

    def rebuild_models(self) -> None:
        """The model index from every member's names: after discovery or membership changed, never
        per request."""
        self.models = build_index((b.pool, b.name, b.names) for b in self.by_name.values())

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.by_name.values())

    def pool_available(self, pool: str) -> bool:
        return any(b.healthy and not b.retired for b in self.pools.get(pool, ()))

    def synced(self) -> bool:
        """Every `inference_pool` entry has applied its first list (readiness waits for it)."""
        return all(e.synced for e in self.pool_entries)

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.by_name.values())

    def candidates(self, pool: str, now: float) -> list[Candidate]:
        stale = self._config.health.scrape_stale_s
        slow = self._config.health.slow_start_s
        return [b.candidate(now, stale, slow) for b in self.pools.get(pool, ()) if b.healthy and not b.retired]

    def make_member(self, entry: Discovered, address: str) -> Backend:
        """A backend for one address of a `discover: true` entry, added to its pool."""
        cfg = entry.config
        backend = Backend(
            pool=entry.pool,
            name=entry.member_name(address),
            engine=self._config.pools[entry.pool].engine,
            url=entry.url_for(address),
            api_key=(cfg.api_key.get_secret_value() or None) if cfg.api_key else None,
            model=cfg.model,
            max_in_flight=cfg.max_in_flight,
            adapter=entry.adapter,
            context_window=cfg.context_window,
            discover_models=cfg.discover_models,
        )
        self.pools[entry.pool].append(backend)
        self.by_name[backend.name] = backend
        self.rebuild_models()
        return backend

    def holds(self, backend: Backend) -> bool:
        return self.by_name.get(backend.name) is backend

    def drop_if_idle(self, backend: Backend) -> None:
        """A retired backend leaves once its last request has ended."""
        if backend.retired and backend.in_flight == 0 and self.by_name.get(backend.name) is backend:
            del self.by_name[backend.name]
            self.pools[backend.pool].remove(backend)
            self.rebuild_models()

    def set_load(self, backend: Backend, load: EngineLoad) -> None:
        backend.load = load
        backend.in_flight_at_scrape = backend.in_flight
