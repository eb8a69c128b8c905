"""Whether tracing is on and how, from gateway.yaml's `tracing:` block and the standard OTEL_*
environment variables (the block wins where it sets a value). Pure: the caller passes the
environment."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import TracingConfig
from gateway.value import value

DEFAULT_SERVICE = "llm-gateway"
_TRACES_PATH = "/v1/traces"


@value
class TracingSettings:
    endpoint: str | None
    """The OTLP/HTTP traces URL; None: the exporter's own reading of OTEL_EXPORTER_OTLP_*."""
    service_name: str
    sampler: str
    """An OTEL_TRACES_SAMPLER name: always_on, always_off, traceidratio, parentbased_*."""
    ratio: float
    """The ratio of a traceidratio sampler."""
    headers: Mapping[str, str]
    capture_content: bool
    max_content_chars: int
    source: str
    """What turned tracing on, for the start-up line and errors: `gateway.yaml` or the variable."""


_SAMPLERS = frozenset(
    {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
)


def switched_on_by(config: TracingConfig | None, env: Mapping[str, str]) -> str | None:
    """What turns tracing on (a name for messages), or None: it is off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if config is not None:
        return "gateway.yaml" if config.enabled else None
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if "otlp" in exporters:
        return "OTEL_TRACES_EXPORTER"
    if "none" in exporters:
        return None
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        if env.get(name, "").strip():
            return name
    return None


def tracing_settings(config: TracingConfig | None, env: Mapping[str, str]) -> TracingSettings | None:
    """The settings when tracing is on, else None. ValueError names a bad OTEL_* value."""
    source = switched_on_by(config, env)
    if source is None:
        return None
    block = config or TracingConfig()
    endpoint = None
    if block.endpoint is not None:
        endpoint = block.endpoint.rstrip("/") + _TRACES_PATH
    service = block.service_name or env.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE
    if block.sample_ratio is not None:
        sampler, ratio = "parentbased_traceidratio", block.sample_ratio
    else:
        sampler, ratio = _sampler_from(env)
    return TracingSettings(
        endpoint=endpoint,
        service_name=service,
        sampler=sampler,
        ratio=ratio,
        headers={k: v.get_secret_value() for k, v in block.headers.items()},
        capture_content=block.capture_content,
        max_content_chars=block.max_content_chars,
        source=source,
    )


def _sampler_from(env: Mapping[str, str]) -> tuple[str, float]:
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in _SAMPLERS:
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r} is not one of {', '.join(sorted(_SAMPLERS))}")
    arg = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    ratio = 1.0
    if name.endswith("traceidratio") and arg:
        try:
            ratio = float(arg)
        except ValueError:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a number") from None
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not between 0 and 1")
    return name, ratio
