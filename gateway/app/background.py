"""Start and stop a built gateway's connections and background work: one health round before
serving, then the health checks, the load scrapes, the InferencePool followers and the KV-event
subscribers as tasks. `gateway serve` (through the app's lifespan) and `gateway epp` both start
and stop theirs here."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.app.instance import Gateway

log = logging.getLogger(__name__)


async def start_gateway(gw: Gateway) -> list[asyncio.Task[None]]:
    """Start a built gateway's connections and background work (health, load scrapes, KV events);
    the tasks to hand to stop_gateway. `gateway serve` (through lifespan) and `gateway epp` both
    start theirs here."""
    await gw.upstream.start()
    # One health round before serving, so /readyz and routing are right from the first request.
    await gw.health.check_all()
    for backend in gw.registry:
        if not backend.healthy:
            log.warning(
                "backend %s (pool %s, %s) is not healthy at start-up: %s%s does not answer 2xx",
                backend.name,
                backend.pool,
                backend.engine,
                backend.url,
                backend.adapter.health_path,
            )
    tasks = [
        asyncio.create_task(gw.health.run(), name="health"),
        asyncio.create_task(gw.scraper.run(), name="scraper"),
    ]
    for follower in gw.pool_followers:  # readiness waits for each one's first list
        tasks.append(asyncio.create_task(follower.run(), name=f"inference-pool {follower.label}"))
    if gw.kv_events is not None:
        tasks += gw.kv_events.start()
        for name, sub in gw.kv_events.subscribers.items():
            log.info("backend %s streams KV events from %s", name, sub.endpoint)
        for name, pool in gw.config.pools.items():
            if pool.tokenizer is not None:
                log.info("pool %s encodes prompts for the KV match with the tokenizer in %s", name, pool.tokenizer)
    return tasks


async def stop_gateway(gw: Gateway, tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if gw.tokens is not None:
        await gw.tokens.close()
    if gw.kv_events is not None:
        gw.kv_events.close()
    await gw.upstream.close()
    await gw.access.close()
