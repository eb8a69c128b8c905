"""Gateway overhead benchmark: direct-to-upstream vs through the gateway, in one run.

The gateway runs pinned to one core (`taskset -c 1`); the upstreams (nginx with static OpenAI-shaped
bodies, and a paced streaming upstream) and the load generators (wrk, loadgen.py) share the other
core. The gateway's CPU cost is the delta of its CPU time over each phase (the scheduler's own
nanosecond accounting, /proc/PID/task/*/schedstat), its memory VmRSS from /proc/PID/status. The
result is a Markdown table on stdout (and in --out).

    benchmarks/overhead/run.sh                        # the full run, under 2 minutes
    benchmarks/overhead/run.sh --nice -19             # on a shared machine (root): keep the cores
    benchmarks/overhead/run.sh --quick                # shorter phases, a smoke test
    benchmarks/overhead/run.sh --profile /tmp/prof    # also py-spy the gateway (figures flagged)
    benchmarks/overhead/run.sh --variant uvloop       # the gateway on uvloop (see gateway_uvloop.py)

See docs/benchmarks.md for the method and the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bodies  # noqa: E402
import configs  # noqa: E402
from machine import CpuMeter, Noise, children, rss_mb  # noqa: E402
from processes import Env, Proc, free_port, own_autogroup_nice, restore_autogroup_nice, set_nice, wait_http  # noqa: E402
from report import render  # noqa: E402

sys.path.insert(1, str(HERE.parents[1]))  # the repository root, for benchmarks/record.py
from benchmarks import record  # noqa: E402


def git_state() -> str:
    """The commit measured, and whether the gateway's code differed from it (others may be editing)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=HERE)
        return out.stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "../../gateway", "../../engines")
    return head + (" + uncommitted changes in gateway/ or engines/" if dirty else "")


def wrk(url: str, body: Path, seconds: float, connections: int, core: str, threads: int = 1) -> dict[str, Any]:
    argv = [
        "taskset",
        "-c",
        core,
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(HERE / "post.lua"),
        url,
    ]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=seconds + 30, env={**os.environ, "BENCH_BODY": str(body)}
    )
    for line in out.stdout.splitlines():
        if line.startswith("WRKJSON "):
            result: dict[str, Any] = json.loads(line[8:])
            result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
            return result
    raise SystemExit(f"wrk gave no result:\n{out.stdout}\n{out.stderr}")


def loadgen(core: str, *args: str, timeout_s: float = 180) -> dict[str, Any]:
    argv = ["taskset", "-c", core, sys.executable, str(HERE / "loadgen.py"), *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise SystemExit(f"loadgen {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


class Profiler:
    """py-spy record of the gateway during one phase. py-spy pauses the gateway for each sample (a few
    per cent of its CPU at 200 Hz) because --nonblocking reads torn stacks (a third of them, here), which
    would hide who called what."""

    def __init__(self, out_dir: Path | None, core: str, rate: int = 200, native: bool = False) -> None:
        self.out_dir = out_dir
        self.core = core
        self.rate = rate
        self.native = native

    @contextlib.contextmanager
    def record(self, pid: int, name: str, seconds: float) -> Iterator[None]:
        if self.out_dir is None:
            yield
            return
        out = self.out_dir / f"{name}.txt"
        argv = [
            "taskset",
            "-c",
            self.core,
            "py-spy",
            "record",
            *(["--native"] if self.native else []),
            "--format",
            "raw",
            "-r",
            str(self.rate),
            "-d",
            str(max(1, int(seconds))),
            "-p",
            str(pid),
            "-o",
            str(out),
        ]
        with (self.out_dir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)  # let py-spy attach before the load starts
        try:
            yield
        finally:
            try:
                proc.wait(timeout=seconds + 30)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------- the run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=10, help="seconds per wrk phase")
    p.add_argument("--warmup", type=float, default=2, help="seconds of wrk warm-up before each phase")
    p.add_argument("--connections", type=int, default=50, help="wrk connections")
    p.add_argument("--rate", type=float, default=200, help="req/s of the fixed-rate latency test")
    p.add_argument("--latency-duration", type=float, default=10)
    p.add_argument("--chunks", type=int, default=200, help="events per response in the fast stream test")
    p.add_argument("--streams", type=int, default=100, help="concurrent streams in the realistic test")
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream in the realistic test")
    p.add_argument("--delay-ms", type=float, default=20, help="ms between tokens in the realistic test")
    p.add_argument("--rounds", type=int, default=5, help="streams per worker in the realistic test")
    p.add_argument("--no-info", action="store_true", help="skip the extra run at --log-level info")
    p.add_argument(
        "--variant",
        choices=["as-is", "uvloop", "uvloop-gc"],
        default="as-is",
        help="as-is: `gateway serve` exactly as shipped; uvloop: the same through gateway_uvloop.py, "
        "which makes uvloop the event loop first; uvloop-gc: also gc.freeze() after startup "
        "and a gen-0 GC threshold of 50,000",
    )
    p.add_argument(
        "--gc-stats",
        action="store_true",
        help="count the gateway's garbage collections (a gc callback, added by starting the gateway "
        "through gateway_uvloop.py; on the same event loop as the chosen variant)",
    )
    p.add_argument("--quick", action="store_true", help="short phases (a smoke test, not figures)")
    p.add_argument("--profile", type=Path, default=None, help="py-spy the gateway into this folder")
    p.add_argument("--profile-native", action="store_true", help="py-spy --native (C frames: uvloop, httptools)")
    p.add_argument("--out", type=Path, default=None, help="also write the Markdown table here")
    p.add_argument("--json", type=Path, default=None, help="also write every raw figure here")
    p.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the benchmark and everything it starts at this nice value; a negative one (root "
        "only) keeps other processes on a shared machine from skewing the figures",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (configs, logs)")
    record.add_arguments(p)
    a = p.parse_args()
    if a.quick:
        a.duration, a.warmup, a.latency_duration, a.rounds = 3, 1, 3, 2

    for tool in ("nginx", "wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install -y nginx wrk util-linux")
    if a.profile is not None and shutil.which("py-spy") is None:
        raise SystemExit("py-spy not found: pip install py-spy")

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        load_core, gw_core = str(cores[0]), str(cores[1])
    else:
        load_core = gw_core = str(cores[0])
        print("warning: one core only; the gateway shares it with the load", file=sys.stderr)
    os.sched_setaffinity(0, {int(load_core)})  # this script and everything it starts: the load core
    restore_nice = own_autogroup_nice()
    if a.nice:
        set_nice(os.getpid(), a.nice)  # inherited by wrk and loadgen runs

    tmp = Path(tempfile.mkdtemp(prefix="gw-overhead-"))
    tmp.chmod(0o755)  # nginx workers run as nobody
    (tmp / "www").mkdir()
    (tmp / "www").chmod(0o755)
    (tmp / "www" / "completion.json").write_bytes(bodies.completion())
    (tmp / "www" / "stream.sse").write_bytes(bodies.stream(a.chunks))
    for f in (tmp / "www").iterdir():
        f.chmod(0o644)
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
    prof = Profiler(a.profile, load_core, native=a.profile_native)
    env = Env(tmp, gw_core, load_core, a.nice)
    results: dict[str, Any] = {
        "params": {k: str(v) for k, v in vars(a).items()},
        "cores": {"gateway": gw_core, "load": load_core},
        "git": git_state(),
    }
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    try:
        nginx_port, paced_port, gw_port = free_port(), free_port(), free_port()
        conf = configs.NGINX_CONF.format(tmp=tmp, port=nginx_port, sse_port=free_port(), json_log=configs.json_log())
        (tmp / "nginx.conf").write_text(conf)
        nginx = env.start("nginx", ["nginx", "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"], load_core)
        paced = env.start(
            "paced",
            [
                sys.executable,
                str(HERE / "paced_upstream.py"),
                "--port",
                str(paced_port),
                "--tokens",
                str(a.tokens),
                "--delay-ms",
                str(a.delay_ms),
            ],
            load_core,
        )
        wait_http(f"http://127.0.0.1:{nginx_port}/health", nginx)
        wait_http(f"http://127.0.0.1:{paced_port}/health", paced)
        nginx_workers = children(nginx.pid) or [nginx.pid]

        routes = "".join(configs.ROUTE.format(model=f"bench-{pool}", pool=pool) for pool in ("json", "sse", "paced"))
        gateway_yaml = configs.GATEWAY_CONF.format(
            port=gw_port, nginx=nginx_port, sse=f"http://127.0.0.1:{nginx_port}/sse", paced=paced_port, routes=routes
        )
        (tmp / "gateway.yaml").write_text(gateway_yaml)
        for name, model, stream in (
            ("json", "bench-json", False),
            ("sse", "bench-sse", True),
            ("paced", "bench-paced", True),
        ):
            max_tokens = a.tokens if name == "paced" else 128
            (tmp / f"req-{name}.json").write_bytes(configs.request_body(model, stream, max_tokens))

        def start_gateway(level: str) -> Proc:
            shim = a.variant != "as-is" or a.gc_stats
            entry = [str(HERE / "gateway_uvloop.py")] if shim else ["-m", "gateway.cli"]
            argv = [
                sys.executable,
                *entry,
                "serve",
                "--config",
                str(tmp / "gateway.yaml"),
                "--port",
                str(gw_port),
                "--log-level",
                level,
            ]
            extra = {"BENCH_GC_TUNE": "1"} if a.variant == "uvloop-gc" else {}
            if a.variant == "as-is":
                extra["BENCH_LOOP"] = "asyncio"
            if a.gc_stats:
                extra["BENCH_GC_STATS"] = str(tmp / f"gc-{level}.json")
            gw = env.start(f"gateway-{level}", argv, gw_core, env={**os.environ, **extra})
            wait_http(f"http://127.0.0.1:{gw_port}/readyz", gw)
            return gw

        gw = start_gateway("warning")
        time.sleep(1.0)
        results["rss_idle_mb"] = rss_mb(gw.pid)
        log(f"gateway pid {gw.pid} on core {gw_core}, idle RSS {results['rss_idle_mb']:.1f} MB")

        direct = f"http://127.0.0.1:{nginx_port}"
        via = f"http://127.0.0.1:{gw_port}"
        # Sanity: every path answers 200 with the bytes we expect, directly and through the gateway.
        for label, url, req in (
            ("direct json", f"{direct}/v1/chat/completions", "json"),
            ("gateway json", f"{via}/v1/chat/completions", "json"),
            ("direct sse", f"{direct}/sse/v1/chat/completions", "sse"),
            ("gateway sse", f"{via}/v1/chat/completions", "sse"),
        ):
            c = loadgen(load_core, "check", "--url", url, "--body", str(tmp / f"req-{req}.json"))
            ok = c["status"] == 200 and (req == "json" or (c["done"] and c["events"] >= a.chunks + 1))
            if not ok:
                raise SystemExit(f"sanity check {label} failed: {c}\n{gw.tail()}")
            results.setdefault("checks", {})[label] = c

        load_pids = [nginx.pid, *nginx_workers, paced.pid]

        def measured(pids: list[int], gw_pid: int, profile: str | None, seconds: float, run: Any) -> dict[str, Any]:
            """Run one load phase; add the CPU seconds of `pids` over it, and the other processes' load."""
            meter = CpuMeter(pids)
            noise: dict[str, Any] = {}
            ctx = prof.record(gw_pid, profile, seconds) if profile else contextlib.nullcontext()
            with ctx, Noise(gw_core, load_core, [gw_pid], load_pids).measure(noise):
                meter.start()
                r: dict[str, Any] = run()
                meter.stop()
            r.update(noise, cpu_s=meter.cpu, wall_s=meter.wall, cpu_util=meter.cpu / meter.wall)
            return r

        # (1) max req/s, non-stream.
        def max_rps(url: str, pids: list[int], gw_pid: int, profile: str | None) -> dict[str, Any]:
            wrk(url, tmp / "req-json.json", a.warmup, a.connections, load_core)
            r = measured(
                pids,
                gw_pid,
                profile,
                a.duration,
                lambda: wrk(url, tmp / "req-json.json", a.duration, a.connections, load_core),
            )
            r["cpu_us_per_req"] = r["cpu_s"] / r["requests"] * 1e6 if r["requests"] else None
            return r

        log("(1) max req/s, non-stream: direct")
        results["max_direct"] = max_rps(f"{direct}/v1/chat/completions", nginx_workers, gw.pid, None)
        log("(1) max req/s, non-stream: gateway")
        results["max_gateway"] = max_rps(f"{via}/v1/chat/completions", [gw.pid], gw.pid, "nonstream")

        # (2) latency at a fixed rate.
        def fixed_rate(url: str, pids: list[int]) -> dict[str, Any]:
            r = measured(
                pids,
                gw.pid,
                None,
                a.latency_duration,
                lambda: loadgen(
                    load_core,
                    "paced",
                    "--url",
                    url,
                    "--body",
                    str(tmp / "req-json.json"),
                    "--rate",
                    str(a.rate),
                    "--duration",
                    str(a.latency_duration),
                ),
            )
            r["cpu_us_per_req"] = r["cpu_s"] / max(1, r["ok"]) * 1e6
            return r

        log(f"(2) latency at {a.rate:.0f} req/s: direct")
        results["lat_direct"] = fixed_rate(f"{direct}/v1/chat/completions", nginx_workers)
        log(f"(2) latency at {a.rate:.0f} req/s: gateway")
        results["lat_gateway"] = fixed_rate(f"{via}/v1/chat/completions", [gw.pid])

        # (3) fast stream: N-event responses, no delay.
        def fast_stream(url: str, pids: list[int], profile: str | None) -> dict[str, Any]:
            wrk(url, tmp / "req-sse.json", a.warmup, a.connections, load_core)
            r = measured(
                pids,
                gw.pid,
                profile,
                a.duration,
                lambda: wrk(url, tmp / "req-sse.json", a.duration, a.connections, load_core),
            )
            events = r["requests"] * a.chunks
            r["events_per_s"] = events / (r["duration_us"] / 1e6)
            r["cpu_us_per_event"] = r["cpu_s"] / events * 1e6 if events else None
            return r

        log(f"(3) fast stream, {a.chunks} events per response: direct")
        results["fast_direct"] = fast_stream(f"{direct}/sse/v1/chat/completions", nginx_workers, None)
        log(f"(3) fast stream, {a.chunks} events per response: gateway")
        results["fast_gateway"] = fast_stream(f"{via}/v1/chat/completions", [gw.pid], "faststream")

        # (4) realistic stream: N concurrent streams, a token every delay_ms.
        def realistic(url: str, pids: list[int], profile: str | None) -> dict[str, Any]:
            expected = a.rounds * (a.tokens * a.delay_ms / 1e3) * 1.5 + 2
            r = measured(
                pids,
                gw.pid,
                profile,
                expected,
                lambda: loadgen(
                    load_core,
                    "streams",
                    "--url",
                    url,
                    "--body",
                    str(tmp / "req-paced.json"),
                    "--concurrency",
                    str(a.streams),
                    "--rounds",
                    str(a.rounds),
                    "--stagger-ms",
                    str(a.delay_ms),
                    "--deadline",
                    str(expected * 3 + 30),
                ),
            )
            r["tokens"] = r["streams"] * a.tokens
            r["cpu_us_per_token"] = r["cpu_s"] / r["tokens"] * 1e6 if r["tokens"] else None
            return r

        log(f"(4) realistic stream, {a.streams} streams x {a.tokens} tokens at {a.delay_ms:g} ms: direct")
        results["real_direct"] = realistic(f"http://127.0.0.1:{paced_port}/v1/chat/completions", [paced.pid], None)
        log(f"(4) realistic stream, {a.streams} streams x {a.tokens} tokens at {a.delay_ms:g} ms: gateway")
        results["real_gateway"] = realistic(f"{via}/v1/chat/completions", [gw.pid], "realistic")

        # (5) memory after all that.
        results["rss_after_mb"] = rss_mb(gw.pid)
        results["rss_peak_mb"] = rss_mb(gw.pid, "VmHWM")
        if not gw.alive():
            raise SystemExit(f"the gateway died:\n{gw.tail()}")
        env.stop(gw)
        if a.gc_stats:
            with contextlib.suppress(OSError, ValueError):
                results["gc"] = json.loads((tmp / "gc-warning.json").read_text())

        # (6) the access log on: --log-level info, non-stream max again.
        if not a.no_info:
            log("(6) max req/s, non-stream, gateway at --log-level info (access log on)")
            gwi = start_gateway("info")
            before = sum(1 for _ in gwi.log.open("rb"))
            results["max_gateway_info"] = max_rps(f"{via}/v1/chat/completions", [gwi.pid], gwi.pid, "nonstream-info")
            results["max_gateway_info"]["log_lines"] = sum(1 for _ in gwi.log.open("rb")) - before
            env.stop(gwi)
        results["elapsed_s"] = time.monotonic() - t_start
        log(f"done in {results['elapsed_s']:.0f}s")
    finally:
        env.stop_all()
        if a.nice and restore_nice is not None:
            restore_autogroup_nice(restore_nice)  # the autogroup is the caller's whole session
        if a.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    table = render(results, a)
    print(table)
    if a.out is not None:
        a.out.write_text(table + "\n")
    if a.json is not None:
        a.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    record.write_if_asked(a, "overhead-direct", results)
    if a.profile is not None:
        summary = subprocess.run(
            [sys.executable, str(HERE / "profile_summary.py"), *sorted(str(x) for x in a.profile.glob("*.txt"))],
            capture_output=True,
            text=True,
        )
        print(summary.stdout or summary.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
