"""The loopback stack the load and soak benchmarks run against: simulated engines in one process, the
gateway (`gateway serve`) in another, and readings of the gateway process (RSS, fds, /metrics).

Run as a program it is the simulator process: ``python benchmarks/loopstack.py sims --count 2
--params '{"max_batch": 1024}'`` serves that many simulators (a simulator, not a real engine) and prints
their base URLs as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
MODEL = "tiny"


@dataclass
class Stack:
    """The running processes: the simulators' URLs, the gateway's URL and pid, and where their logs are."""

    gateway_url: str
    gateway: subprocess.Popen[bytes]
    sims: subprocess.Popen[bytes]
    sim_urls: list[str]
    workdir: Path
    sim_pids: tuple[int, ...] = ()
    """Each simulator process (one per simulator with ``pool_of``), in the order of sim_urls."""

    @property
    def pid(self) -> int:
        return self.gateway.pid


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_limit(pid: int) -> str:
    """The process's soft and hard RLIMIT_NOFILE, as /proc shows them."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return f"{soft}/{hard}"
    return "?"


def metrics_reading(url: str) -> tuple[int, int, str]:
    """(bytes, series, text) of one /metrics scrape: series are the sample lines."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    return len(text.encode()), series, text


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (all label sets) in a /metrics text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _spawn(argv: list[str], log: Path, stdout_pipe: bool = False) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    with log.open("wb") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            argv,
            stdout=subprocess.PIPE if stdout_pipe else out,
            stderr=out if stdout_pipe else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=env,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdout is not None:
        proc.stdout.close()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"the gateway was not ready in {timeout} s:\n{log.read_text(errors='replace')}")


def _gateway_port(log: Path, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """The port from the gateway's "listening on http://host:PORT" line (it was started with --port 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if "gateway listening on http://" in line:
                return int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    raise TimeoutError("the gateway did not say where it listens")


@contextlib.contextmanager
def running_stack(
    workdir: Path,
    sim_count: int,
    sim_params: dict[str, Any],
    gateway_sections: dict[str, Any],
    backend_max_in_flight: int | None = None,
    gateway_argv: list[str] | None = None,
    routes: list[dict[str, Any]] | None = None,
    pool_of: list[str] | None = None,
) -> Iterator[Stack]:
    """Start the simulators and a gateway in front of them (one pool, route ``tiny`` unless ``routes``
    says otherwise; ``pool_of[i]`` names simulator i's pool instead of ``sim``); stop both after."""
    workdir.mkdir(parents=True, exist_ok=True)
    # With pools of their own, each simulator is its own process: one's work never delays another's.
    groups = [1] * sim_count if pool_of else [sim_count]
    procs = [
        _spawn(
            [sys.executable, str(Path(__file__)), "sims", "--count", str(n), "--params", json.dumps(sim_params)],
            workdir / f"sims-{i}.log",
            stdout_pipe=True,
        )
        for i, n in enumerate(groups)
    ]
    sims = procs[0]
    gateway: subprocess.Popen[bytes] | None = None
    try:
        urls: list[str] = []
        for i, proc in enumerate(procs):
            assert proc.stdout is not None
            first = proc.stdout.readline()
            if not first:
                raise RuntimeError(f"the simulators did not start:\n{(workdir / f'sims-{i}.log').read_text()}")
            urls += json.loads(first)
        pools: dict[str, dict[str, Any]] = {}
        for i, url in enumerate(urls):
            backend: dict[str, Any] = {"url": url, "name": f"sim-{i}", "model": MODEL}
            if backend_max_in_flight is not None:
                backend["max_in_flight"] = backend_max_in_flight
            pool = pools.setdefault(
                pool_of[i] if pool_of else "sim",
                {"engine": "sim", "flavour": sim_params.get("flavour", "vllm"), "backends": []},
            )
            pool["backends"].append(backend)
        config = {
            "server": {"host": "127.0.0.1", "port": 0},
            "pools": pools,
            "routes": routes or [{"model": MODEL, "pools": ["sim"]}],
            **gateway_sections,
        }
        path = workdir / "gateway.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        log = workdir / "gateway.log"
        argv = gateway_argv or [sys.executable, "-m", "gateway.cli"]
        gateway = _spawn([*argv, "serve", "--config", str(path), "--port", "0", "--log-level", "info"], log)
        url = f"http://127.0.0.1:{_gateway_port(log, gateway)}"
        _wait_ready(url, gateway, log)
        yield Stack(url, gateway, sims, urls, workdir, tuple(p.pid for p in procs))
    finally:
        if gateway is not None:
            _stop(gateway)
        for proc in procs:
            _stop(proc)


async def _serve_sims(count: int, params: dict[str, Any]) -> None:
    from engines.sim.server import SimParams, SimServer

    preset = params.pop("preset", "fast")
    servers = [SimServer(SimParams.preset(preset, **params)) for _ in range(count)]
    for server in servers:
        await server.start()
    print(json.dumps([s.base_url for s in servers]), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for server in servers:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sims = sub.add_parser("sims", help="serve simulated engines and print their URLs")
    sims.add_argument("--count", type=int, default=2)
    sims.add_argument("--params", default="{}", help="SimParams overrides as JSON (and 'preset')")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve_sims(args.count, json.loads(args.params)))


if __name__ == "__main__":
    main()
