"""Whether tracing is on and how, from gateway.yaml's `tracing:` block and the standard OTEL_*
environment variables (the block wins where it sets a value). Pure: the caller passes the
environment."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from gateway.config import TracingConfig
from gateway.value import value

DEFAULT_SERVICE = "llm-gateway"
_TRACES_PATH = "/v1/traces"
_DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"
_COMPRESSIONS = frozenset({"none", "gzip", "deflate"})


@value
class ExportSettings:
    """Where and how the spans go: the OTLP/HTTP exporter's and the batch processor's standard
    variables (OTEL_EXPORTER_OTLP_*, OTEL_BSP_*), as the OpenTelemetry Python SDK reads them."""

    endpoint: str
    """The full traces URL."""
    headers: Mapping[str, str]
    timeout_s: float
    compression: str
    """none, gzip or deflate."""
    certificate: str | None
    client_certificate: str | None
    client_key: str | None
    delay_s: float
    """OTEL_BSP_SCHEDULE_DELAY: how long the first span of a batch waits for others."""
    max_queue: int
    max_batch: int


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
    """The block's headers (they replace OTEL_EXPORTER_OTLP_HEADERS); `export` has those sent."""
    capture_content: bool
    max_content_chars: int
    source: str
    """What turned tracing on, for the start-up line and errors: `gateway.yaml` or the variable."""
    resource: Mapping[str, str]
    """OTEL_RESOURCE_ATTRIBUTES, with service.name set to `service_name`."""
    export: ExportSettings


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
    resource = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    service = block.service_name or env.get("OTEL_SERVICE_NAME", "").strip()
    service = service or resource.get("service.name") or DEFAULT_SERVICE
    resource["service.name"] = service
    headers = {k: v.get_secret_value() for k, v in block.headers.items()}
    if block.sample_ratio is not None:
        sampler, ratio = "parentbased_traceidratio", block.sample_ratio
    else:
        sampler, ratio = _sampler_from(env)
    return TracingSettings(
        endpoint=endpoint,
        service_name=service,
        sampler=sampler,
        ratio=ratio,
        headers=headers,
        capture_content=block.capture_content,
        max_content_chars=block.max_content_chars,
        source=source,
        resource=resource,
        export=_export_from(endpoint, headers, env),
    )


def _pairs(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS), values percent-decoded;
    an item without `=` is skipped, as the SDK does."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, eq, val = item.partition("=")
        if eq and key.strip():
            out[unquote(key.strip())] = unquote(val.strip())
    return out


def _export_from(endpoint: str | None, headers: Mapping[str, str], env: Mapping[str, str]) -> ExportSettings:
    def var(name: str) -> str:
        """The traces-specific variable, else the general one ("" when neither is set)."""
        return (env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}") or "").strip()

    if endpoint is None:
        traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        general = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        endpoint = traces or (general.rstrip("/") + _TRACES_PATH if general else _DEFAULT_ENDPOINT)
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"the OTLP traces endpoint {endpoint!r} is not an http:// or https:// URL")
    compression = var("COMPRESSION").lower() or "none"
    if compression not in _COMPRESSIONS:
        raise ValueError(f"OTEL_EXPORTER_OTLP_COMPRESSION={compression!r} is not one of gzip, deflate, none")
    queue = int(_number(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048))
    return ExportSettings(
        endpoint=endpoint,
        headers=dict(headers) or _pairs(var("HEADERS")),
        timeout_s=_number(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", _number(env, "OTEL_EXPORTER_OTLP_TIMEOUT", 10.0)),
        compression=compression,
        certificate=var("CERTIFICATE") or None,
        client_certificate=var("CLIENT_CERTIFICATE") or None,
        client_key=var("CLIENT_KEY") or None,
        delay_s=_number(env, "OTEL_BSP_SCHEDULE_DELAY", 5000.0) / 1000,
        max_queue=queue,
        max_batch=min(int(_number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)), queue),
    )


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number from `name`, else `default` (unset); ValueError names a bad one."""
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None
    if not number > 0:
        raise ValueError(f"{name}={text!r} is not above 0")
    return number


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
