"""Fixtures for the real-engine integration tier: real llama-server, vLLM and SGLang processes.

- ``llamacpp_server`` (session): llama-server on the tiny GGUF, 4 slots of 512 tokens each, --metrics.
- ``llamacpp_no_alias`` (session): the same, started with no alias (it serves the model file's path).
- ``vllm_server`` (session): vLLM on the tiny HF model, max_model_len 1024, max_num_seqs 2, its Responses
  store on (``VLLM_ENABLE_RESPONSES_API_STORE=1``).
- ``vllm_long_server`` (session): vLLM with max_model_len 4096 and max_num_seqs 2, the window the
  leave tests' 4,000-token streams need; they start a fresh one only when this one hands a whole
  stream over at once.
- ``sglang_server`` (session): SGLang on the CPU on the tiny HF model, context_length 4096,
  max_running_requests 4, --enable-metrics, --enable-cache-report. ``GATEWAY_SGLANG=0`` skips its tests
  (loudly; a FAILURE when CI=true); ``GATEWAY_SGLANG=1`` makes a missing install a failure.
- ``engine_launcher`` (function): ``launch("llamacpp" | "vllm" | "sglang", **kwargs)`` starts an extra
  server with custom settings (see tests/engines/servers.py ``start_llamacpp`` / ``start_vllm`` /
  ``start_sglang``); all are stopped at teardown.

Each yields a ``servers.EngineServer``: ``.base_url`` (``http://127.0.0.1:PORT``), ``.v1_url``,
``.health_url``, ``.metrics_url``, ``.model == "tiny"``, ``.max_context``, ``.parallel``, ``.kind``,
``.pid``, ``.log_path``, ``.ready_seconds``, ``.stop()``.

When an engine is not installed (run ``bash tests/engines/setup.sh``) its tests are SKIPPED with a loud
reason, and the terminal summary says so; with ``GATEWAY_REQUIRE_ENGINES=1`` they FAIL instead (CI).
Every test under tests/integration/ gets the ``integration`` marker.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent
_MISSING_KEY = pytest.StashKey[dict[str, str]]()
_OPT_OUT_KEY = pytest.StashKey[dict[str, str]]()
# Engines with a switch of their own (heavy install; see docs/testing.md): 0 skips the engine's tests
# for a quick local run (a failure when CI=true); 1 makes them required; unset: like any engine.
OPT_OUT: dict[str, str] = {"sglang": "GATEWAY_SGLANG"}


def _load_servers() -> ModuleType:
    try:
        from tests.engines import servers

        return servers
    except ImportError:
        path = _HERE.parent / "engines" / "servers.py"
        spec = importlib.util.spec_from_file_location("gateway_test_engine_servers", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


servers = _load_servers()


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def _require_engine(config: pytest.Config, kind: str) -> None:
    """Skip (or, with GATEWAY_REQUIRE_ENGINES=1, fail) when the engine is not installed. An engine with
    a switch in OPT_OUT is skipped when it is 0 (but fails in CI), and required (a missing install
    fails) when it is 1."""
    var = OPT_OUT.get(kind)
    switch = os.environ.get(var, "") if var is not None else ""
    if switch == "0":
        reason = f"REAL ENGINE {kind!r} NOT RUN: {var}=0 skips it (a local run only; docs/testing.md)"
        if _in_ci():
            pytest.fail(f"CI never skips a real engine, and {reason}", pytrace=False)
        config.stash.setdefault(_OPT_OUT_KEY, {})[kind] = reason
        pytest.skip(reason)
    reason = servers.engine_missing(kind)
    if reason is None:
        return
    config.stash.setdefault(_MISSING_KEY, {})[kind] = reason
    if os.environ.get("GATEWAY_REQUIRE_ENGINES") == "1" or switch == "1":
        why = f"{var}=1" if switch == "1" else "GATEWAY_REQUIRE_ENGINES=1"
        pytest.fail(f"{why} and {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    missing = config.stash.get(_MISSING_KEY, {})
    if missing:
        terminalreporter.section("REAL ENGINES MISSING", sep="!", red=True, bold=True)
        for reason in missing.values():
            terminalreporter.line(reason, red=True)
    opted_out = config.stash.get(_OPT_OUT_KEY, {})
    if opted_out:
        terminalreporter.section("REAL ENGINES SWITCHED OFF", sep="!", yellow=True, bold=True)
        for reason in opted_out.values():
            terminalreporter.line(reason, yellow=True)


def scoped_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, kind: str, log_name: str, **kwargs: Any
) -> Iterator[Any]:
    """The body of a fixture that starts one engine (`servers.STARTERS[kind](**kwargs)`) for its
    scope, its log in a folder of the session's temporary files, and stops it at the scope's end."""
    _require_engine(request.config, kind)
    server = servers.STARTERS[kind](log_path=tmp_path_factory.mktemp("engines") / log_name, **kwargs)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def llamacpp_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from scoped_engine(
        request, tmp_path_factory, "llamacpp", "llamacpp-session.log", ctx_per_slot=512, parallel=4
    )


@pytest.fixture(scope="session")
def llamacpp_no_alias(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """llama-server as a user starts it, with no `-a`: it serves (and `.model` is) the model file's path."""
    yield from scoped_engine(
        request, tmp_path_factory, "llamacpp", "llamacpp-no-alias.log", ctx_per_slot=512, parallel=4, alias=None
    )


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # The Responses store on (off by default): previous_response_id and GET by id need it, and no
    # other test depends on its absence; one server instead of a second one for the Responses tests.
    store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    yield from scoped_engine(
        request, tmp_path_factory, "vllm", "vllm-session.log", max_model_len=1024, max_num_seqs=2, extra_env=store
    )


@pytest.fixture(scope="session")
def vllm_long_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from scoped_engine(
        request, tmp_path_factory, "vllm", "vllm-long-session.log", max_model_len=4096, max_num_seqs=2
    )


@pytest.fixture(scope="session")
def sglang_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # 4096: a full-length generation lasts ~9 s here (1024: ~2 s), long enough to leave in the middle of it
    yield from scoped_engine(
        request, tmp_path_factory, "sglang", "sglang-session.log", context_length=4096, max_running_requests=4
    )


@pytest.fixture
def engine_launcher(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    started: list[Any] = []

    def launch(kind: str, **kwargs: Any) -> Any:
        _require_engine(request.config, kind)
        kwargs.setdefault("log_path", tmp_path / f"{kind}-{len(started)}.log")
        server = servers.STARTERS[kind](**kwargs)
        started.append(server)
        return server

    try:
        yield launch
    finally:
        for server in started:
            server.stop()
