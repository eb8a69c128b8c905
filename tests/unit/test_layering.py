"""The import layering of docs/design.md: engines/ never imports gateway/, and the pure policy
modules import nothing that does I/O (no sockets, clients, servers, logging or asyncio)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "gateway/prefix.py",
    "gateway/rules.py",
    "gateway/balancer.py",
    "gateway/caps.py",
    "gateway/kv.py",
    "gateway/inbound.py",
    "gateway/sse.py",
    "gateway/errors.py",
    "gateway/config.py",
    "gateway/access/keys.py",
    "gateway/access/limiter.py",
    "gateway/protocols/frames.py",
    "gateway/protocols/anthropic_errors.py",
    "gateway/protocols/messages_translate.py",
    "gateway/protocols/messages_stream.py",
    "gateway/protocols/responses_translate.py",
    "gateway/protocols/responses_stream.py",
    "gateway/protocols/response_store.py",
    "gateway/protocols/reasoning.py",
    "gateway/protocols/native_observers.py",
    "gateway/bench/stats.py",
]
IO_MODULES = {
    "asyncio",
    "aiohttp",
    "httpx",
    "socket",
    "logging",
    "uvicorn",
    "starlette",
    "subprocess",
    "requests",
    "urllib.request",
    "prometheus_client",
    "time",
}


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


@pytest.mark.parametrize("path", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "engines").glob("*.py")))
def test_engines_never_import_gateway(path: str) -> None:
    bad = {m for m in imports(ROOT / path) if m == "gateway" or m.startswith("gateway.")}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", PURE)
def test_pure_modules_do_no_io(path: str) -> None:
    found = {m for m in imports(ROOT / path) if m in IO_MODULES or m.split(".")[0] in IO_MODULES}
    assert not found, f"{path} imports {found}"


def test_one_composition_root() -> None:
    """Only app.py builds the long-lived objects; no module keeps a mutable global registry."""
    builders = [p for p in (ROOT / "gateway").glob("*.py") if "GatewayMetrics()" in p.read_text()]
    assert {p.name for p in builders} <= {"app.py", "explain.py"}
