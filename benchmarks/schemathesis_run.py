"""schemathesis against the gateway's own /openapi.json: the gateway as its own process (`gateway serve`)
in front of two simulated vLLM engines (a simulator, not a real engine), on loopback.

Every operation of the description the gateway serves gets --max-examples generated requests per
phase (examples, coverage, fuzzing; valid and invalid bodies), and each answer is checked: no 5xx
(not_a_server_error), a documented status and content type, and a body that matches the documented
schema, so that an error is in the endpoint's protocol shape (OpenAI's, Anthropic's for /v1/messages*).
Operations the gateway does not serve yet (404 "No such endpoint") are left out and named.

    PYTHONPATH=$PWD python3 benchmarks/schemathesis_run.py --max-examples 200 --out /tmp/gateway-st

Exits with schemathesis's status (0: no failure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loopstack

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
# Any model name reaches the simulators (their one model is "tiny"), so generated bodies go all the way
# to an engine; the caps keep a generated max_tokens of 2**31-1 from streaming for minutes.
ROUTES = [
    {
        "model": "*",
        "name": "any",
        "pools": ["sim"],
        "caps": {"max_context_tokens": 4096, "max_tokens_limit": 64, "default_max_tokens": 16},
    }
]


def served_paths(base_url: str) -> tuple[list[str], list[str]]:
    """(served, not yet served) paths of the description: a path is missing when the gateway's own
    404 says "No such endpoint"."""
    with urllib.request.urlopen(f"{base_url}/openapi.json", timeout=10) as resp:
        doc = json.loads(resp.read())
    served, missing = [], []
    for path, item in doc["paths"].items():
        method = next(iter(item)).upper()
        url = base_url + path.replace("{response_id}", "resp_probe").replace("{model}", "probe")
        request = urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method)
        request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10):
                served.append(path)
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            (missing if err.code == 404 and "No such endpoint" in body else served).append(path)
    return served, missing


def schemathesis_argv(base_url: str, paths: list[str], max_examples: int, seed: int, report: Path) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{base_url}/openapi.json",
        "--url",
        base_url,
        "--checks",
        CHECKS,
        "--mode",
        "all",
        "--phases",
        "examples,coverage,fuzzing",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        "1",
        "--request-timeout",
        "20",
        "--suppress-health-check",
        "all",
        "--no-shrink",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
    ]
    for path in paths:
        argv += ["--include-path", path]
    return argv


def summarise(report: Path) -> dict[str, int]:
    """Requests sent and statuses seen, from schemathesis's ndjson events."""
    statuses: dict[str, int] = {}
    for line in report.read_text().splitlines():
        for status in _statuses(json.loads(line)):
            statuses[str(status)] = statuses.get(str(status), 0) + 1
    return dict(sorted(statuses.items()))


def _statuses(event: object) -> list[int]:
    """Every response status_code inside one event (the format nests them deeply)."""
    out: list[int] = []
    stack = [event]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "status_code" in node and isinstance(node["status_code"], int) and "elapsed" in node:
                out.append(node["status_code"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("/tmp/gateway-schemathesis"))
    args = parser.parse_args()
    report = args.out / "events.ndjson"
    params = {"preset": "fast", "fault": "tokens=8"}
    with loopstack.running_stack(args.out, 2, params, {}, routes=ROUTES) as stack:
        served, missing = served_paths(stack.gateway_url)
        print(f"gateway at {stack.gateway_url}; served: {len(served)} paths; not served yet: {missing or 'none'}")
        started = time.monotonic()
        argv = schemathesis_argv(stack.gateway_url, served, args.max_examples, args.seed, report)
        rc = subprocess.run(argv, check=False, cwd=args.out).returncode
        elapsed = time.monotonic() - started
        rss = loopstack.rss_kib(stack.pid)
    statuses = summarise(report)
    print(json.dumps({"rc": rc, "seconds": round(elapsed, 1), "statuses": statuses, "gateway_rss_kib": rss}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
