"""DNS discovery: a `discover: true` backend entry's members are the addresses its host name
resolves to (Kubernetes headless Services). A member that leaves DNS is retired: it takes no new
requests and leaves the registry when its last one ends."""

from __future__ import annotations

import asyncio
import logging
import socket

from gateway.fleet.registry import Backend, Discovered, Registry

log = logging.getLogger(__name__)


def apply_discovery(registry: Registry, entry: Discovered, addresses: list[str]) -> tuple[list[Backend], list[Backend]]:
    """Make the entry's members exactly `addresses`: (added, removed). A removed member with
    requests in flight is retired and leaves the registry when its last request ends."""
    added: list[Backend] = []
    removed: list[Backend] = []
    for address, member in list(entry.members.items()):
        if not registry.holds(member):
            del entry.members[address]
    for address in addresses:
        backend = entry.members.get(address)
        if backend is not None:
            backend.retired = False  # back in DNS before its last request ended
            continue
        backend = entry.members[address] = registry.make_member(entry, address)
        added.append(backend)
    for address, backend in list(entry.members.items()):
        if address not in addresses and not backend.retired:
            backend.retired = True
            removed.append(backend)
            registry.drop_if_idle(backend)
    return added, removed


async def resolve(entry: Discovered, timeout_s: float) -> list[str] | None:
    """The addresses the entry's host name resolves to; None when the lookup failed (the caller
    keeps the members it had: DNS trouble must not empty a pool)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            infos = await loop.getaddrinfo(entry.host, entry.port, type=socket.SOCK_STREAM)
    except (OSError, TimeoutError) as exc:
        log.warning("cannot resolve %s for pool %s: %s", entry.host, entry.pool, exc)
        return None
    return sorted({str(info[4][0]) for info in infos})
