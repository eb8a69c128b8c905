"""When tracing is on, and how: gateway.yaml's `tracing:` block beside the standard OTEL_* variables
(gateway/tracing/settings.py, pure)."""

from __future__ import annotations

import pytest

from gateway.config import TracingConfig
from gateway.config_loader import ConfigError, parse_config
from gateway.tracing.settings import switched_on_by, tracing_settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("block", "env", "source"),
    [
        (None, {}, None),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        (None, {"OTEL_TRACES_EXPORTER": "console,otlp"}, "OTEL_TRACES_EXPORTER"),
        (None, {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, None),
        (TracingConfig(), {}, "gateway.yaml"),
        (TracingConfig(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        (TracingConfig(), {"OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_what_turns_tracing_on(block: TracingConfig | None, env: dict[str, str], source: str | None) -> None:
    assert switched_on_by(block, env) == source
    assert (tracing_settings(block, env) is None) == (source is None)


def test_the_block_wins_and_the_variables_fill_in() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4318",
        "OTEL_SERVICE_NAME": "from-env",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    from_env = tracing_settings(None, env)
    assert from_env is not None
    assert from_env.endpoint is None  # the exporter reads OTEL_EXPORTER_OTLP_* itself
    assert (from_env.service_name, from_env.sampler, from_env.ratio) == ("from-env", "parentbased_traceidratio", 0.25)
    block = TracingConfig(endpoint="http://yaml:4318/", service_name="from-yaml", sample_ratio=0.01)
    mine = tracing_settings(block, env)
    assert mine is not None
    assert mine.endpoint == "http://yaml:4318/v1/traces"
    assert (mine.service_name, mine.sampler, mine.ratio) == ("from-yaml", "parentbased_traceidratio", 0.01)
    default = tracing_settings(TracingConfig(), {})
    assert default is not None
    assert (default.service_name, default.sampler, default.ratio) == ("llm-gateway", "parentbased_always_on", 1.0)
    assert default.capture_content is False


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "is not a number"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, "between 0 and 1"),
    ],
)
def test_a_bad_variable_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tracing_settings(TracingConfig(), env)


def test_the_block_is_validated_with_its_path() -> None:
    base = {
        "pools": {"p": {"engine": "sim", "backends": [{"url": "http://x:1"}]}},
        "routes": [{"model": "m", "pools": ["p"]}],
    }
    for bad, where in (
        ({"endpoint": "collector:4318"}, "tracing.endpoint"),
        ({"sample_ratio": 1.5}, "tracing.sample_ratio"),
        ({"max_content_chars": 0}, "tracing.max_content_chars"),
        ({"sampler": "always_on"}, "tracing.sampler"),
    ):
        with pytest.raises(ConfigError, match=where):
            parse_config({**base, "tracing": bad}, env={})
    config = parse_config({**base, "tracing": {"headers": {"x-key": "s3cret"}}}, env={})
    assert config.tracing is not None and "s3cret" not in repr(config.tracing)
