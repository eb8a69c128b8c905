"""The ASGI application: the composition root (build.py), its routes, OpenAPI document and start-up
banner. It knows nothing of the HTTP server that runs it (serving/)."""
