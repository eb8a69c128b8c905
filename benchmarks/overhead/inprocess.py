"""The gateway's own CPU per request, without uvicorn or sockets: the ASGI app is called
directly and the upstream client answers from memory (the run's static bodies). Deterministic enough
to compare two commits in a few seconds, and to profile the gateway's code alone.

PYTHONPATH=TREE python3 benchmarks/overhead/inprocess.py [--requests N] [--stream] [--profile FILE] [--trace R]
PYTHONPATH=. python3 benchmarks/overhead/inprocess.py --balancer kv_events --backends 2 [--distinct [--walk]|--no-feed]

It prints CPU µs per request (the best of --repeat runs). --instructions: instead, the
instructions per request, counted by valgrind's callgrind (apt-get install valgrind): this harness
run twice under it, with --requests 100 and with --requests (one run each; both build the larger
run's bodies and event batches), and the difference of the two counts over the difference of the
requests, so that start-up and set-up cancel out. A count does not move with the VM's noise, so it
ranks two trees in one run each; the kernel and cache misses are left out, as in instructions.py.
--trace R: tracing on, sampling a share R of the requests, exporting to otlp_sink.py in a process
of its own (the exporter's thread is this process's, and counted).

--balancer and --backends: the pool's balancer and its backends (all answered from memory). With
kv_events each backend names an event endpoint that nothing publishes on, and each request's event
batch (kvevents.py: its prompt's blocks stored, those of the request --requests/2 before it removed,
as an engine that evicts at the rate it stores) is fed to a subscriber after the request, on the
same thread, so that decoding and indexing count (--no-feed: none, for the request path's cost
alone; nothing is then matched). Receiving a batch over ZMQ is left out: benchmarks/kv_feed.py
measures it. --tokenizer: the pool's tokenizer (default
$TINY_HF_DIR; "" for none: the ids are then asked of the engine, which answers nothing here).
--distinct: every request a conversation of its own, the size of the affinity benchmark's (~1,900
characters), so that every prompt is encoded whole; --walk with it: each conversation's four turns
one after the other, so that a turn is encoded from the one before. --chars N: every request sends
one conversation of about N characters (a coding agent's; its ids remembered after the first).
Without them every request sends the same small body, as the overhead benchmark does (its ids are
then remembered).

Not a substitute for peers.py: uvicorn and the sockets are left out here on purpose."""

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
import kvevents

FILLER_PROMPT = 7
"""A prompt's ids when no tokenizer is named (the gateway then matches nothing)."""
WARMUP = 500
"""Requests sent before the timed ones."""
INSTRUCTION_BASE = 100
"""--instructions: the smaller of the two runs' timed requests."""


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
    from gateway.asgi import CLIENT_GONE, LOOP, ClientGone

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

    # What the gateway's own server (serving/protocol.py) puts in every scope: its loop, so that
    # current_task() makes no getpid() syscall, and the disconnect hook, so that no watcher task
    # is made a request. Without them the figure is that of the path under another server.
    scope = {
        LOOP: asyncio.get_running_loop(),
        CLIENT_GONE: ClientGone(),
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
    text = configs.GATEWAY_CONF.format(port=0, nginx=9, sse="http://127.0.0.1:9/sse", paced=9, routes=routes)
    model = "sse" if args.stream else "json"
    warmup, timed = WARMUP, args.requests * args.repeat
    requests, chats = _bodies(args, model, max(warmup + timed, args.set_up_for))
    feed: list[list[bytes]] = []
    if args.balancer != "least_load" or args.backends != 1:
        ports = [_free_port() for _ in range(args.backends)]  # nothing listens: the subscribers wait
        line = next(x for x in text.splitlines() if x.lstrip().startswith("json:"))
        text = text.replace(line, "  " + kvevents.pool_yaml(args.balancer, 9, ports, args.tokenizer))
    if args.balancer == "kv_events" and not args.no_feed:
        feed = _batches(args, chats)
    conf = Path(tempfile.mkdtemp()) / "gateway.yaml"
    conf.write_text(text)
    config = load_config(conf)
    app = create_app(config)
    startup = asyncio.Queue[dict[str, Any]]()
    await startup.put({"type": "lifespan.startup"})
    done = asyncio.Event()

    async def lsend(message: dict[str, Any]) -> None:
        done.set()

    lifespan = asyncio.create_task(app({"type": "lifespan"}, startup.get, lsend))
    await done.wait()
    subscribers = list(app.state.gateway.kv_events.subscribers.values()) if feed else []
    never = asyncio.Event()
    path = "/v1/chat/completions"
    sent = 0

    async def wave(n: int) -> None:
        nonlocal sent
        batch = requests[sent : sent + n]
        statuses = await asyncio.gather(*(_one(app, path, body, never) for body in batch))
        assert all(status == 200 for status in statuses), statuses
        for i, frames in enumerate(feed[sent : sent + n], start=sent):
            # Each engine numbers its own batches: request i's batch goes to engine i mod N as its
            # (i // N)-th, whichever backend the request went to (the cost is the same).
            seq = (i // len(subscribers)).to_bytes(8, "big", signed=True)
            await subscribers[i % len(subscribers)].on_frames([frames[0], seq, frames[2]])
        sent += n

    for _ in range(warmup):
        await wave(1)
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
            await wave(args.concurrency)
        if profiler:
            profiler.disable()
        best = min(best, (time.process_time() - t0) / args.requests * 1e6)
        main = min(main, (time.thread_time() - m0) / args.requests * 1e6)
    # main: the event loop's thread alone (the request path), without the exporter's thread.
    figures = {"cpu_us_per_request": round(best, 2), "main_thread_us_per_request": round(main, 2)}
    shape = {"balancer": args.balancer, "backends": args.backends, "distinct": args.distinct, "walk": args.walk}
    shape["tokenizer"] = bool(args.tokenizer) and args.balancer == "kv_events"
    print(json.dumps({**figures, "stream": args.stream, "trace": args.trace, **shape}))
    if subscribers:
        held = {"index_blocks": [len(s.index) for s in subscribers], "batches": [s.stats.batches for s in subscribers]}
        get = app.state.gateway.metrics.registry.get_sample_value
        names = ("local", "resumed", "remembered", "prefix", "none", "mismatch", "resume_mismatch")
        held["prompt_ids"] = {n: get("gateway_kv_events_prompt_ids_total", {"source": n}) for n in names}
        print(json.dumps(held))
    if profiler:
        profiler.dump_stats(args.profile)
    await startup.put({"type": "lifespan.shutdown"})
    await lifespan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _bodies(args: argparse.Namespace, model: str, n: int) -> tuple[list[bytes], list[list[dict[str, str]]]]:
    """The requests' bodies and their messages: one small body n times, or n conversations."""
    if args.chars:
        chat = kvevents.long_conversation(args.chars)
        return [kvevents.body(model, chat, 128)] * n, [chat] * n
    if not args.distinct:
        one = configs.request_body(model, args.stream)
        return [one] * n, [json.loads(one)["messages"]] * n
    if args.walk:  # request r: conversation r // 4 at its turn r % 4
        chats = [kvevents.conversation(r // 4, r % 4) for r in range(n)]
    else:
        chats = [kvevents.conversation(r) for r in range(n)]
    return [kvevents.body(model, chat, 128) for chat in chats], chats


def _batches(args: argparse.Namespace, chats: list[list[dict[str, str]]]) -> list[list[bytes]]:
    """For each request, the event batch its engine would publish (kvevents.py)."""
    from gateway.pipeline.chat_tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer.load(Path(args.tokenizer)) if args.tokenizer else None
    prompts: list[list[int]] = []
    encoded: dict[int, list[int]] = {}  # the same conversation object is encoded once
    for messages in chats:
        ids = encoded.get(id(messages))
        if ids is None:
            ids = tokenizer.ids({"messages": messages}) if tokenizer is not None else None
            if ids is None:
                ids = [FILLER_PROMPT] * (sum(len(m["content"]) for m in messages) // 3)
            encoded[id(messages)] = ids
        prompts.append(ids)
    keep = max(args.requests, args.set_up_for) // 2
    return kvevents.batches(prompts, generated=kvevents.GENERATED, keep=keep)


def _count_instructions(requests: int) -> None:
    """This harness under callgrind with INSTRUCTION_BASE and `requests` timed requests (the
    same arguments otherwise); prints the instructions a request adds."""
    if requests <= INSTRUCTION_BASE:
        raise SystemExit(f"--instructions needs --requests above {INSTRUCTION_BASE}")
    argv = [a for a in sys.argv[1:] if a != "--instructions"]
    counts = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (INSTRUCTION_BASE, requests):
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, __file__]
            # Both runs build the bodies and event batches of the larger one, so that set-up cancels.
            sizes = ["--requests", str(n), "--repeat", "1", "--set-up-for", str(WARMUP + requests)]
            done = subprocess.run([*cmd, *argv, *sizes], capture_output=True, text=True, check=True)
            found = [line for line in done.stderr.splitlines() if "Collected :" in line]
            counts.append(int(found[-1].split(":")[-1]))
    per = (counts[1] - counts[0]) / (requests - INSTRUCTION_BASE)
    print(json.dumps({"instructions_per_request": round(per), "requests": [INSTRUCTION_BASE, requests]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--profile", default="")
    parser.add_argument("--balancer", choices=("least_load", "prefix_affinity", "kv_events"), default="least_load")
    parser.add_argument("--backends", type=int, default=1, help="backends in the pool (kv_events: each with events)")
    parser.add_argument("--no-feed", action="store_true", help="kv_events: no event batches (the request path alone)")
    parser.add_argument("--tokenizer", default=os.environ.get("TINY_HF_DIR", ""), help="kv_events: the pool's")
    parser.add_argument("--distinct", action="store_true", help="every request a conversation of its own")
    parser.add_argument("--walk", action="store_true", help="with --distinct: each conversation's four turns in turn")
    parser.add_argument(
        "--chars", type=int, default=0, help="every request one conversation of about this many characters"
    )
    parser.add_argument("--trace", type=float, default=None, help="tracing on at this sampling ratio")
    parser.add_argument("--instructions", action="store_true", help="count instructions per request (callgrind)")
    parser.add_argument("--set-up-for", type=int, default=0, help=argparse.SUPPRESS)  # --instructions' runs
    args = parser.parse_args()
    if args.instructions:
        _count_instructions(args.requests)
        return
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
