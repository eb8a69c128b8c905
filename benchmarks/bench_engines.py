"""`gateway bench` through the gateway against a REAL llama.cpp and a REAL vLLM (CPU builds, the tiny
generated models of tests/engines/setup.sh), one route each, the figures docs/bench.md publishes.

    python benchmarks/bench_engines.py [--out bench-engines] [--prompt-tokens 1000] [--output-tokens 256]

Starts llama-server (4 slots of 4,096 tokens) and vLLM (max_num_seqs 4, max_model_len 4096) on free
ports, `gateway serve` in front of them (routes `tiny-llamacpp` and `tiny-vllm`), then runs
`gateway bench --concurrency 1,2,4 --workload chat` against each route with the engine's /metrics,
writing OUT/<route>/bench.{json,csv,png}. Both engines run on CPU 0 (nice 10), the gateway and the bench on
the other CPUs (benchmarks/cpus.py). Everything is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cpus import isolate_engine  # noqa: E402
from tests.engines.servers import free_port, start_llamacpp, start_vllm  # noqa: E402


def wait_listening(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the gateway did not start on port {port}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench-engines")
    p.add_argument("--prompt-tokens", default="1000")
    p.add_argument("--output-tokens", default="256")
    p.add_argument("--requests", default="16")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (
        start_llamacpp(ctx_per_slot=4096, parallel=4, log_path=out / "llamacpp.log") as llama,
        start_vllm(max_model_len=4096, max_num_seqs=4, log_path=out / "vllm.log") as vllm,
    ):
        # Both engines on CPU 0 (nice 10), the gateway and the bench on the rest: a CPU engine keeps
        # its cores busy while it decodes, and a client scheduled late times the engine's CPU, not
        # the answer (docs/bench.md, "Accuracy").
        isolate_engine(llama.pid, vllm.pid)
        config = {
            "pools": {
                "vllm": {"engine": "vllm", "backends": [{"url": vllm.base_url, "name": "vllm-0", "model": "tiny"}]},
                "llamacpp": {
                    "engine": "llamacpp",
                    "backends": [{"url": llama.base_url, "name": "llamacpp-0", "model": "tiny"}],
                },
            },
            "routes": [{"model": "tiny-vllm", "pools": ["vllm"]}, {"model": "tiny-llamacpp", "pools": ["llamacpp"]}],
        }
        (out / "gateway.yaml").write_text(yaml.safe_dump(config))
        port = free_port()
        serve = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(out / "gateway.yaml"),
            "--port",
            str(port),
        ]
        with (out / "gateway.log").open("w") as log:
            gateway = subprocess.Popen(
                [*serve, "--port", str(port), "--log-level", "warning"], env=env, stdout=log, stderr=log
            )
            try:
                wait_listening(port)
                for route, engine in (("tiny-vllm", vllm), ("tiny-llamacpp", llama)):
                    bench = [
                        sys.executable, "-m", "gateway.cli", "bench", "--target", f"http://127.0.0.1:{port}",
                        "--model", route, "--concurrency", "1,2,4", "--workload", "chat",
                        "--prompt-tokens", args.prompt_tokens, "--output-tokens", args.output_tokens,
                        "--requests", args.requests, "--warmup", "2", "--engine-metrics", engine.base_url,
                        "--out", str(out / route),
                    ]  # fmt: skip
                    print("$ gateway", " ".join(bench[3:]), flush=True)
                    subprocess.run(bench, env=env, check=False)
            finally:
                gateway.terminate()
                gateway.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
