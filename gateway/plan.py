"""`gateway plan`: each backend's engine launch command with the route's context cap pushed down
in the engine's own flag, the KV memory that cap implies, and a warning when the cap is over the
model's own context window."""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from engines.adapters import adapter_for
from engines.base import LaunchSpec
from gateway import kv
from gateway.config import GatewayConfig, backend_name

MODEL_PATH = "<MODEL_PATH>"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def bind_host(url_host: str | None) -> str:
    """Where the engine should listen for the gateway to reach it at `url_host`: loopback stays
    loopback; a service name or another machine's address means every interface (0.0.0.0), since
    an engine cannot bind a DNS name such as compose's `vllm`."""
    if not url_host or url_host in _LOOPBACK:
        return "127.0.0.1"
    return "::" if ":" in url_host else "0.0.0.0"


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
    spec = kv.kv_spec_from_hf_config(kv.load_hf_config(kv_config)) if kv_config else None
    window = spec.max_context if spec is not None else None
    caps = pool_caps(config)
    lines: list[str] = [
        f"# {MODEL_PATH}: the model's weights (a Hugging Face id or a local directory; for llama.cpp a .gguf file)",
        "",
    ]
    for pool_name, pool in config.pools.items():
        cap = caps.get(pool_name)
        adapter = adapter_for(pool.engine)  # sim: no launch command
        for i, backend in enumerate(pool.backends):
            url = urlsplit(backend.url)
            port = url.port or (443 if url.scheme == "https" else 80)
            launch = LaunchSpec(
                model=MODEL_PATH,
                host=bind_host(url.hostname),
                port=port,
                max_context_tokens=cap,
                parallel=parallel,
                served_name=backend.model,
            )
            argv = adapter.launch_argv(launch)
            name = backend_name(pool_name, i, backend)
            lines.append(
                f"# {name}: pool {pool_name}, engine {pool.engine}, "
                f"cap {cap if cap is not None else 'none (engine default)'}"
            )
            if cap is not None and window is not None and cap > window:
                lines.append(
                    f"# WARNING: the cap ({cap:,} tokens) is over the model's context window ({window:,}, its "
                    "max_position_embeddings): vLLM and SGLang refuse to start with it, llama.cpp serves past "
                    f"what the model was trained for. Set the routes' max_context_tokens to {window} or less."
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
