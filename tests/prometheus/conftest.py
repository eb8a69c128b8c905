"""Fixtures for tests against a real Prometheus server; see prometheus_server.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.prometheus.prometheus_server import PrometheusServer, start_prometheus


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Call with (target="host:port", job="gateway") to start a server; all stop at teardown."""
    started: list[PrometheusServer] = []

    def start(target: str | None = None, job: str = "gateway") -> PrometheusServer:
        server = start_prometheus(tmp_path / f"prometheus-{len(started)}", target, job)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def prometheus_self(prometheus_factory: Callable[..., PrometheusServer]) -> PrometheusServer:
    """A Prometheus that scrapes its own /metrics, as job "prometheus"."""
    return prometheus_factory(None, "prometheus")
