"""Config loading: the shipped gateway.yaml, path-qualified errors, ${ENV} substitution."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config_loader import ConfigError, load_config, parse_config

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

MINIMAL = {
    "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://127.0.0.1:1"}]}},
    "routes": [{"model": "m", "pools": ["p"]}],
}


def test_shipped_config_loads() -> None:
    config = load_config(ROOT / "gateway.yaml", env={})
    ports = sorted(b.url.rsplit(":", 1)[1] for p in config.pools.values() for b in p.backends)
    assert ports == ["30000", "8000", "8080"]
    assert config.server.port == 4000
    route = config.route_for("anything")
    assert route is not None and route.pools[0] == "vllm"
    assert [r.pool for r in route.rules][-1] == "vllm"


def test_errors_name_the_yaml_path() -> None:
    bad = {**MINIMAL, "routes": [{"model": "m", "pools": ["nope"], "bogus": 1}], "timeouts": {"connect_s": -1}}
    with pytest.raises(ConfigError) as info:
        parse_config(bad, env={})
    text = "\n".join(info.value.problems)
    assert "routes.0.bogus" in text
    assert "timeouts.connect_s" in text


def test_reference_errors() -> None:
    bad = {**MINIMAL, "routes": [{"model": "m", "pools": ["p", "q"], "rules": [{"pool": "z"}]}]}
    with pytest.raises(ConfigError) as info:
        parse_config(bad, env={})
    text = "\n".join(info.value.problems)
    assert "routes.0.pools.1: unknown pool 'q'" in text
    assert "routes.0.rules.0.pool" in text


def test_env_substitution() -> None:
    data = {
        **MINIMAL,
        "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://${HOST}:1", "api_key": "${KEY:-fallback}"}]}},
    }
    config = parse_config(data, env={"HOST": "example"})
    backend = config.pools["p"].backends[0]
    assert backend.url == "http://example:1"
    assert backend.api_key is not None and backend.api_key.get_secret_value() == "fallback"
    assert "fallback" not in repr(config)  # secrets stay out of reprs and logs
    with pytest.raises(ConfigError, match="HOST is not set"):
        parse_config(data, env={})


def test_route_lookup_exact_beats_glob() -> None:
    data = {**MINIMAL, "routes": [{"model": "*", "name": "any", "pools": ["p"]}, {"model": "m", "pools": ["p"]}]}
    config = parse_config(data, env={})
    assert config.route_for("m").label == "m"  # type: ignore[union-attr]
    assert config.route_for("x").label == "any"  # type: ignore[union-attr]


def test_frozen() -> None:
    config = parse_config(MINIMAL, env={})
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen models
        config.server.port = 1


def test_an_empty_client_key_is_an_error_not_open_access() -> None:
    with pytest.raises(ConfigError, match="api_keys"):
        parse_config({**MINIMAL, "server": {"api_keys": ["${KEY:-}"]}}, env={})
