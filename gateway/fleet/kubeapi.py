"""The few calls the gateway makes to the Kubernetes API server: a GET of one object or a list, and a
watch (newline-delimited JSON events), with in-cluster credentials (KUBERNETES_SERVICE_HOST/PORT, the
service account's token, read again for every call because bound tokens rotate, and its CA). httpx,
imported only by a gateway with an `inference_pool` entry (the `epp` and `kubernetes` extras)."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from gateway.config import InferencePoolRef

CONNECT_S = 5.0
READ_S = 30.0


class KubeApiError(Exception):
    """The API server answered with an error status (410 Gone: the resourceVersion is too old)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def api_base(ref: InferencePoolRef, env: Mapping[str, str]) -> str:
    if ref.api_server:
        return ref.api_server.rstrip("/")
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeApiError(0, "KUBERNETES_SERVICE_HOST is not set (not in a pod?): set inference_pool.api_server")
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def namespace_of(ref: InferencePoolRef, env: Mapping[str, str]) -> str:
    """The pool's namespace: the config's, else NAMESPACE (the reference EPP's order), else the
    service account's own namespace, else `default`."""
    if ref.namespace:
        return ref.namespace
    if env.get("NAMESPACE"):
        return env["NAMESPACE"]
    try:
        return (Path(ref.token_file).parent / "namespace").read_text(encoding="utf-8").strip() or "default"
    except OSError:
        return "default"


def _message(body: bytes) -> str:
    try:
        status = json.loads(body)
        return str(status.get("message", ""))[:300] if isinstance(status, dict) else ""
    except ValueError:
        return body[:300].decode("utf-8", "replace")


class KubeApi:
    def __init__(self, ref: InferencePoolRef, env: Mapping[str, str]) -> None:
        base = api_base(ref, env)
        self._token_file = Path(ref.token_file)
        verify: ssl.SSLContext | bool = True
        if base.startswith("https://") and Path(ref.ca_file).is_file():
            verify = ssl.create_default_context(cafile=ref.ca_file)
        self._client = httpx.AsyncClient(
            base_url=base, verify=verify, trust_env=False, timeout=httpx.Timeout(READ_S, connect=CONNECT_S)
        )

    def _headers(self) -> dict[str, str]:
        """The token as the kubelet has it now (a missing file: none, as for `kubectl proxy`)."""
        try:
            token = self._token_file.read_text(encoding="utf-8").strip()
        except OSError:
            token = ""
        headers = {"accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        return headers

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        r = await self._client.get(path, params=params, headers=self._headers())
        if r.status_code != 200:
            raise KubeApiError(r.status_code, _message(r.content))
        data = r.json()
        if not isinstance(data, dict):
            raise KubeApiError(r.status_code, "the answer is not a JSON object")
        return data

    async def watch(self, path: str, params: Mapping[str, str], idle_s: float) -> AsyncIterator[dict[str, Any]]:
        """The watch's events as they come, until the server ends it; `idle_s` without a byte is an
        error (the server's bookmarks and its own timeoutSeconds keep a live watch talking)."""
        timeout = httpx.Timeout(idle_s, connect=CONNECT_S)
        async with self._client.stream("GET", path, params=params, headers=self._headers(), timeout=timeout) as r:
            if r.status_code != 200:
                raise KubeApiError(r.status_code, _message(await r.aread()))
            async for line in r.aiter_lines():
                if line.strip():
                    event = json.loads(line)
                    if isinstance(event, dict):
                        yield event

    async def close(self) -> None:
        await self._client.aclose()
