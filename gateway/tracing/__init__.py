"""Request tracing: the interface the pipeline speaks (base.py), when tracing is on (settings.py), and
its OpenTelemetry implementation (otel.py, imported only when tracing is on)."""
