"""The gateway's own HTTP/1.1 client to the engines: connection (asyncio protocol + httptools),
pool, and the client that sends one request."""
