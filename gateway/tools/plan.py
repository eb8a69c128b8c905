"""`gateway plan`: each backend's engine launch command with the route's context cap pushed down
in the engine's own flag, the KV memory that cap implies, and a warning when the cap is over the
model's own context window or the backend's (its `context_window:`, else what the running engine
reports, when the plan can reach it)."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from engines.adapters import adapter_for
from engines.base import LaunchSpec
from gateway.config import BackendConfig, GatewayConfig, backend_name
from gateway.policy import kv
from gateway.tools.hfconfig import load_hf_config

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


def _get_json(url: str, timeout_s: float, key: str | None) -> Any:
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return json.loads(resp.read(4 << 20)) if resp.status == 200 else None
    except (OSError, ValueError, urllib.error.URLError):
        return None


def probe_window(engine: str, backend: BackendConfig, timeout_s: float = 1.0) -> int | None:
    """The context window the running engine reports (as the gateway discovers it), or None when it
    cannot be reached or reports none."""
    if backend.discover or backend.inference_pool is not None:
        return None
    adapter = adapter_for(engine)
    key = backend.api_key.get_secret_value() if backend.api_key else None
    answers = [_get_json(backend.url.rstrip("/") + c.path, timeout_s, key) for c in adapter.models_calls]
    served = adapter.parse_models(answers) or ()
    found = next((m for m in served if m.id == backend.model), None) if backend.model else None
    if found is None and len(served) == 1:
        found = served[0]
    return found.window if found else None


def backend_windows(config: GatewayConfig, offline: bool) -> dict[str, int]:
    """Backend name -> its window: `context_window:` from the config, else (unless offline) probed."""
    out: dict[str, int] = {}
    for pool_name, pool in config.pools.items():
        engine = pool.flavour if pool.engine == "sim" else pool.engine
        for i, b in enumerate(pool.backends):
            window = b.context_window or (None if offline else probe_window(engine, b))
            if window is not None:
                out[backend_name(pool_name, i, b)] = window
    return out


def render_plan(
    config: GatewayConfig,
    kv_config: str | None = None,
    parallel: int = 4,
    windows: Mapping[str, int] | None = None,
) -> str:
    """`windows`: backend name -> its context window (backend_windows); the config's alone when None."""
    if windows is None:
        windows = backend_windows(config, offline=True)
    spec = kv.kv_spec_from_hf_config(load_hf_config(kv_config)) if kv_config else None
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
            # An InferencePool's pods listen on its targetPorts (unknown offline): the engine's own default.
            pod_port = {"sglang": 30000, "llamacpp": 8080}.get(pool.engine, 8000)
            url = urlsplit(backend.url or f"http://0.0.0.0:{pod_port}")
            port = url.port or (443 if url.scheme == "https" else 80)
            name = backend_name(pool_name, i, backend)
            engine_window = windows.get(name)
            eff = cap if engine_window is None or cap is None else min(cap, engine_window)
            launch = LaunchSpec(
                model=MODEL_PATH,
                host=bind_host(url.hostname),
                port=port,
                max_context_tokens=eff,
                parallel=parallel,
                served_name=backend.model,
            )
            argv = adapter.launch_argv(launch)
            lines.append(
                f"# {name}: pool {pool_name}, engine {pool.engine}, "
                f"cap {eff if eff is not None else 'none (engine default)'}"
            )
            if backend.inference_pool is not None:
                lines.append(
                    f"# the pods of InferencePool {backend.inference_pool.name}: --port is its targetPorts' number"
                )
            if engine_window is not None and (cap is None or cap > engine_window):
                lines.append(
                    f"# WARNING: the route's cap ({cap or 'none'}) is over this backend's context window "
                    f"({engine_window:,} tokens): the gateway caps its requests at {engine_window:,}, and this "
                    "command keeps the engine's window as it is. Raise the engine's window to serve more."
                )
            if eff is not None and window is not None and eff > window:
                lines.append(
                    f"# WARNING: the cap ({eff:,} tokens) is over the model's context window ({window:,}, its "
                    "max_position_embeddings): vLLM and SGLang refuse to start with it, llama.cpp serves past "
                    f"what the model was trained for. Set the routes' max_context_tokens to {window} or less."
                )
            lines.append(shlex.join(argv) if argv else "# (no launch command: an external server)")
            if spec is not None and eff is not None:
                per_seq = kv.bytes_per_sequence(spec, eff)
                lines.append(
                    f"# KV cache: {per_seq / kv.GB:.2f} GB per sequence at the cap, "
                    f"{per_seq * parallel / kv.GB:.2f} GB for {parallel} concurrent sequences"
                )
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
