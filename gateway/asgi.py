"""The ASGI types, declared once for the whole gateway (they are starlette's own)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ASGIApp", "Message", "Receive", "Scope", "Send"]
