"""An emulator of the Kubernetes API server (a real uvicorn/starlette app on loopback): the few calls
an `inference_pool` entry makes, in the API's own shapes. No cluster runs here, so this stands in.

Shapes, from the Kubernetes reference:
- an InferencePool GET: `GET /apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{name}`,
  the object of kubernetes-sigs/gateway-api-inference-extension's api/v1/inferencepool_types.go
  (spec.selector.matchLabels, spec.targetPorts[].number);
- a list: `GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v`, a PodList whose metadata holds the
  resourceVersion to watch from (kubernetes.io/docs/reference/using-api/api-concepts/, "Efficient
  detection of changes");
- a watch: the same path with `watch=1&resourceVersion=N`, one JSON object a line,
  `{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": ...}`; a BOOKMARK's object is
  the kind with only metadata.resourceVersion ("Watch bookmarks"); a version too old ends the watch
  with an ERROR event whose object is a Status with code 410, reason Expired ("410 Gone responses");
- errors: a Status object (`{"kind": "Status", "status": "Failure", "code": 503, ...}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def pod(
    name: str, ip: str | None, labels: dict[str, str], ready: bool = True, phase: str = "Running"
) -> dict[str, Any]:
    """A Pod as the API lists it (the fields the gateway reads, and a few beside them)."""
    conditions = [
        {"type": "Initialized", "status": "True"},
        {"type": "Ready", "status": "True" if ready else "False"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
        {"type": "PodScheduled", "status": "True"},
    ]
    out: dict[str, Any] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": "llm", "labels": labels, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
        "status": {"phase": phase, "conditions": conditions, "hostIP": "10.0.0.1"},
    }
    if ip is not None:
        out["status"]["podIP"] = ip
        out["status"]["podIPs"] = [{"ip": ip}]
    return out


@dataclass
class KubeEmulator:
    namespace: str = "llm"
    pool_name: str = "vllm"
    labels: dict[str, str] = field(default_factory=lambda: {"app.kubernetes.io/name": "vllm"})
    ports: list[int] = field(default_factory=lambda: [8000])
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 100
    oldest: int = 0
    """A watch from a resourceVersion below this gets 410 (compacted away)."""
    down: bool = False
    """Every call answers 503."""
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    """The Authorization header of every call, in order."""
    calls: list[str] = field(default_factory=list)
    """`get-pool`, `list`, `watch` for every call."""
    port: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _end: int = 0
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- what the tests do to the cluster ----
    def put(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        kind = "MODIFIED" if name in self.pods else "ADDED"
        self._record(kind, obj)
        self.pods[name] = obj

    def delete(self, name: str) -> None:
        self._record("DELETED", self.pods.pop(name))

    def bookmark(self) -> None:
        self.version += 1
        self.events.append((self.version, "BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {}}))
        self._wake()

    def expire(self) -> None:
        """Compact history: every open watch and any watch from an older version gets 410."""
        self.version += 1
        self.oldest = self.version
        self._wake()

    def end_watches(self) -> None:
        """Close every open watch as the API server does at its timeout."""
        self._end += 1
        self._wake()

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.events.append((self.version, kind, copy.deepcopy(obj)))
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- the API ----
    def _selected(self, selector: str) -> list[dict[str, Any]]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        return [p for p in self.pods.values() if wanted.items() <= p["metadata"]["labels"].items()]

    async def _pool(self, request: Request) -> Response:
        self.tokens.append(request.headers.get("authorization", ""))
        self.calls.append("get-pool")
        if self.down:
            return JSONResponse(status(503, "ServiceUnavailable", "etcd is down"), 503)
        ns, name = request.path_params["ns"], request.path_params["name"]
        if (ns, name) != (self.namespace, self.pool_name):
            return JSONResponse(status(404, "NotFound", f'inferencepools "{name}" not found'), 404)
        return JSONResponse(
            {
                "apiVersion": "inference.networking.k8s.io/v1",
                "kind": "InferencePool",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": "7"},
                "spec": {
                    "selector": {"matchLabels": self.labels},
                    "targetPorts": [{"number": p} for p in self.ports],
                    "endpointPickerRef": {"name": "gateway-epp", "port": {"number": 9002}, "failureMode": "FailClose"},
                },
            }
        )

    async def _pods(self, request: Request) -> Response:
        self.tokens.append(request.headers.get("authorization", ""))
        if self.down:
            return JSONResponse(status(503, "ServiceUnavailable", "etcd is down"), 503)
        selector = request.query_params.get("labelSelector", "")
        if request.query_params.get("watch") in ("1", "true"):
            self.calls.append("watch")
            since = int(request.query_params.get("resourceVersion") or self.version)
            return StreamingResponse(self._watch(selector, since), media_type="application/json")
        self.calls.append("list")
        items = [copy.deepcopy(p) for p in self._selected(selector)]
        return JSONResponse(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.version)}, "items": items}
        )

    async def _watch(self, selector: str, since: int) -> AsyncIterator[bytes]:
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        end = self._end
        sent = since
        while True:
            if sent < self.oldest:
                too_old = f"too old resource version: {sent} ({self.oldest})"
                yield json.dumps({"type": "ERROR", "object": status(410, "Expired", too_old)}).encode() + b"\n"
                return
            for version, kind, obj in self.events:
                if version <= sent:
                    continue
                sent = version
                labels = obj["metadata"].get("labels")
                if labels is not None and not wanted.items() <= labels.items():
                    continue
                if kind == "BOOKMARK":
                    obj = {**obj, "metadata": {"resourceVersion": str(version)}}
                yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"
            if self._end != end:
                return
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 5)

    async def start(self) -> None:
        app = Starlette(
            routes=[
                Route("/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{name}", self._pool),
                Route("/api/v1/namespaces/{ns}/pods", self._pods),
            ]
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        async with asyncio.timeout(10):
            while not self._server.started:
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.end_watches()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
