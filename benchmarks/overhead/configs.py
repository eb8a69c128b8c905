"""The files one run needs, written into its temporary folder: the nginx config and static bodies,
the gateway config, and the request bodies the load generators send."""

from __future__ import annotations

import json
from typing import Any

NGINX_CONF = """\
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    {json_log}
    types {{ application/json json; text/event-stream sse; }}
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port};
        root {tmp}/www;
        location ~ /health$ {{ default_type application/json; return 200 '{{}}'; }}
        # nginx answers POST on a static file with 405; error_page turns that into the file.
        location = /v1/chat/completions {{
            try_files /completion.json =404;
            error_page 405 =200 $uri;
        }}
        location = /sse/v1/chat/completions {{
            add_header Cache-Control no-cache;
            try_files /stream.sse =404;
            error_page 405 =200 $uri;
        }}
    }}
    # The stream again at the engine's own path, for a peer that cannot add a path prefix (Envoy
    # routing to the endpoint gateway epp picks sends the client's path as it is).
    server {{
        listen 127.0.0.1:{sse_port};
        root {tmp}/www;
        location ~ /health$ {{ default_type application/json; return 200 '{{}}'; }}
        location = /v1/chat/completions {{
            add_header Cache-Control no-cache;
            try_files /stream.sse =404;
            error_page 405 =200 $uri;
        }}
    }}
}}
"""


def json_log(path: str = "", port: int = 0) -> str:
    """NGINX_CONF's `json_log`: no access log, or one line a request to the json location of the
    server on `port` at `path` (followed by kv_publisher.py). Conditional at the http level because
    the location's error_page redirect logs under the server's settings, not the location's."""
    if not path:
        return "access_log off;"
    return (
        f'map "$server_port $request_uri" $json_request {{ "{port} /v1/chat/completions" 1; default 0; }}\n'
        f"    access_log {path} combined if=$json_request;"
    )


# One route per upstream, with rules and caps as in the shipped gateway.yaml (shared-prefix detection
# and the cap check run on every request), engine vllm (health /health; its /metrics scrape gets 404).
GATEWAY_CONF = """\
server: {{host: 127.0.0.1, port: {port}}}
health: {{interval_s: 3600, timeout_s: 2}}
pools:
  json:  {{engine: vllm, balancer: least_load, backends: [{{url: "http://127.0.0.1:{nginx}"}}]}}
  sse:   {{engine: vllm, balancer: least_load, backends: [{{url: "{sse}"}}]}}
  paced: {{engine: vllm, balancer: least_load, backends: [{{url: "http://127.0.0.1:{paced}"}}]}}
routes:
{routes}
"""

ROUTE = """\
  - model: {model}
    pools: [{pool}]
    rules:
      - {{name: shared-prefix, when: {{shared_prefix: true}}, pool: {pool}}}
      - {{name: default, pool: {pool}}}
    caps: {{max_context_tokens: 65536, on_exceed: reject, default_max_tokens: 4096}}
"""


def request_body(model: str, stream: bool, max_tokens: int = 128) -> bytes:
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Write one sentence about the sea."},
        ],
        "max_tokens": max_tokens,
        "temperature": 0.7,
    }
    if stream:
        body["stream"] = True  # no stream_options: the gateway adds include_usage and strips the chunk
    return json.dumps(body).encode()
