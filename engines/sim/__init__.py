"""The inference-engine simulator: its own HTTP server, engine flavours, performance model and
faults. It imports nothing from gateway/ or the engine adapters: it is the independent check on them."""
