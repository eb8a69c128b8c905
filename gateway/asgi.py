"""The ASGI types, declared once for the whole gateway (they are starlette's own), and the one scope
key the gateway's server adds."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ARRIVED", "ASGIApp", "Message", "Receive", "Scope", "Send"]

ARRIVED = "gateway.arrived"
"""`time.perf_counter()` when the request's first byte was parsed (serving/protocol.py sets it; the
endpoint starts the request's clock there)."""
