"""The gateway's own CPU per request, without uvicorn or sockets: the ASGI app is called
directly and the upstream client answers from memory (the run's static bodies). Deterministic enough
to compare two commits in a few seconds, and to profile the gateway's code alone.

PYTHONPATH=TREE python3 benchmarks/overhead/inprocess.py [--requests N] [--stream] [--profile FILE] [--trace R]

It prints CPU µs per request (the best of --repeat runs). --trace R: tracing on, sampling a share R
of the requests, exporting to otlp_sink.py in a process of its own (the exporter's thread is this
process's, and counted). Not a substitute for peers.py: uvicorn and
the sockets are left out here on purpose."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import bodies
import configs


class _Connection:
    """Stands in for an UpstreamConnection whose answer is all in memory."""

    def __init__(self, status: int, body: bytes, ctype: str, chunks: list[bytes] | None = None) -> None:
        self.status = status
        self.headers = {"content-type": ctype, "content-length": str(len(body))}
        self._chunks = list(chunks if chunks is not None else [body])
        self.complete = chunks is None
        self.buffered = 0
        self.reusable = False

    def take(self) -> bytes:
        return b"".join(self._chunks)

    async def read_chunk(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""

    def close(self) -> None:
        pass


def _install(completion: bytes, stream: bytes) -> None:
    from gateway.upstream import client as upstream
    from gateway.upstream.pool import ConnectionPool

    chunks = [stream[i : i + 4096] for i in range(0, len(stream), 4096)]
    pool = ConnectionPool()
    origin = ("http", "127.0.0.1", 9)

    async def send(self: Any, method: str, url: str, body: Any, headers: Any, what: str, limit: float) -> Any:
        if "/sse/" in url:
            conn = _Connection(200, stream, "text/event-stream", list(chunks))
        else:
            conn = _Connection(200, completion, "application/json")
        return upstream.UpstreamResponse(conn, pool, origin, what)  # type: ignore[arg-type]

    async def exchange(self: Any, method: str, url: str, *args: Any) -> tuple[int, bytes]:
        return (200, b"{}") if url.endswith("/health") else (404, b"")

    upstream.UpstreamClient._send = send  # type: ignore[method-assign]
    upstream.UpstreamClient._exchange = exchange  # type: ignore[method-assign]


async def _one(app: Any, path: str, body: bytes, never: asyncio.Event) -> int:
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    await app(scope, receive, send)
    return status


async def _main(args: argparse.Namespace) -> None:
    from gateway.app.build import create_app
    from gateway.config_loader import load_config

    _install(bodies.completion(), bodies.stream(200))
    routes = "".join(configs.ROUTE.format(model=m, pool=p) for m, p in (("json", "json"), ("sse", "sse")))
    conf = Path(tempfile.mkdtemp()) / "gateway.yaml"
    conf.write_text(configs.GATEWAY_CONF.format(port=0, nginx=9, sse="http://127.0.0.1:9/sse", paced=9, routes=routes))
    config = load_config(conf)
    app = create_app(config)
    startup = asyncio.Queue[dict[str, Any]]()
    await startup.put({"type": "lifespan.startup"})
    done = asyncio.Event()

    async def lsend(message: dict[str, Any]) -> None:
        done.set()

    lifespan = asyncio.create_task(app({"type": "lifespan"}, startup.get, lsend))
    await done.wait()
    never = asyncio.Event()
    model = "sse" if args.stream else "json"
    body = configs.request_body(model, args.stream)
    path = "/v1/chat/completions"
    for _ in range(500):
        assert await _one(app, path, body, never) == 200
    best = main = float("inf")
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    gc.collect()
    for _ in range(args.repeat):
        t0, m0 = time.process_time(), time.thread_time()
        if profiler:
            profiler.enable()
        for _ in range(args.requests // args.concurrency):
            await asyncio.gather(*(_one(app, path, body, never) for _ in range(args.concurrency)))
        if profiler:
            profiler.disable()
        best = min(best, (time.process_time() - t0) / args.requests * 1e6)
        main = min(main, (time.thread_time() - m0) / args.requests * 1e6)
    # main: the event loop's thread alone (the request path), without the exporter's thread.
    figures = {"cpu_us_per_request": round(best, 2), "main_thread_us_per_request": round(main, 2)}
    print(json.dumps({**figures, "stream": args.stream, "trace": args.trace}))
    if profiler:
        profiler.dump_stats(args.profile)
    await startup.put({"type": "lifespan.shutdown"})
    await lifespan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--profile", default="")
    parser.add_argument("--trace", type=float, default=None, help="tracing on at this sampling ratio")
    args = parser.parse_args()
    sink = None
    if args.trace is not None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        here = Path(__file__).parent
        sink = subprocess.Popen([sys.executable, str(here / "otlp_sink.py"), "--port", str(port)])
        time.sleep(0.5)
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(args.trace)
    logging.basicConfig(level=logging.WARNING)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_main(args))
    finally:
        if sink is not None:
            sink.terminate()
            sink.wait()


if __name__ == "__main__":
    main()
