"""Every backend's KV-event subscriber and index, for the backends whose config names a `kv_events`
source: started in lifespan, matched against a prompt's token ids at routing time, and exported
as metrics (a collector read at scrape time, so the subscribers count with plain integers)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.config import GatewayConfig, backend_name
from gateway.fleet.kvevents.chains import ChainCache
from gateway.fleet.kvevents.index import EngineIndex
from gateway.fleet.kvevents.subscriber import EventSubscriber
from gateway.metrics import GatewayMetrics
from gateway.policy.cached_prefix import CachedPrefix, PromptBlocks

PENDING_S: Final = 10.0
"""How long a routed prompt's blocks count as held by the backend it went to before its own events
say so: past the queue wait and prefill of a loaded engine. Events that come sooner make it moot."""
MAX_PENDING: Final = 200_000
"""Pending block keys per backend at most (8 bytes each, ~6 MB): past it, no more are noted."""


def follow(config: GatewayConfig, metrics: GatewayMetrics) -> KVEventFleet | None:
    """The fleet for `config`'s event sources (None: no backend names one), counted in `metrics`."""
    if not any(b.kv_events is not None for pool in config.pools.values() for b in pool.backends):
        return None
    fleet = KVEventFleet(config)
    metrics.feature("kv_events", KVEventCollector).fleet = fleet
    return fleet


class KVEventFleet:
    """Backend name -> its subscriber (and index). One ZMQ context for all."""

    def __init__(self, config: GatewayConfig) -> None:
        self._ctx = zmq.asyncio.Context()
        self.subscribers: dict[str, EventSubscriber] = {}
        self._pending: dict[str, dict[int, float]] = {}
        """backend -> block key -> until when it counts as held there (decided())."""
        self._chains = ChainCache()
        for pool_name, pool in config.pools.items():
            engine = pool.flavour if pool.engine == "sim" else pool.engine
            for i, b in enumerate(pool.backends):
                if b.kv_events is None:
                    continue
                name = backend_name(pool_name, i, b)
                self.subscribers[name] = EventSubscriber(
                    self._ctx,
                    b.kv_events.endpoint,
                    index=EngineIndex(),
                    replay_endpoint=b.kv_events.replay_endpoint,
                    topic=b.kv_events.topic,
                    engine=engine,
                    name=name,
                )

    def __contains__(self, name: str) -> bool:
        return name in self.subscribers

    def start(self) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(s.run(), name=f"kv-events:{name}") for name, s in self.subscribers.items()]

    def close(self) -> None:
        """After the tasks are cancelled: their sockets are closed, the context goes."""
        self._ctx.destroy(linger=0)

    def cached(self, names: Iterable[str], tokens: Sequence[int], now: float, whole: bool = True) -> PromptBlocks:
        """How many leading blocks of the prompt each named backend holds, by its events (those
        queued until now applied first) or by this gateway's recent decisions (decided()); keys are
        computed once per block size, not per backend. `whole`: `tokens` are the prompt's own ids,
        not a leading run's."""
        keys: dict[int, list[int]] = {}
        blocks: list[tuple[str, int]] = []
        sizes: list[tuple[str, int]] = []
        prompt_blocks = 0
        for name in names:
            sub = self.subscribers.get(name)
            if sub is None:
                continue
            sub.drain()  # the batches that came since its last drain, so that the match sees them
            size = sub.index.block_size
            if size is None:
                continue
            own = keys.get(size)
            if own is None:
                own = keys[size] = self._chains.keys(tokens, size)
                if len(own) > prompt_blocks:
                    prompt_blocks = len(own)
            blocks.append((name, self._held(name, sub.index, own, now) if own else 0))
            sizes.append((name, size))
        return PromptBlocks(CachedPrefix(tuple(blocks), prompt_blocks, tuple(sizes), whole), keys)

    def _held(self, name: str, index: EngineIndex, keys: Sequence[int], now: float) -> int:
        n = index.match(keys)
        pending = self._pending.get(name)
        if not pending:
            return n
        while n < len(keys) and (pending.get(keys[n], 0.0) > now or index.holds(keys[n])):
            n += 1
        return n

    def decided(self, name: str, prompt: PromptBlocks, now: float) -> None:
        """The prompt was just routed to `name`: until its events can have come (PENDING_S), its
        blocks count as held there, so that the same conversation's next request, sent before the
        engine has prefilled this one, follows it instead of landing elsewhere and caching a copy."""
        sub = self.subscribers.get(name)
        if sub is None or sub.index.block_size is None:
            return
        keys = prompt.keys.get(sub.index.block_size)
        if not keys:
            return
        pending = self._pending.setdefault(name, {})
        if len(pending) + len(keys) > MAX_PENDING:
            for key in [k for k, until in pending.items() if until <= now]:
                del pending[key]
            if len(pending) + len(keys) > MAX_PENDING:
                return
        until = now + PENDING_S
        for key in keys:
            pending[key] = until


class KVEventCollector(Collector):
    """gateway_kv_events_* per backend, read from the subscribers' counters at scrape time. One per
    metrics registry; `fleet` is the serving gateway's (a reload re-points it)."""

    def __init__(self, fleet: KVEventFleet | None = None) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        counters = {
            "batches": "KV-event batches applied (heard or replayed)",
            "events": "KV events applied",
            "gaps": "Sequence gaps detected in a backend's KV-event stream",
            "replays": "Replay requests sent to a backend's replay socket",
            "replayed": "KV-event batches recovered from replay",
            "lost": "KV-event batches neither heard nor replayed (the view may be stale)",
            "restarts": "Engine restarts seen (the sequence went back; the view was reset)",
            "undecodable": "KV-event messages that could not be decoded",
        }
        families = {
            key: CounterMetricFamily(f"gateway_kv_events_{key}", text, labels=["backend"])
            for key, text in counters.items()
        }
        blocks = GaugeMetricFamily(
            "gateway_kv_events_index_blocks", "Blocks a backend's KV events say it holds", labels=["backend"]
        )
        subscribers = self.fleet.subscribers if self.fleet is not None else {}
        for name, sub in subscribers.items():
            for key, family in families.items():
                family.add_metric([name], getattr(sub.stats, key))
            blocks.add_metric([name], len(sub.index))
        yield from families.values()
        yield blocks
