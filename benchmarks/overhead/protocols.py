"""The gateway's CPU cost per protocol: OpenAI chat beside Anthropic Messages served natively (the
bytes pass through, the native observer reads the events) and Messages translated to and from chat
(an `engine: openai` backend). One static upstream (nginx) serves every body, so only the gateway's
own work differs. Interleaved rounds on one pinned core; every figure absolute and as a ratio to
chat's in the same round (the machine is noisy: the ratios are the result).

    python3 benchmarks/overhead/protocols.py                 # 3 rounds, ~2 min
    python3 benchmarks/overhead/protocols.py --rounds 2 --duration 3

Peers of the gateway are in peers.py; docs/benchmarks.md gives the method and the last figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bodies  # noqa: E402
import configs  # noqa: E402
from bench import wrk  # noqa: E402
from machine import CpuMeter  # noqa: E402
from peers import wait_ready  # noqa: E402
from processes import REPO, Env, free_port  # noqa: E402

sys.path.insert(1, str(REPO))  # the repository root, for benchmarks/record.py
from benchmarks import record  # noqa: E402

NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port};
        root {tmp}/www;
        location ~ /health$ {{ default_type application/json; return 200 '{{}}'; }}
        location ~ /v1/models$ {{ default_type application/json; return 200 '{{"data":[]}}'; }}
{locations}
    }}
}}
"""
LOCATION = """\
        location = {path} {{
            default_type {ctype};
            try_files /{file} =404;
            error_page 405 =200 $uri;
        }}
"""
GATEWAY_CONF = """\
server: {{host: 127.0.0.1, port: {port}}}
health: {{interval_s: 3600, timeout_s: 2}}
pools:
  json:   {{engine: vllm, backends: [{{url: "http://127.0.0.1:{nginx}"}}]}}
  sse:    {{engine: vllm, backends: [{{url: "http://127.0.0.1:{nginx}/sse"}}]}}
  json-t: {{engine: openai, backends: [{{url: "http://127.0.0.1:{nginx}"}}]}}
  sse-t:  {{engine: openai, backends: [{{url: "http://127.0.0.1:{nginx}/sse"}}]}}
routes:
{routes}
"""
# scenario -> (gateway path, route model, pool, stream)
SCENARIOS: dict[str, tuple[str, str, str, bool]] = {
    "chat": ("/v1/chat/completions", "bench-json", "json", False),
    "messages-native": ("/v1/messages", "bench-json", "json", False),
    "messages-translated": ("/v1/messages", "bench-json-t", "json-t", False),
    "chat-stream": ("/v1/chat/completions", "bench-sse", "sse", True),
    "messages-native-stream": ("/v1/messages", "bench-sse", "sse", True),
    "messages-translated-stream": ("/v1/messages", "bench-sse-t", "sse-t", True),
}
BASE = {"messages-native": "chat", "messages-translated": "chat"}
BASE |= {"messages-native-stream": "chat-stream", "messages-translated-stream": "chat-stream"}
_SEP = (",", ":")


def anthropic_message() -> bytes:
    """vLLM's native /v1/messages answer, the size of bodies.completion()."""
    body = {
        "id": "msg_bench0000000000000000000000",
        "type": "message",
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": "Hello! This is a static benchmark answer of a few "
                "dozen tokens, roughly the size of a short real reply from an engine.",
            }
        ],
        "model": bodies.MODEL,
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 28},
    }
    return json.dumps(body, separators=_SEP).encode()


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + json.dumps(data, separators=_SEP).encode() + b"\n\n"


def anthropic_stream(n: int) -> bytes:
    """vLLM's native Messages stream with n text deltas (as tests/fixtures/vllm/protocols/)."""
    start = json.loads(anthropic_message())
    start["content"], start["stop_reason"], start["usage"] = [], None, {"input_tokens": 12, "output_tokens": 0}
    out = [_event("message_start", {"type": "message_start", "message": start})]
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    out.append(_event("content_block_start", block))
    for i in range(n):
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f" tok{i}"}}
        out.append(_event("content_block_delta", delta))
    out.append(_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    out.append(_event("message_delta", end | {"usage": {"output_tokens": n}}))
    out.append(_event("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def request(scenario: str, max_tokens: int = 128) -> bytes:
    path, model, _, stream = SCENARIOS[scenario]
    if path == "/v1/chat/completions":
        return configs.request_body(model, stream, max_tokens)
    body: dict[str, Any] = {
        "model": model,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4, help="seconds per wrk measurement")
    p.add_argument("--warmup", type=float, default=1)
    p.add_argument("--connections", type=int, default=50)
    p.add_argument("--chunks", type=int, default=200, help="content events per stream")
    p.add_argument("--json", type=Path, default=None, help="also write every raw figure here")
    record.add_arguments(p)
    a = p.parse_args()
    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install -y nginx wrk util-linux")
    cores = sorted(os.sched_getaffinity(0))
    load_core, gw_core = (str(cores[0]), str(cores[1])) if len(cores) >= 2 else (str(cores[0]),) * 2
    os.sched_setaffinity(0, {int(load_core)})
    tmp = Path(tempfile.mkdtemp(prefix="gw-protocols-"))
    tmp.chmod(0o755)
    www = tmp / "www"
    www.mkdir()
    www.chmod(0o755)
    files = {
        "completion.json": bodies.completion(),
        "stream.sse": bodies.stream(a.chunks),
        "message.json": anthropic_message(),
        "message.sse": anthropic_stream(a.chunks),
    }
    for name, data in files.items():
        (www / name).write_bytes(data)
        (www / name).chmod(0o644)
    locations = "".join(
        LOCATION.format(path=path, file=file, ctype=ctype)
        for path, file, ctype in (
            ("/v1/chat/completions", "completion.json", "application/json"),
            ("/sse/v1/chat/completions", "stream.sse", "text/event-stream"),
            ("/v1/messages", "message.json", "application/json"),
            ("/sse/v1/messages", "message.sse", "text/event-stream"),
        )
    )
    env = Env(tmp, gw_core, load_core)
    results: dict[str, list[dict[str, float]]] = {s: [] for s in SCENARIOS}
    try:
        up = free_port()
        (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, port=up, locations=locations))
        env.start("nginx", ["nginx", "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"], load_core)
        port = free_port()
        routes = "".join(
            configs.ROUTE.format(model=model, pool=pool)
            for model, pool in {(m, p) for _, m, p, _ in SCENARIOS.values()}
        )
        (tmp / "gateway.yaml").write_text(GATEWAY_CONF.format(port=port, nginx=up, routes=routes))
        argv = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(tmp / "gateway.yaml"),
            "--port",
            str(port),
        ]
        argv += ["--log-level", "warning"]
        gw = env.start("gateway", argv, gw_core, env={**os.environ, "PYTHONPATH": str(REPO)})
        body = {}
        for scenario in SCENARIOS:
            body[scenario] = tmp / f"req-{scenario}.json"
            body[scenario].write_bytes(request(scenario))
            path, _, _, stream = SCENARIOS[scenario]
            events = a.chunks + 1 if scenario == "chat-stream" else 0
            wait_ready(f"http://127.0.0.1:{port}{path}", gw, body[scenario], events)
        order = list(SCENARIOS)
        for rnd in range(a.rounds):
            shift = rnd % len(order)
            for scenario in order[shift:] + order[:shift]:
                path, _, _, stream = SCENARIOS[scenario]
                url = f"http://127.0.0.1:{port}{path}"
                wrk(url, body[scenario], a.warmup, a.connections, load_core)
                meter = CpuMeter([gw.pid])
                meter.start()
                r = wrk(url, body[scenario], a.duration, a.connections, load_core)
                meter.stop()
                n = r["requests"]
                bad = r["socket_errors"] + r["non2xx"]
                if bad:
                    raise SystemExit(f"{scenario}: {bad} errors ({r})")
                fig = {"cpu_us_per_req": meter.cpu / n * 1e6 if n else float("nan")}
                if stream:
                    fig["cpu_us_per_event"] = meter.cpu / (n * a.chunks) * 1e6 if n else float("nan")
                results[scenario].append(fig)
                shown = ", ".join(f"{k}={v:,.2f}" for k, v in fig.items())
                print(f"round {rnd + 1} {scenario:27s} {shown}", file=sys.stderr, flush=True)
    finally:
        env.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    print(render(results, a))
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=2) + "\n")
    record.write_if_asked(a, "overhead-protocols", summary(results))
    return 0


def summary(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per scenario: the median of its figure and the ratio to chat in the same round [min-max]."""
    out = {}
    for s in SCENARIOS:
        key = "cpu_us_per_event" if SCENARIOS[s][3] else "cpu_us_per_req"
        vals = [r[key] for r in results[s]]
        row = {key: statistics.median(vals), "ratio": 1.0}
        base = BASE.get(s)
        if base is not None:
            rs = [v / b[key] for v, b in zip(vals, results[base], strict=False)]
            row.update(ratio=statistics.median(rs), ratio_min=min(rs), ratio_max=max(rs))
        out[s] = row
    return out


def render(results: dict[str, list[dict[str, float]]], a: argparse.Namespace) -> str:
    key = {s: ("cpu_us_per_event" if SCENARIOS[s][3] else "cpu_us_per_req") for s in SCENARIOS}
    lines = [
        f"Gateway CPU per protocol, median of {a.rounds} interleaved rounds ({a.connections} connections, "
        f"streams of {a.chunks} events); ratio to chat in the same round [min-max]:",
        "",
        "| scenario | figure | median | ratio to chat |",
        "|---|---|---:|---:|",
    ]
    for s in SCENARIOS:
        vals = [r[key[s]] for r in results[s]]
        base = BASE.get(s)
        ratio = "1.00x"
        if base is not None:
            rs = [v / b[key[base]] for v, b in zip(vals, results[base], strict=False)]
            ratio = f"{statistics.median(rs):.2f}x [{min(rs):.2f}-{max(rs):.2f}]"
        label = "CPU µs/event" if SCENARIOS[s][3] else "CPU µs/request"
        lines.append(f"| {s} | {label} | {statistics.median(vals):,.2f} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
