"""`gateway plan`: each backend's engine launch command with the route's context cap pushed down
in the engine's own flag, and the KV memory that cap implies."""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from engines.adapters import adapter_for
from engines.base import LaunchSpec
from gateway.config import GatewayConfig, backend_name
from gateway.policy import kv
from gateway.tools.hfconfig import load_hf_config


def pool_caps(config: GatewayConfig) -> dict[str, int | None]:
    """The largest cap of any route that may send to each pool (None: some route has no cap)."""
    caps: dict[str, int | None] = {}
    for route in config.routes:
        for pool in route.pools:
            cap = route.caps.max_context_tokens
            if pool not in caps:
                caps[pool] = cap
            elif caps[pool] is not None:
                caps[pool] = None if cap is None else max(cap, caps[pool] or 0)
    return caps


def render_plan(config: GatewayConfig, kv_config: str | None = None, parallel: int = 4) -> str:
    spec = kv.kv_spec_from_hf_config(load_hf_config(kv_config)) if kv_config else None
    caps = pool_caps(config)
    lines: list[str] = []
    for pool_name, pool in config.pools.items():
        cap = caps.get(pool_name)
        adapter = adapter_for(pool.engine)  # sim: no launch command
        for i, backend in enumerate(pool.backends):
            url = urlsplit(backend.url)
            port = url.port or (443 if url.scheme == "https" else 80)
            launch = LaunchSpec(
                model=backend.model or "MODEL",
                host=url.hostname or "127.0.0.1",
                port=port,
                max_context_tokens=cap,
                parallel=parallel,
            )
            argv = adapter.launch_argv(launch)
            name = backend_name(pool_name, i, backend)
            lines.append(
                f"# {name}: pool {pool_name}, engine {pool.engine}, "
                f"cap {cap if cap is not None else 'none (engine default)'}"
            )
            lines.append(shlex.join(argv) if argv else "# (no launch command: an external server)")
            if spec is not None and cap is not None:
                per_seq = kv.bytes_per_sequence(spec, cap)
                lines.append(
                    f"# KV cache: {per_seq / kv.GB:.2f} GB per sequence at the cap, "
                    f"{per_seq * parallel / kv.GB:.2f} GB for {parallel} concurrent sequences"
                )
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
