"""The gateway's instructions per request and per streamed token, counted by valgrind's callgrind.

    python3 benchmarks/overhead/instructions.py [--compiled] [--tree DIR] [--streams 20] [--requests 400] [--trace R]
        [--keep DIR]

Why a second measure beside peers.py: CPU time on a shared VM moves by ±20 % from one minute to the
next, so a change worth 5 % takes many interleaved rounds to see. An instruction count does not move
(the same build gives the same count to ~0.1 %), so one run of each build compares them. What it
leaves out: the kernel (a streamed token's read and write are about half its CPU time; see
docs/benchmarks.md) and the cost of a cache miss. So it ranks changes to the gateway's own code;
the figures to quote are peers.py's.

It starts two paced upstreams (100 and 20 tokens a stream, one every 40 ms), then the gateway under
`valgrind --tool=callgrind --instr-atstart=no` (the shipped config's rules and caps, as peers.py),
warms it, and counts three phases: `--requests` non-stream requests one after another, then
`--streams` concurrent streams of 100 tokens, then of 20. A token's count at the margin is the
difference of the two stream phases over the 80 tokens between them; the rest is a stream's own.
The gateway's timers (each backend's /metrics scrape every second, the loop-lag probe) run by wall
time, and a phase under callgrind lasts a minute or more: so an idle phase of `--idle-s` seconds
first counts what they cost a second, and each phase's count is less that rate times its length
(a build that makes requests slower would otherwise be charged its timers' extra seconds too).
With `--trace`, each phase also waits out the export delay before its count ends, so the export of
its spans is counted with it, not with the next phase.
Needs valgrind (apt-get install valgrind). `--compiled` counts the compiled build
(deploy/build-compiled.sh) of the tree; `--tree` counts another checkout (a git worktree). `--trace R`
turns tracing on, a share R of the requests sampled, exporting every `--export-ms` (default 5000,
the SDK's) to otlp_sink.py (on the load core); the exporter's thread is the gateway's, and counted.
`--keep DIR` keeps each phase's callgrind dump there (`nonstream.out`, `long.out`, `short.out`), for
`callgrind_annotate --inclusive=yes DIR/nonstream.out` to say where the instructions went."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import configs
from processes import REPO, Env, free_port, wait_http

sys.path.insert(1, str(REPO))  # the repository root, for benchmarks/record.py
from benchmarks import record

HERE = Path(__file__).resolve().parent
LONG, SHORT = 100, 20
DELAY_MS = 40
"""A token every 40 ms: slow enough that a gateway under callgrind (~50x slower) still reads each
token on its own, as it does at full speed, so that the count is the count of one token's work."""

GATEWAY_CONF = """\
server: {{host: 127.0.0.1, port: {port}}}
health: {{interval_s: 3600, timeout_s: 2}}
pools:
  long:  {{engine: vllm, balancer: least_load, backends: [{{url: "http://127.0.0.1:{long}"}}]}}
  short: {{engine: vllm, balancer: least_load, backends: [{{url: "http://127.0.0.1:{short}"}}]}}
routes:
{routes}
"""


def totals(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def nonstream(port: int, n: int) -> None:
    body = configs.request_body("bench-long", stream=False)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for _ in range(n):
        conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"non-stream request: {resp.status}")
    conn.close()


def streams(port: int, model: str, concurrency: int, body_dir: Path, load_core: str) -> dict[str, float]:
    body = body_dir / f"{model}.json"
    body.write_bytes(configs.request_body(model, stream=True))
    argv = ["taskset", "-c", load_core, sys.executable, str(HERE / "loadgen.py"), "streams"]
    argv += ["--url", f"http://127.0.0.1:{port}/v1/chat/completions", "--body", str(body)]
    argv += ["--concurrency", str(concurrency), "--rounds", "1", "--stagger-ms", str(DELAY_MS), "--deadline", "120"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    if result.get("failures"):
        raise SystemExit(f"{model}: {result['failures']} streams failed: {result.get('failure_examples')}")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=REPO, help="the checkout to count (default: this one)")
    p.add_argument("--compiled", action="store_true", help="count the tree's compiled build")
    p.add_argument("--streams", type=int, default=20, help="concurrent streams in each stream phase")
    p.add_argument("--requests", type=int, default=400, help="non-stream requests")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--trace", type=float, default=None, help="tracing on, this share of the requests sampled")
    p.add_argument("--idle-s", type=float, default=20.0, help="the idle phase that counts the timers' cost")
    p.add_argument("--keep", type=Path, default=None, help="keep each phase's callgrind dump in this folder")
    p.add_argument("--export-ms", type=int, default=5000, help="with --trace: OTEL_BSP_SCHEDULE_DELAY")
    record.add_arguments(p)
    a = p.parse_args()
    tree = a.tree.resolve()
    src = tree
    if a.compiled:
        built = subprocess.run(["bash", "deploy/build-compiled.sh"], cwd=tree, check=True, capture_output=True)
        src = Path(built.stdout.decode().strip())
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True)
    cores = sorted(os.sched_getaffinity(0))
    gw_core, load_core = str(cores[-1]), str(cores[0])
    with tempfile.TemporaryDirectory(prefix="gw-instr-") as tmp_name:
        tmp = Path(tmp_name)
        env = Env(tmp, gw_core, load_core)
        try:
            ups = {}
            for name, tokens in (("long", LONG), ("short", SHORT)):
                port = free_port()
                argv = [sys.executable, str(HERE / "paced_upstream.py"), "--port", str(port)]
                argv += ["--tokens", str(tokens), "--delay-ms", str(DELAY_MS)]
                proc = env.start(f"paced-{name}", argv, load_core)
                wait_http(f"http://127.0.0.1:{port}/health", proc)
                ups[name] = port
            port = free_port()
            routes = "".join(configs.ROUTE.format(model=f"bench-{k}", pool=k) for k in ups)
            conf = tmp / "gateway.yaml"
            conf.write_text(GATEWAY_CONF.format(port=port, long=ups["long"], short=ups["short"], routes=routes))
            out = tmp / "callgrind.out"
            # The interpreter itself, not a wrapper script (pyenv's shim is one): valgrind follows no child.
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
            argv += [os.path.realpath(sys.executable), "-m", "gateway.cli", "serve", "--config", str(conf)]
            # The real interpreter leaves a virtual environment's packages behind: put them back on the
            # path (a venv's OpenTelemetry, for --trace, and the same versions of everything else).
            path = os.pathsep.join([str(src), *site.getsitepackages()])
            run_env = {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}
            if a.trace is not None:
                sink_port = free_port()
                sink = env.start(
                    "otlp-sink", [sys.executable, str(HERE / "otlp_sink.py"), "--port", str(sink_port)], load_core
                )
                wait_http(f"http://127.0.0.1:{sink_port}/count", sink)
                run_env.update(
                    OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink_port}",
                    OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                    OTEL_TRACES_SAMPLER_ARG=str(a.trace),
                    # The batch processor's delay: its default (5 s) is shorter than a counted phase of
                    # 2000 requests under callgrind, so the exports land inside the phase.
                    OTEL_BSP_SCHEDULE_DELAY=str(a.export_ms),
                )
            gw = env.start("gateway", argv, gw_core, env=run_env, cwd=src)
            wait_http(f"http://127.0.0.1:{port}/readyz", gw, timeout_s=120)
            nonstream(port, 50)  # warm: imports, pools, the first of each code path
            streams(port, "bench-short", a.streams, tmp, load_core)
            if a.trace is not None:  # the warm-up's spans exported first, not inside the idle phase
                time.sleep(a.export_ms / 1000 + 3)
            counts: dict[str, float] = {}
            phases = (
                ("idle", lambda: time.sleep(a.idle_s)),
                ("nonstream", lambda: nonstream(port, a.requests)),
                ("long", lambda: streams(port, "bench-long", a.streams, tmp, load_core)),
                ("short", lambda: streams(port, "bench-short", a.streams, tmp, load_core)),
            )
            idle_rate = 0.0
            for name, phase in phases:
                control("-i", "on", str(gw.pid))
                began = time.monotonic()
                phase()
                if a.trace is not None and name != "idle":  # the phase's own spans exported inside it
                    time.sleep(a.export_ms / 1000 + 2)
                lasted = time.monotonic() - began
                control("-i", "off", str(gw.pid))
                before = set(tmp.glob("callgrind.out*"))
                control("-d", str(gw.pid))
                deadline = time.monotonic() + 30
                while not (new := set(tmp.glob("callgrind.out*")) - before) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not new:
                    raise SystemExit("callgrind wrote no dump")
                time.sleep(0.5)  # the dump is written before it is renamed into place
                dump = max(new, key=lambda f: f.stat().st_mtime)
                if name == "idle":
                    idle_rate = totals(dump) / lasted
                else:
                    counts[name] = totals(dump) - idle_rate * lasted
                    counts[f"{name}_s"] = lasted
                if a.keep is not None:
                    a.keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(dump, a.keep / f"{name}.out")
        finally:
            env.stop_all()
    n = a.streams
    per_request = counts["nonstream"] / a.requests
    per_long, per_short = counts["long"] / n, counts["short"] / n
    per_token = (per_long - per_short) / (LONG - SHORT)
    per_stream = per_short - SHORT * per_token
    build = "compiled" if a.compiled else "Python"
    traced = "" if a.trace is None else f", tracing at {a.trace} sampling"
    print(f"Instructions (callgrind, userland), {build} build of {tree} at {head.stdout.strip() or '?'}{traced}:")
    print(f"  non-stream request           {per_request:12,.0f}   ({a.requests} requests)")
    print(f"  stream of {LONG} tokens        {per_long:12,.0f}   ({n} concurrent)")
    print(f"  stream of {SHORT} tokens         {per_short:12,.0f}   ({n} concurrent)")
    print(f"  a token, at the margin       {per_token:12,.0f}")
    print(f"  a stream, besides its tokens {per_stream:12,.0f}")
    lasted = counts["nonstream_s"]
    print(f"  (less the timers: {idle_rate:,.0f} a second idle; the non-stream phase lasted {lasted:.0f} s)")
    if a.json is not None:
        figures = {"per_request": per_request, "per_token": per_token, "per_stream": per_stream}
        figures["idle_per_s"] = idle_rate
        a.json.write_text(json.dumps({"tree": str(tree), "build": build, **figures}, indent=2) + "\n")
    measured = {
        "nonstream_request": per_request,
        "stream_100_tokens": per_long,
        "stream_20_tokens": per_short,
        "token_at_margin": per_token,
        "stream_besides_tokens": per_stream,
        "idle_per_second": idle_rate,
        "nonstream_phase_s": counts["nonstream_s"],
    }
    note = f"{build} build of {tree}{traced}"  # the record names its commit itself
    key = build.lower() if a.trace is None else f"{build.lower()}-trace-{a.trace}"
    record.write_if_asked(a, "overhead-instructions", {key: measured}, notes=note, tree=a.tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
