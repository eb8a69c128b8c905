"""An `inference_pool` backend entry's members: the endpoints (pod IP x each targetPort) of the ready
pods an InferencePool (inference.networking.k8s.io/v1) selects, kept current by a list and then a
watch of those pods. A pod counts as the reference EPP counts it: Running, its Ready condition True,
not being deleted, with an IP. The API out of reach keeps the members the entry had."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import httpx

from gateway.fleet.discovery import apply_discovery
from gateway.fleet.health import HealthChecker
from gateway.fleet.kubeapi import KubeApi, KubeApiError, namespace_of
from gateway.fleet.registry import Discovered, Registry
from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

GROUP_VERSION = "inference.networking.k8s.io/v1"
WATCH_S = 60
"""The watch's timeoutSeconds: the pool itself is read again each time it ends (a changed selector
or port list is seen within this long)."""
BACKOFF_S = (0.5, 30.0)


class PoolShapeError(Exception):
    """The InferencePool lacks spec.selector.matchLabels or spec.targetPorts."""


def pool_spec(pool: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
    """(labelSelector, target ports) of an InferencePool object."""
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports = tuple(int(p["number"]) for p in spec.get("targetPorts") or () if isinstance(p, dict) and "number" in p)
    if not labels or not ports or not isinstance(labels, dict):
        raise PoolShapeError("the InferencePool needs spec.selector.matchLabels and spec.targetPorts")
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())), ports


def pod_endpoints(pod: Mapping[str, Any], ports: tuple[int, ...]) -> tuple[str, ...]:
    """The pod's `ip:port` endpoints, or none when it cannot take traffic."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return ()
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    ip = status.get("podIP")
    if not ready or not ip:
        return ()
    host = f"[{ip}]" if ":" in ip else ip
    return tuple(f"{host}:{port}" for port in ports)


class PoolFollower:
    """Lists, then watches, one entry's pods; `entry.synced` once the first list is applied."""

    def __init__(
        self,
        registry: Registry,
        entry: Discovered,
        health: HealthChecker,
        metrics: GatewayMetrics,
        env: Mapping[str, str],
    ) -> None:
        ref = entry.config.inference_pool
        assert ref is not None
        self._registry = registry
        self._entry = entry
        self._health = health
        self._metrics = metrics
        self._name = ref.name
        self._namespace = namespace_of(ref, env)
        self._ref, self._env = ref, env
        self._api: KubeApi | None = None
        self._pods: dict[str, tuple[str, ...]] = {}
        self.watch_s = WATCH_S
        self.backoff_s = BACKOFF_S

    @property
    def label(self) -> str:
        return f"{self._namespace}/{self._name}"

    async def run(self) -> None:
        delay = self.backoff_s[0]
        try:
            while True:
                try:
                    # Made here, not at build: outside a pod with no api_server this is an error to
                    # log and retry (readiness stays false), not a crash at start-up.
                    self._api = self._api or KubeApi(self._ref, self._env)
                    await self._follow(self._api)
                    delay = self.backoff_s[0]
                except (KubeApiError, PoolShapeError, httpx.HTTPError, OSError, ValueError, KeyError) as exc:
                    self._restarted("error")
                    log.warning(
                        "InferencePool %s (pool %s): %s; the members stay as they were, retrying in %.1f s",
                        self.label,
                        self._entry.pool,
                        exc or type(exc).__name__,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.backoff_s[1])
        finally:
            if self._api is not None:
                await self._api.close()

    def _restarted(self, reason: str) -> None:
        self._metrics.pool_watch_restarts.labels(self._entry.pool, self._name, reason).inc()

    async def _follow(self, api: KubeApi) -> None:
        """One list, then watches from its resourceVersion until the pool changes or a 410."""
        pool_path = f"/apis/{GROUP_VERSION}/namespaces/{self._namespace}/inferencepools/{self._name}"
        selector, ports = pool_spec(await api.get(pool_path))
        pods_path = f"/api/v1/namespaces/{self._namespace}/pods"
        listing = await api.get(pods_path, {"labelSelector": selector})
        self._pods = {
            str(pod["metadata"]["name"]): pod_endpoints(pod, ports) for pod in listing.get("items") or () if pod
        }
        await self._apply()
        if not self._entry.synced:
            log.info("InferencePool %s (pool %s): first list applied", self.label, self._entry.pool)
        self._entry.synced = True
        version = str(listing["metadata"]["resourceVersion"])
        while True:
            params = {
                "watch": "1",
                "labelSelector": selector,
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(self.watch_s),
            }
            try:
                async for event in api.watch(pods_path, params, self.watch_s + 30):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            raise KubeApiError(410, str(obj.get("message", "Gone")))
                        raise KubeApiError(int(obj.get("code") or 0), str(obj.get("message", "watch error")))
                    version = str(obj["metadata"]["resourceVersion"])
                    if kind == "BOOKMARK":
                        continue
                    name = str(obj["metadata"]["name"])
                    if kind == "DELETED":
                        self._pods.pop(name, None)
                    else:
                        self._pods[name] = pod_endpoints(obj, ports)
                    await self._apply()
            except KubeApiError as exc:
                if exc.status != 410:
                    raise
                self._restarted("expired")
                log.info("InferencePool %s: the watch's version expired (410); listing again", self.label)
                return
            self._restarted("ended")
            if pool_spec(await api.get(pool_path)) != (selector, ports):
                log.info("InferencePool %s changed its selector or ports; listing again", self.label)
                return

    async def _apply(self) -> None:
        addresses = sorted({a for endpoints in self._pods.values() for a in endpoints})
        added, removed = apply_discovery(self._registry, self._entry, addresses)
        self._metrics.pool_endpoints.labels(self._entry.pool, self._name).set(len(addresses))
        for backend in removed:
            log.info("backend %s (pool %s) left InferencePool %s", backend.name, backend.pool, self.label)
            self._health.forget(backend)
        for backend in added:
            log.info("backend %s (pool %s) joined from InferencePool %s", backend.name, backend.pool, self.label)
        if added:
            await self._health.check_some(added)
