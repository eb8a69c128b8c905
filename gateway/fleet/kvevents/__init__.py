"""Routing from what the engines cache: their KV events (vLLM, SGLang) decoded, indexed per engine
and kept current by one subscriber per engine. Needs the `kv-events` extra (pyzmq, msgspec); nothing
imports this package unless a backend names an event endpoint."""
