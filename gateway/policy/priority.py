"""Which priority class a request is served in: the key's and the route's classes (the lower of
the two when both are set), or an `x-gateway-priority` header, which may lower it freely and raise
it only up to the key's ceiling. Pure: no I/O."""

from __future__ import annotations

from typing import get_args

from gateway.config import Priority

PRIORITY_HEADER = "x-gateway-priority"
CLASSES: tuple[Priority, ...] = get_args(Priority)
"""Highest first: a class's rank is its index."""
DEFAULT_RANK = CLASSES.index("default")


def rank(name: Priority) -> int:
    return CLASSES.index(name)


def request_rank(
    key_class: Priority | None, key_ceiling: Priority | None, route_class: Priority | None, header: str | None
) -> int:
    """The rank (0 = highest) a request is served at. An unknown header value is ignored, not an
    error: a client that sends a class this gateway lacks still gets served at its own."""
    ranks = [rank(c) for c in (key_class, route_class) if c is not None]
    own = max(ranks) if ranks else DEFAULT_RANK
    if header is None:
        return own
    asked = header.strip().lower()
    if asked not in CLASSES:
        return own
    wanted = CLASSES.index(asked)
    if wanted >= own:
        return wanted  # lowering is always allowed
    ceiling = rank(key_ceiling) if key_ceiling is not None else rank(key_class) if key_class is not None else own
    return max(wanted, min(ceiling, own))
