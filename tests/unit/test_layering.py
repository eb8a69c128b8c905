"""The import layering of docs/design.md, as folder rules: everything under gateway/policy/ is pure
(no I/O, logging, awaits or clock reads), engines/ never imports gateway/, and the simulator
(engines/sim/) imports neither gateway/ nor the engine adapters."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
# Pure modules outside policy/: the protocol parsers, translators and observers, and the leaves.
PURE_ELSEWHERE = [
    "gateway/protocols/inbound.py",
    "gateway/protocols/sse.py",
    "gateway/errors.py",
    "gateway/config/__init__.py",
    "gateway/config/schema.py",
    "gateway/config/settings.py",
    "gateway/config/pools.py",
    "gateway/config/routes.py",
    "gateway/value.py",
    "gateway/access/keys.py",
    "gateway/access/limiter.py",
    "gateway/protocols/frames.py",
    "gateway/protocols/anthropic_errors.py",
    "gateway/protocols/messages_translate.py",
    "gateway/protocols/messages_reply.py",
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
# policy/ may not read the environment, the clock or a random source either.
POLICY_FORBIDDEN = IO_MODULES | {"datetime", "os", "random", "threading"}
# Modules outside policy/ that policy may import: leaves that are pure themselves.
POLICY_MAY_IMPORT = {"gateway.config", "gateway.errors", "gateway.value", "engines.base", "engines.context_error"}


def _files(folder: str) -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*.py"))


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def _awaits(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bad = (ast.Await, ast.AsyncFunctionDef, ast.AsyncFor, ast.AsyncWith)
    return [type(node).__name__ for node in ast.walk(tree) if isinstance(node, bad)]


@pytest.mark.parametrize("path", _files("engines"))
def test_engines_never_import_gateway(path: str) -> None:
    bad = {m for m in imports(ROOT / path) if m == "gateway" or m.startswith("gateway.")}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", _files("engines/sim"))
def test_simulator_imports_only_itself(path: str) -> None:
    """The simulator is the independent check on the adapters: it must not share their code."""
    ours = {m for m in imports(ROOT / path) if m.split(".")[0] in ("gateway", "engines")}
    bad = {m for m in ours if not (m == "engines.sim" or m.startswith("engines.sim."))}
    assert not bad, f"{path} imports {bad}"


@pytest.mark.parametrize("path", _files("gateway/policy"))
def test_policy_is_pure(path: str) -> None:
    found = {m for m in imports(ROOT / path) if m in POLICY_FORBIDDEN or m.split(".")[0] in POLICY_FORBIDDEN}
    assert not found, f"{path} imports {found}"
    assert not _awaits(ROOT / path), f"{path} awaits"
    ours = {m for m in imports(ROOT / path) if m.split(".")[0] in ("gateway", "engines")}
    outside = {
        m
        for m in ours
        if not m.startswith("gateway.policy")
        and m not in POLICY_MAY_IMPORT
        and not any(m.startswith(ok + ".") for ok in POLICY_MAY_IMPORT)
    }
    assert not outside, f"{path} imports {outside} from outside policy/"


@pytest.mark.parametrize("path", PURE_ELSEWHERE)
def test_pure_modules_elsewhere_do_no_io(path: str) -> None:
    found = {m for m in imports(ROOT / path) if m in IO_MODULES or m.split(".")[0] in IO_MODULES}
    assert not found, f"{path} imports {found}"
    assert not _awaits(ROOT / path), f"{path} awaits"


def test_one_composition_root() -> None:
    """Only app/build.py builds the long-lived objects; no module keeps a mutable global registry."""
    builders = [p for p in (ROOT / "gateway").rglob("*.py") if "GatewayMetrics()" in p.read_text()]
    assert {p.relative_to(ROOT / "gateway").as_posix() for p in builders} <= {"app/build.py", "tools/explain.py"}


def test_the_upstream_client_has_one_boundary() -> None:
    """One boundary for the connection's own errors (httpx's map_httpcore_exceptions pattern): only
    upstream/client.py and its pool see upstream/connection.py; nothing on the serving path uses aiohttp
    (`gateway bench` is a load client of its own, not the serving path)."""
    modules = [p for p in (ROOT / "gateway").rglob("*.py")]
    aiohttp_users = {p.relative_to(ROOT).as_posix() for p in modules if "aiohttp" in imports(p)}
    assert {u for u in aiohttp_users if not u.startswith("gateway/bench/")} == set()
    connection_users = {p.relative_to(ROOT).as_posix() for p in modules if "gateway.upstream.connection" in imports(p)}
    assert connection_users == {"gateway/upstream/client.py", "gateway/upstream/pool.py"}


def test_only_the_endpoint_uncancels() -> None:
    """One owner decides why a request ended; nothing else swallows a cancellation."""
    users = {p.relative_to(ROOT).as_posix() for p in (ROOT / "gateway").rglob("*.py") if ".uncancel(" in p.read_text()}
    assert users == {"gateway/pipeline/endpoint.py"}


def test_the_pipeline_has_no_protocol_branches() -> None:
    """The pipeline is parameterised by a ProtocolAdapter: no test of which protocol it is."""
    for path in (ROOT / "gateway" / "pipeline").rglob("*.py"):
        text = path.read_text()
        for name in ("chat", "completions", "embeddings", "messages", "responses"):
            assert f'== "{name}"' not in text and f'!= "{name}"' not in text, f"{path.name} branches on {name}"


# Every top-level module and folder of gateway/, lowest first: a unit may import its own layer and the
# layers below it, never one above. engines/ is below everything (it never imports gateway/).
LAYERS: list[set[str]] = [
    {"engines", "value", "errors", "asgi", "deadlines", "metric_types", "accesslog"},
    {"config", "metrics"},
    {"config_loader", "policy"},
    {"hostinfo", "protocols", "upstream", "access", "tracing"},
    {"fleet"},
    {"pipeline"},
    {"app"},
    {"serving", "epp"},
    {"tools", "bench"},
    {"cli"},
]
LAYER_OF = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _unit(module: str) -> str | None:
    """The layering unit of a module of ours: `engines`, or gateway's top-level module or folder."""
    parts = module.split(".")
    if parts[0] == "engines":
        return "engines"
    return parts[1] if parts[0] == "gateway" and len(parts) > 1 else None


def _gateway_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / "gateway").rglob("*.py")}


def test_every_folder_has_a_layer() -> None:
    units = {u for name in _gateway_modules() if (u := _unit(name)) is not None}
    assert units <= set(LAYER_OF), f"place {sorted(units - set(LAYER_OF))} in LAYERS"


@pytest.mark.parametrize("path", [p for p in _files("gateway") if p != "gateway/__init__.py"])
def test_no_import_reaches_a_higher_layer(path: str) -> None:
    own = _unit(_module_name(ROOT / path))
    assert own is not None
    upward = {m for m in imports(ROOT / path) if (u := _unit(m)) is not None and LAYER_OF.get(u, 0) > LAYER_OF[own]}
    assert not upward, f"{path} (layer of {own}) imports {upward} from a higher layer"


def test_no_import_cycle_between_modules() -> None:
    """Type-only imports count too: a cycle of them is a sign two modules are one."""
    modules = _gateway_modules()
    graph = {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def cycle_from(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*trail[trail.index(nxt) :], nxt] if nxt in trail else [*trail, nxt]
            if nxt not in state and (found := cycle_from(nxt, [*trail, nxt])):
                return found
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state:
            found = cycle_from(name, [name])
            assert found is None, " -> ".join(found)


def test_only_serving_knows_the_http_server() -> None:
    users = {p for p in _files("gateway") if any(m.split(".")[0] == "uvicorn" for m in imports(ROOT / p))}
    assert users and all(p.startswith("gateway/serving/") for p in users), users


def test_only_upstream_parses_responses() -> None:
    users = {p for p in _files("gateway") if "HttpResponseParser" in (ROOT / p).read_text(encoding="utf-8")}
    assert users == {"gateway/upstream/connection.py"}


def test_aiohttp_is_only_the_bench_extras() -> None:
    """`gateway serve` installs without aiohttp: it is the `bench` extra's, and only bench/ imports it."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    runtime = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    bench = text.split("\nbench = [", 1)[1].split("]", 1)[0]
    assert "aiohttp" not in runtime and "aiohttp" in bench


def test_grpc_is_only_the_epp_extras() -> None:
    """`gateway serve` loads no gRPC: only gateway/epp/ imports grpc or protobuf, cli.py imports it
    only inside the epp command, and the packages are an extra."""
    modules = [p for p in (ROOT / "gateway").rglob("*.py")]
    users = {
        p.relative_to(ROOT).as_posix()
        for p in modules
        if any(m.split(".")[0] == "grpc" or m.startswith("google.protobuf") for m in imports(p))
    }
    assert users and all(u.startswith("gateway/epp/") for u in users), users
    importers = {
        p.relative_to(ROOT).as_posix()
        for p in modules
        if not p.relative_to(ROOT).as_posix().startswith("gateway/epp/")
        and any(m.startswith("gateway.epp") for m in imports(p))
    }
    assert importers == {"gateway/cli.py"}
    cli = ast.parse((ROOT / "gateway/cli.py").read_text(encoding="utf-8"))
    assert not any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("gateway.epp") for n in cli.body)
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    runtime = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    epp = text.split("\nepp = [", 1)[1].split("]", 1)[0]
    assert "grpcio" not in runtime and "protobuf" not in runtime and "grpcio" in epp


def test_gateway_serve_loads_no_grpc() -> None:
    """The import check at run time: the serve path's modules, imported as `gateway serve` imports
    them, leave grpc and protobuf unloaded."""
    code = (
        "import sys, gateway.cli, gateway.serving.server, gateway.app.build; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc' or m.startswith('google.protobuf')"
        " or m.startswith('gateway.epp')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_tracing_needs_no_opentelemetry_package() -> None:
    """The tracer is the gateway's own (gateway/tracing/recorder.py): no module imports OpenTelemetry,
    only build.py imports the recorder (inside the function that runs when tracing is on), and the
    `otel` extra is an empty alias kept for those who install it."""
    modules = [p for p in (ROOT / "gateway").rglob("*.py")]
    users = {
        p.relative_to(ROOT).as_posix() for p in modules if any(m.split(".")[0] == "opentelemetry" for m in imports(p))
    }
    assert users == set()
    importers = {p.relative_to(ROOT).as_posix() for p in modules if "gateway.tracing.recorder" in imports(p)}
    assert importers == {"gateway/app/build.py"}
    build = ast.parse((ROOT / "gateway/app/build.py").read_text(encoding="utf-8"))
    top_level = {n.module for n in build.body if isinstance(n, ast.ImportFrom)}
    assert "gateway.tracing.recorder" not in top_level
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    runtime = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    otel = text.split("\notel = [", 1)[1].split("]", 1)[0]
    assert "opentelemetry" not in runtime and "opentelemetry" not in otel
