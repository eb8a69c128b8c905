"""schemathesis against the gateway's own /openapi.json, a real uvicorn in front of simulated engines:
generated valid and invalid requests for every served operation; no 5xx, and every answer (errors
included) has a documented status, content type and body shape. docs/reliability.md "Load and soak"."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from tests.live.conftest import StackFactory, sim_params

pytestmark = [pytest.mark.live, pytest.mark.slow]

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
ANY_MODEL = [
    {
        "model": "*",
        "name": "any",
        "pools": ["vllm"],
        "caps": {"max_context_tokens": 4096, "max_tokens_limit": 64, "default_max_tokens": 16},
    }
]


async def served_paths(client: httpx.AsyncClient) -> tuple[list[str], list[str]]:
    """(served, not yet served): a path is not served when the gateway's own 404 says "No such endpoint"."""
    doc = (await client.get("/openapi.json")).json()
    served: list[str] = []
    missing: list[str] = []
    for path, item in doc["paths"].items():
        method = next(iter(item)).upper()
        url = path.replace("{response_id}", "resp_probe").replace("{model}", "probe")
        resp = await client.request(method, url, content=b"{}" if method == "POST" else None)
        gone = resp.status_code == 404 and "No such endpoint" in resp.text
        (missing if gone else served).append(path)
    return served, missing


async def test_schemathesis_finds_no_5xx_and_no_off_shape_error(make_stack: StackFactory, tmp_path: Path) -> None:
    pytest.importorskip("schemathesis")
    stack = await make_stack(
        pools={"vllm": [sim_params(fault="tokens=8"), sim_params(fault="tokens=8")]}, routes=ANY_MODEL
    )
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        served, missing = await served_paths(client)
    assert {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/metrics"} <= set(served)
    report = tmp_path / "events.ndjson"
    argv = [
        *(sys.executable, "-m", "schemathesis.cli", "run", f"{stack.base_url}/openapi.json"),
        *("--url", stack.base_url, "--checks", CHECKS, "--mode", "all", "--phases", "coverage,fuzzing"),
        *("--max-examples", "10", "--seed", "12", "--workers", "1", "--request-timeout", "20"),
        *("--suppress-health-check", "all", "--no-shrink"),
        *("--report", "ndjson", "--report-ndjson-path", str(report)),
    ]
    for path in served:
        argv += ["--include-path", path]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"not served yet: {missing}\n{text[-6000:]}"
    statuses = [s for line in report.read_text().splitlines() for s in _statuses(json.loads(line))]
    assert len(statuses) >= 200, text[-2000:]  # a few hundred generated requests reached the gateway
    assert 200 in statuses and 400 in statuses  # valid bodies got answers, invalid ones errors
    assert not [s for s in statuses if s >= 500]


def _statuses(event: object) -> list[int]:
    out: list[int] = []
    stack = [event]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("status_code"), int) and "elapsed" in node:
                out.append(node["status_code"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out
