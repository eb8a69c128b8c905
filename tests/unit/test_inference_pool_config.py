"""An `inference_pool` backend entry in gateway.yaml: what it may be combined with, the errors that
name its path, and `gateway epp --pool-name/--pool-namespace` renaming it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import with_inference_pool
from gateway.config_loader import ConfigError, parse_config

pytestmark = pytest.mark.unit


def config(*backends: dict[str, Any]) -> dict[str, Any]:
    return {"pools": {"p": {"engine": "vllm", "backends": list(backends)}}, "routes": [{"model": "m", "pools": ["p"]}]}


def test_an_entry_needs_a_url_or_an_inference_pool_and_not_both() -> None:
    loaded = parse_config(config({"name": "v", "inference_pool": {"name": "vllm", "namespace": "llm"}}), env={})
    ref = loaded.pools["p"].backends[0].inference_pool
    assert ref is not None and (ref.name, ref.namespace) == ("vllm", "llm")
    for bad in (
        {"url": "http://v:8000", "inference_pool": {"name": "vllm"}},
        {"inference_pool": {"name": "vllm"}, "discover": True},
        {"name": "v"},
    ):
        with pytest.raises(ConfigError) as err:
            parse_config(config(bad), env={})
        assert any("pools.p.backends.0" in p for p in err.value.problems), err.value.problems
    with pytest.raises(ConfigError) as err:
        parse_config(config({"inference_pool": {"name": "Not_A_Name"}}), env={})
    assert any("pools.p.backends.0.inference_pool.name" in p for p in err.value.problems), err.value.problems


def test_the_epp_flags_rename_the_one_entry() -> None:
    loaded = parse_config(config({"inference_pool": {"name": "vllm"}}, {"url": "http://x:1"}), env={})
    renamed = with_inference_pool(loaded, "other", "team-a")
    ref = renamed.pools["p"].backends[0].inference_pool
    assert ref is not None and (ref.name, ref.namespace) == ("other", "team-a")
    assert renamed.pools["p"].backends[1].url == "http://x:1"
    assert with_inference_pool(loaded, None, None) is loaded
    with pytest.raises(ValueError, match="has 0"):
        with_inference_pool(parse_config(config({"url": "http://x:1"}), env={}), "vllm", None)
    with pytest.raises(ValueError):
        with_inference_pool(loaded, "Bad_Name", None)


def test_gateway_plan_prints_a_pod_command_for_an_inference_pool_entry() -> None:
    from gateway.tools.plan import render_plan

    loaded = parse_config(config({"inference_pool": {"name": "vllm"}, "model": "m"}), env={})
    text = render_plan(loaded, kv_config=None, parallel=4, windows={})
    assert "# the pods of InferencePool vllm" in text
    assert "--host 0.0.0.0 --port 8000" in text
