"""Whether this gateway process is draining for shutdown: set on SIGTERM/SIGINT, read by the
readiness endpoint (which then fails, so load balancers stop sending) and by the handler."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Lifecycle:
    draining: bool = False
