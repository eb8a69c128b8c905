"""Routing by model name, the pure part: aliases -> route, the pools that serve a name exactly before
the rules, the wildcard rewrite to the one model a backend serves, the upstream name; and each
engine's /v1/models (+ llama.cpp's /props) read into served models with their window, from fixtures
recorded on the real engines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.adapters import adapter_for
from engines.base import ServedModel
from engines.table import MAX_MODELS
from gateway.config import GatewayConfig
from gateway.config_loader import parse_config
from gateway.policy.caps import ENGINE_WINDOW, ROUTE_CAP, decide, effective_cap
from gateway.policy.models import SERVED, ModelNames, build_index, choose_pool, upstream_model
from gateway.policy.rules import RequestFacts

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GGUF = "/models/tiny.gguf"


def shipped_like(**extra: Any) -> GatewayConfig:
    """gateway.yaml's pools and rules (mac/no-gpu -> llamacpp, shared prefix -> sglang, else vllm)."""
    data: dict[str, Any] = {
        "pools": {
            name: {"engine": name, "backends": [{"url": f"http://127.0.0.1:{port}"}]}
            for name, port in (("vllm", 8000), ("sglang", 30000), ("llamacpp", 8080))
        },
        "routes": [
            {
                "model": "*",
                "name": "default",
                "pools": ["vllm", "sglang", "llamacpp"],
                "rules": [
                    {"name": "no-gpu", "when": {"platform": "no_nvidia_gpu"}, "pool": "llamacpp"},
                    {"name": "shared-prefix", "when": {"shared_prefix": True}, "pool": "sglang"},
                    {"name": "default", "pool": "vllm"},
                ],
            }
        ],
        **extra,
    }
    return parse_config(data, env={})


def facts(model: str, platform: str = "nvidia_gpu", shared: bool = False) -> RequestFacts:
    return RequestFacts(model, False, False, {}, 10, shared, platform)  # type: ignore[arg-type]


# What each pool serves: vLLM and SGLang one exact name each, llama.cpp (no alias) its file path.
SERVES = {"vllm": ("Qwen/Qwen3-0.6B",), "sglang": ("Qwen/Qwen3-0.6B", "other"), "llamacpp": (GGUF,)}
INDEX = build_index((pool, f"{pool}-0", names) for pool, names in SERVES.items())
ALL_UP = {"vllm", "sglang", "llamacpp"}


def route_of(name: str, platform: str = "nvidia_gpu", shared: bool = False, up: set[str] = ALL_UP) -> tuple[str, str]:
    """(pool, rule) for a request for `name`, every pool in `up` healthy."""
    config = shipped_like(aliases={"my-model": "Qwen/Qwen3-0.6B"})
    resolved = ModelNames(config).resolve(name)
    assert resolved is not None
    servers = INDEX.pools(resolved.name).keys()
    serving = {p for p in servers if p in up}
    decision = choose_pool(resolved.route, facts(resolved.name, platform, shared), serving, up.__contains__, servers)
    assert decision is not None
    return decision.pool, decision.rule


# name, platform, shared prefix, healthy pools -> (pool, rule)
CASES = [
    # exact: only vLLM and SGLang serve it; the no-gpu rule's llama.cpp does not, so the rules choose
    # among the two that do, and the default rule names vLLM
    ("Qwen/Qwen3-0.6B", "no_nvidia_gpu", False, ALL_UP, ("vllm", "default")),
    # two pools serve it exactly: the rules decide (shared prefix -> SGLang)
    ("Qwen/Qwen3-0.6B", "nvidia_gpu", True, ALL_UP, ("sglang", "shared-prefix")),
    ("Qwen/Qwen3-0.6B", "nvidia_gpu", False, ALL_UP, ("vllm", "default")),
    # only SGLang serves "other": no rule names it for this request, so it is chosen as the server
    ("other", "nvidia_gpu", False, ALL_UP, ("sglang", SERVED)),
    # alias -> the model it stands for, then as above
    ("my-model", "no_nvidia_gpu", False, ALL_UP, ("vllm", "default")),
    # the llama.cpp file path is served only by llama.cpp, even where the default rule says vLLM
    (GGUF, "nvidia_gpu", False, ALL_UP, ("llamacpp", SERVED)),
    # none serving it: the rules as for any name
    ("unknown", "no_nvidia_gpu", False, ALL_UP, ("llamacpp", "no-gpu")),
    ("unknown", "nvidia_gpu", False, ALL_UP, ("vllm", "default")),
    # the rule's server is down: the route's next healthy server is the fallback
    ("Qwen/Qwen3-0.6B", "nvidia_gpu", False, {"sglang", "llamacpp"}, ("sglang", "fallback:sglang")),
    # every exact server is down: the rules, with their fallback
    ("Qwen/Qwen3-0.6B", "nvidia_gpu", False, {"llamacpp"}, ("llamacpp", "fallback:llamacpp")),
]


@pytest.mark.parametrize(("name", "platform", "shared", "up", "expected"), CASES)
def test_resolution_order(name: str, platform: str, shared: bool, up: set[str], expected: tuple[str, str]) -> None:
    assert route_of(name, platform, shared, up) == expected


# requested, name after aliases, backend's model:, route's upstream_model, served, wildcard -> sent (None: as sent)
UPSTREAM = [
    ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", None, None, ("Qwen/Qwen3-0.6B",), True, None),  # served: untouched
    ("unknown", "unknown", None, None, (GGUF,), True, GGUF),  # wildcard rewrite to the one it serves
    ("unknown", "unknown", None, None, ("a", "b"), True, None),  # serves two: no guess
    ("unknown", "unknown", None, None, (), True, None),  # reports nothing: as sent
    ("unknown", "unknown", None, None, ("a",), False, None),  # an exact route: no rewrite
    ("my-model", "Qwen/Qwen3-0.6B", None, None, ("Qwen/Qwen3-0.6B",), True, "Qwen/Qwen3-0.6B"),  # alias
    ("x", "x", "configured", None, ("other",), True, "configured"),  # the backend's model: wins
    ("x", "x", None, "route-up", ("other",), True, "route-up"),  # then the route's upstream_model
]


@pytest.mark.parametrize(("requested", "name", "configured", "route_up", "served", "wildcard", "sent"), UPSTREAM)
def test_upstream_model(
    requested: str,
    name: str,
    configured: str | None,
    route_up: str | None,
    served: tuple[str, ...],
    wildcard: bool,
    sent: str | None,
) -> None:
    got = upstream_model(
        requested, name, configured=configured, route_upstream=route_up, served=served, wildcard=wildcard
    )
    assert got == sent


def test_alias_order_global_then_route_and_exact_routes() -> None:
    data: dict[str, Any] = {
        "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://h:1"}]}},
        "aliases": {"g": "target-g", "both": "from-global"},
        "routes": [
            {"model": "exact", "pools": ["p"], "aliases": {"both": "from-route"}},
            {"model": "*", "name": "any", "pools": ["p"], "aliases": {"r": "target-r", "exact": "never"}},
        ],
    }
    names = ModelNames(parse_config(data, env={}))
    got = {n: (r.route.label, r.name) for n in ("g", "both", "r", "exact", "other") if (r := names.resolve(n))}
    assert got == {
        "g": ("any", "target-g"),
        "both": ("any", "from-global"),  # the global alias is checked first
        "r": ("any", "target-r"),
        "exact": ("exact", "exact"),  # an exact route beats a glob route's alias of the same name
        "other": ("any", "other"),
    }
    assert names.aliases() == {"both": "from-global", "r": "target-r", "exact": "never", "g": "target-g"}


def test_alias_must_be_a_plain_name() -> None:
    with pytest.raises(Exception, match="an alias is a plain name"):
        shipped_like(aliases={"llama-*": "x"})


def test_index_is_a_lookup_of_pool_and_backends() -> None:
    index = build_index([("a", "a-0", ["m"]), ("a", "a-1", ["m", "n"]), ("b", "b-0", ["n"])])
    assert dict(index.pools("m")) == {"a": ("a-0", "a-1")}
    assert dict(index.pools("n")) == {"a": ("a-1",), "b": ("b-0",)}
    assert dict(index.pools("nothing")) == {}


@pytest.mark.parametrize(
    ("route_cap", "window", "cap", "suffix"),
    [(65536, 1024, 1024, ENGINE_WINDOW), (512, 1024, 512, ROUTE_CAP), (None, 1024, 1024, ENGINE_WINDOW)],
)
def test_effective_cap_is_the_smaller(route_cap: int | None, window: int, cap: int, suffix: str) -> None:
    assert effective_cap(route_cap, window) == cap
    config = shipped_like()
    caps = config.routes[0].caps.model_copy(update={"max_context_tokens": route_cap})
    decision = decide(caps, cap + 1, None, window)
    assert decision.action == "reject"
    assert f"maximum context length is {cap} tokens" in decision.message
    assert decision.message.endswith(suffix)
    assert decide(caps, cap - 10, None, window).max_tokens == 10  # the default max_tokens: the room left


def body(engine: str, name: str) -> Any:
    return json.loads((FIXTURES / engine / name).read_text())["body"]


def test_vllm_models_fixture() -> None:
    served = adapter_for("vllm").parse_models([body("vllm", "models.json")])
    assert served == (ServedModel("tiny", "vllm", 1024),)


def test_sglang_models_fixture() -> None:
    # The served window (--context-length 1024), not /v1/tokenize's max_model_len (the config's 4096).
    served = adapter_for("sglang").parse_models([body("sglang", "proto_models.json")])
    assert served == (ServedModel("tiny", "sglang", 1024),)
    assert body("sglang", "proto_v1_tokenize_prompt.json")["max_model_len"] != 1024


def test_llamacpp_models_and_props_fixture() -> None:
    adapter = adapter_for("llamacpp")
    assert [c.path for c in adapter.models_calls] == ["/v1/models", "/props"]
    models, props = body("llamacpp", "models.json"), body("llamacpp", "props.json")
    # -c 2048 --parallel 4: 512 tokens a slot, in /props and in the entry's meta; n_ctx_train is not it
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 4
    assert adapter.parse_models([models, props]) == (ServedModel("tiny", "llamacpp", 512),)
    props = {"default_generation_settings": {"n_ctx": 300}}
    assert adapter.parse_models([models, props]) == (ServedModel("tiny", "llamacpp", 300),)  # /props wins
    assert adapter.parse_models([models, None]) == (ServedModel("tiny", "llamacpp", 512),)  # meta.n_ctx
    assert adapter.any_model and not adapter_for("vllm").any_model


@pytest.mark.parametrize(
    "doc", [None, [], {"data": "x"}, {"object": "list"}, "text", {"models": []}], ids=lambda d: repr(d)[:20]
)
def test_not_a_model_list(doc: Any) -> None:
    assert adapter_for("vllm").parse_models([doc]) is None


def test_models_are_bounded_and_deduplicated() -> None:
    data = [{"id": f"m{i % 50}", "max_model_len": True} for i in range(200)] + [{"id": 7}, {"id": ""}, "x"]
    served = adapter_for("openai").parse_models([{"data": data}])
    assert served is not None and len(served) == MAX_MODELS
    assert len({m.id for m in served}) == MAX_MODELS
    assert all(m.window is None and m.owned_by == "openai" for m in served)  # a bool is not a window


def test_a_pool_that_never_said_what_it_serves_is_the_rules_pick_then_the_fallback() -> None:
    # vLLM was down since start-up (nothing known); SGLang serves the name. The default rule names
    # vLLM, which might serve it: the request falls back to SGLang, labelled so.
    index = build_index([("vllm", "vllm-0", ()), ("sglang", "sglang-0", ("tiny",)), ("llamacpp", "l-0", (GGUF,))])
    assert index.unknown == frozenset({"vllm"})
    route = shipped_like().routes[0]
    servers = frozenset(index.pools("tiny").keys() | index.unknown)
    up = {"sglang", "llamacpp"}
    got = choose_pool(route, facts("tiny"), {"sglang"}, up.__contains__, servers)
    assert got is not None and (got.pool, got.rule) == ("sglang", "fallback:sglang")
    # where the platform rule names llama.cpp, which is known not to serve it, the next rule decides
    got = choose_pool(route, facts("tiny", "no_nvidia_gpu"), {"sglang"}, up.__contains__, servers)
    assert got is not None and (got.pool, got.rule) == ("sglang", "fallback:sglang")
