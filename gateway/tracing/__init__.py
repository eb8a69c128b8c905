"""Request tracing: the interface the pipeline speaks (base.py), when tracing is on (settings.py),
and the tracer that records to OTLP/HTTP (recorder.py: sampler.py, record.py, otlp.py, exporter.py;
imported only when tracing is on)."""
