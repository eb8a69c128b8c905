"""The only owner of mutable backend state: health, in-flight counts, the last scraped load,
and the retry budget. Everything else reads snapshots of it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from engines.adapters import adapter_for
from engines.base import EngineAdapter, EngineLoad
from gateway.config import BackendConfig, GatewayConfig, backend_name
from gateway.policy.balancer import Candidate


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
    healthy: bool = False
    checked: bool = False
    consecutive_failures: int = 0
    failed_checks: int = 0
    in_flight: int = 0
    load: EngineLoad | None = None
    labels: dict[str, str] = field(default_factory=dict)
    retired: bool = False
    readmitted_at: float | None = None
    """time.monotonic() of the return from an outage, for slow start."""
    """Gone from DNS: takes no new requests, and leaves the registry when its last one ends."""

    def auth_headers(self) -> dict[str, str]:
        """The backend's own key, for every call the gateway makes to it."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

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
        )


@dataclass(eq=False)
class Discovered:
    """A `discover: true` backend entry: its members are the addresses its host name resolves to."""

    pool: str
    base: str
    config: BackendConfig
    adapter: EngineAdapter
    members: dict[str, Backend] = field(default_factory=dict)
    """address -> the backend made for it"""

    @property
    def host(self) -> str:
        return urlsplit(self.config.url).hostname or ""

    @property
    def port(self) -> int:
        url = urlsplit(self.config.url)
        return url.port or (443 if url.scheme == "https" else 80)

    @staticmethod
    def suffix(address: str) -> str:
        return address.replace(":", "-")

    def member_name(self, address: str) -> str:
        return f"{self.base}-{self.suffix(address)}"

    def url_for(self, address: str) -> str:
        url = urlsplit(self.config.url.rstrip("/"))
        host = f"[{address}]" if ":" in address else address
        return urlunsplit((url.scheme, f"{host}:{self.port}", url.path, "", ""))


class Registry:
    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self.pools: dict[str, list[Backend]] = {}
        self.by_name: dict[str, Backend] = {}
        self.discovered: list[Discovered] = []
        for pool_name, pool in config.pools.items():
            members = []
            # A simulator speaks one real engine's API exactly, so it is driven by that adapter.
            adapter = adapter_for(pool.flavour if pool.engine == "sim" else pool.engine)
            for i, b in enumerate(pool.backends):
                if b.discover:
                    self.discovered.append(Discovered(pool_name, backend_name(pool_name, i, b), b, adapter))
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
                )
                members.append(backend)
                self.by_name[backend.name] = backend
            self.pools[pool_name] = members
        self.total_in_flight = 0
        self.retries_in_flight = 0
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {name: deque() for name in self.pools}
        self.queued = 0

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.by_name.values())

    def pool_available(self, pool: str) -> bool:
        return any(b.healthy and not b.retired for b in self.pools.get(pool, ()))

    def any_healthy(self) -> bool:
        return any(b.healthy for b in self.by_name.values())

    def candidates(self, pool: str, now: float) -> list[Candidate]:
        stale = self._config.health.scrape_stale_s
        slow = self._config.health.slow_start_s
        return [b.candidate(now, stale, slow) for b in self.pools.get(pool, ()) if b.healthy and not b.retired]

    def apply_discovery(self, entry: Discovered, addresses: list[str]) -> tuple[list[Backend], list[Backend]]:
        """Make the entry's members exactly `addresses`: (added, removed). A removed member with
        requests in flight is retired and leaves the registry when its last request ends."""
        added: list[Backend] = []
        removed: list[Backend] = []
        for address, member in list(entry.members.items()):
            if self.by_name.get(member.name) is not member:
                del entry.members[address]
        for address in addresses:
            backend = entry.members.get(address)
            if backend is not None:
                backend.retired = False  # back in DNS before its last request ended
                continue
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
            )
            entry.members[address] = backend
            self.pools[entry.pool].append(backend)
            self.by_name[backend.name] = backend
            added.append(backend)
        for address, backend in list(entry.members.items()):
            if address not in addresses and not backend.retired:
                backend.retired = True
                removed.append(backend)
                self._drop_if_idle(backend)
        return added, removed

    def _drop_if_idle(self, backend: Backend) -> None:
        if backend.retired and backend.in_flight == 0 and self.by_name.get(backend.name) is backend:
            del self.by_name[backend.name]
            self.pools[backend.pool].remove(backend)

    def has_capacity(self, backend: Backend) -> bool:
        return backend.max_in_flight is None or backend.in_flight < backend.max_in_flight

    def acquire(self, backend: Backend) -> None:
        backend.in_flight += 1
        self.total_in_flight += 1

    def release(self, backend: Backend) -> None:
        backend.in_flight -= 1
        self.total_in_flight -= 1
        self._drop_if_idle(backend)
        self._wake(backend.pool)

    def _wake(self, pool: str) -> None:
        waiters = self._waiters.get(pool)
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def wait_for_slot(self, pool: str, timeout_s: float, max_queue: int) -> bool:
        """Queue FIFO until a backend of `pool` releases a slot; False when the queue is full or
        the wait timed out. The caller re-plans: the slot is not reserved for it."""
        if self.queued >= max_queue or timeout_s <= 0:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[pool].append(waiter)
        self.queued += 1
        try:
            await asyncio.wait_for(waiter, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            self.queued -= 1
            if not waiter.done():
                waiter.cancel()

    # Passive health: connect errors and 5xx count; a 4xx is the client's fault, not the backend's.
    def record_failure(self, backend: Backend) -> bool:
        """Returns True when this failure ejected the backend."""
        backend.consecutive_failures += 1
        if backend.healthy and backend.consecutive_failures >= self._config.health.unhealthy_after:
            backend.healthy = False
            return True
        return False

    def record_success(self, backend: Backend) -> None:
        backend.consecutive_failures = 0

    def set_health(self, backend: Backend, healthy: bool, now: float | None = None) -> None:
        if healthy and not backend.healthy:
            backend.consecutive_failures = 0
            if backend.checked and now is not None:  # back from an outage (not the first admission)
                backend.readmitted_at = now
        backend.checked = True
        backend.healthy = healthy

    def record_check(self, backend: Backend, ok: bool, now: float | None = None) -> None:
        """One active health check's result. A backend never checked before takes the result at once
        (start-up); a healthy one is marked down only after `failed_checks` failures in a row."""
        if ok:
            backend.failed_checks = 0
            self.set_health(backend, True, now)
            return
        backend.failed_checks += 1
        if not backend.checked or not backend.healthy or backend.failed_checks >= self._config.health.failed_checks:
            self.set_health(backend, False)

    def set_load(self, backend: Backend, load: EngineLoad) -> None:
        backend.load = load

    # The retry budget (docs/reliability.md item 19: 20 % of in-flight requests, floor 3) stops retry storms.
    def try_take_retry(self) -> bool:
        retry = self._config.retry
        allowed = max(retry.budget_min, int(retry.budget_ratio * self.total_in_flight))
        if self.retries_in_flight >= allowed:
            return False
        self.retries_in_flight += 1
        return True

    def give_back_retry(self) -> None:
        self.retries_in_flight -= 1
