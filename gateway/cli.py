"""argv -> subcommands: serve, epp, check, plan, kv, explain, sim, demo, bench. The only module that reads argv."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from gateway.bench import command as bench_command
from gateway.config import GatewayConfig, with_inference_pool
from gateway.config_loader import ConfigError, load_config
from gateway.tools import kvcommand

DEFAULT_CONFIG = "gateway.yaml"
# Each engine's own default port, as the shipped gateway.yaml expects it: `gateway sim --flavour X` then
# `gateway serve` needs no config change.
SIM_DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000, "llamacpp": 8080}


def _load(path: str) -> GatewayConfig | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"{path}: invalid config", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return None


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _serving(main: Coroutine[Any, Any, None], port: int) -> int:
    """Run a serving command to its end: Ctrl-C (once or twice) is a normal stop, and a port that
    cannot be bound is one line on stderr and exit 1, never a traceback."""
    from gateway.pipeline.chat_tokenizer import TokenizerError
    from gateway.serving.server import ListenError, port_in_use, run

    try:
        with contextlib.suppress(KeyboardInterrupt):
            run(main)
    except (ListenError, TokenizerError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the simulator binds with asyncio.start_server
        if exc.errno != errno.EADDRINUSE:
            raise
        print(f"gateway: {port_in_use(port)}", file=sys.stderr)
        return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.serving.server import configure_logging, serve

    config = _load(args.config)
    if config is None:
        return 1
    configure_logging(args.log_level)
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    return _serving(serve(config, host, port, log_level=args.log_level, config_path=args.config), port)


def cmd_epp(args: argparse.Namespace) -> int:
    """The routing as Envoy's ext_proc service; needs the `epp` extra (grpcio, protobuf)."""
    import asyncio

    from gateway.serving.server import configure_logging

    config = _load(args.config)
    if config is None:
        return 1
    try:
        config = with_inference_pool(config, args.pool_name, args.pool_namespace)
    except ValueError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    try:
        from gateway.epp.server import EppListenError, run_epp
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("grpc", "google"):
            raise
        print(f"gateway: {exc.name} is missing: pip install 'llm-gateway[epp]'", file=sys.stderr)
        return 1
    from gateway.pipeline.chat_tokenizer import TokenizerError

    configure_logging(args.log_level)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_epp(config, args.host, args.port, args.metrics_port))
    except (EppListenError, TokenizerError) as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    config = _load(args.file)
    if config is None:
        return 1
    from gateway.app.build import pool_tokenizers
    from gateway.pipeline.chat_tokenizer import TokenizerError

    try:
        pool_tokenizers(config)  # files a pool names: read now, as `serve` would
    except TokenizerError as exc:
        print(f"{args.file}: invalid config\n  {exc}", file=sys.stderr)
        return 1
    backends = sum(len(p.backends) for p in config.pools.values())
    sizes = ((len(config.pools), "pool"), (backends, "backend"), (len(config.routes), "route"))
    counts = ", ".join(_count(n, word) for n, word in sizes)
    print(f"{args.file}: OK ({counts})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from gateway.tools.plan import backend_windows, render_plan

    config = _load(args.config)
    if config is None:
        return 1
    windows = backend_windows(config, offline=args.offline)
    print(render_plan(config, kv_config=args.model_config, parallel=args.parallel, windows=windows))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from gateway.tools.explain import explain

    config = _load(args.config)
    if config is None:
        return 1
    raw = sys.stdin.buffer.read() if args.body == "-" else Path(args.body).read_bytes()
    print(json.dumps(explain(config, raw, args.kind, platform=args.platform), indent=2))
    return 0


def cmd_sim(args: argparse.Namespace) -> int:
    from engines.sim.server import SimParams, run_sim
    from gateway.serving.server import configure_logging

    configure_logging(args.log_level)
    overrides = {"flavour": args.flavour, "model": args.model}
    if args.context_limit:
        overrides["context_limit"] = args.context_limit
    if args.fault:
        overrides["fault"] = args.fault
    params = SimParams.preset(args.preset, **overrides)
    port = SIM_DEFAULT_PORTS[args.flavour] if args.port is None else args.port
    banner = (
        f"simulated {args.flavour} engine (a simulator, not a real engine) on "
        f"http://{args.host}:{port}, model {args.model!r}, preset {args.preset!r}"
    )
    return _serving(run_sim(params, args.host, port, banner), port)


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.serving.server import configure_logging
    from gateway.tools.demo import run_demo

    configure_logging(args.log_level)
    return _serving(run_demo(args.host, args.port, log_level=args.log_level), args.port)


def cmd_keys(args: argparse.Namespace) -> int:
    from gateway.tools import keyscommand

    config = _load(args.config)
    if config is None:
        return 1
    return keyscommand.run(config, args.url)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway", description="A unified OpenAI-compatible LLM gateway.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the gateway")
    s.add_argument("--config", default=DEFAULT_CONFIG)
    s.add_argument("--host", default=None)
    s.add_argument("--port", type=int, default=None)
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=cmd_serve)

    ep = sub.add_parser("epp", help="serve the routing to Envoy as its ext_proc service (the `epp` extra)")
    ep.add_argument("--config", default=DEFAULT_CONFIG)
    ep.add_argument("--host", default="127.0.0.1")
    ep.add_argument("--port", type=int, default=9002, help="the gRPC port (default 9002)")
    ep.add_argument("--metrics-port", type=int, default=None, help="serve GET /metrics on this port")
    ep.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    ep.add_argument("--pool-name", default=None, help="the InferencePool (overrides the inference_pool entry's name)")
    ep.add_argument("--pool-namespace", default=None, help="its namespace (unset: the entry's, else $NAMESPACE)")
    ep.add_argument(
        "--pool-group",
        default="inference.networking.k8s.io",
        choices=["inference.networking.k8s.io"],
        help="the InferencePool's API group (v1 only)",
    )
    ep.set_defaults(func=cmd_epp)

    c = sub.add_parser("check", help="validate a config file")
    c.add_argument("file", nargs="?", default=DEFAULT_CONFIG)
    c.set_defaults(func=cmd_check)

    pl = sub.add_parser("plan", help="print each backend's launch command with the cap pushed down")
    pl.add_argument("--config", default=DEFAULT_CONFIG)
    pl.add_argument("--model-config", default=None, help="a Hugging Face config.json, to size the KV cache")
    pl.add_argument("--parallel", type=int, default=4, help="concurrent sequences per backend")
    pl.add_argument(
        "--offline", action="store_true", help="do not ask running engines for their context window (1 s each)"
    )
    pl.set_defaults(func=cmd_plan)

    k = sub.add_parser("kv", help="KV-cache memory a context cap implies")
    kvcommand.add_arguments(k)
    k.set_defaults(func=kvcommand.run)

    ks = sub.add_parser("keys", help="each client key's token budgets and its spend this period")
    ks.add_argument("--config", default=DEFAULT_CONFIG)
    ks.add_argument("--url", default=None, help="the gateway to ask without redis: (default: server.host:port)")
    ks.set_defaults(func=cmd_keys)

    e = sub.add_parser("explain", help="show how a request body would be routed, without sending it")
    e.add_argument("body", help="a JSON request body file, or - for stdin")
    e.add_argument("--config", default=DEFAULT_CONFIG)
    e.add_argument("--kind", default="chat", choices=["chat", "completions", "embeddings", "messages"])
    e.add_argument("--platform", default=None, choices=["mac", "no_nvidia_gpu", "nvidia_gpu"])
    e.set_defaults(func=cmd_explain)

    sm = sub.add_parser("sim", help="run a simulated engine (a simulator, not a real engine)")
    sm.add_argument("--flavour", default="vllm", choices=["vllm", "sglang", "llamacpp"], help="the engine it imitates")
    sm.add_argument("--host", default="127.0.0.1", help="listen address")
    sm.add_argument("--port", type=int, default=None, help="listen port; default the engine's own (8000, 30000, 8080)")
    sm.add_argument("--model", default="tiny", help="the model name it serves")
    sm.add_argument("--preset", default="demo", choices=["demo", "fast", "seed"], help="speed and sizes")
    sm.add_argument("--context-limit", type=int, default=None, help="context limit in tokens (the preset's: 4096)")
    sm.add_argument("--fault", default="", help="default fault spec, as in the x-sim-fault header")
    sm.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    sm.set_defaults(func=cmd_sim)

    d = sub.add_parser("demo", help="the gateway in front of three simulated engines")
    d.add_argument("--host", default="127.0.0.1")
    d.add_argument("--port", type=int, default=4000)
    d.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    d.set_defaults(func=cmd_demo)

    b = sub.add_parser("bench", help="measure per-request speed and aggregate throughput, level by level")
    bench_command.add_arguments(b)
    b.set_defaults(func=bench_command.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
