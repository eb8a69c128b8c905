"""A real Prometheus server (Debian's `prometheus` binary) for tests: started on a free loopback
port with a generated config that scrapes one target every second and loads the deploy rules;
plus every PromQL expression of the deploy files, ready to evaluate.

Without the binary the tests skip, unless GATEWAY_REQUIRE_PROMETHEUS=1, when they fail."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import yaml


def _load_sources() -> ModuleType:
    """tests/deploy/promql_sources.py, which also lists the deploy files' expressions."""
    name = "promql_sources"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parents[1] / "deploy" / "promql_sources.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


sources = _load_sources()
Expr = sources.Expr
RULES: Path = sources.RULES


def substitute(expr: str, rate_interval: str = "1m") -> str:
    """A Grafana panel query as Prometheus sees it with every `$route`/`$pool` selected."""
    result: str = sources.substitute_grafana(expr, rate_interval)
    return result


def deploy_expressions(rate_interval: str = "1m") -> list[Any]:
    """Every PromQL expression in the Grafana dashboards and the recording/alert rules, with
    `$route`/`$pool` as `.*` and `$__rate_interval` as `rate_interval`, ready to evaluate."""
    exprs: list[Any] = sources.deploy_expressions(substitute=True, rate_interval=rate_interval)
    return exprs


class PrometheusError(AssertionError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@dataclass
class PrometheusServer:
    url: str
    job: str
    target: str
    process: subprocess.Popen[bytes]
    log_path: Path
    client: httpx.Client = field(repr=False)

    def api(self, path: str, **params: str) -> Any:
        response = self.client.get(f"{self.url}/api/v1/{path}", params=params)
        body = response.json()
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the vector's samples as {"metric": {...}, "value": [ts, "v"]}."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float:
        """The single sample an expression returns, as a float."""
        result = self.query(expr)
        assert len(result) == 1, f"{expr}: expected one sample, got {result}"
        return float(result[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return targets

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        def all_up() -> bool:
            targets = self.targets()
            return bool(targets) and all(t["health"] == "up" for t in targets)

        try:
            wait_until(all_up, timeout, "every scrape target to be up")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {self.targets()}") from None

    def wait_for_rule_evaluations(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Wait until every loaded rule has been evaluated at least once; returns the rules."""

        def rules() -> list[dict[str, Any]]:
            return [r for g in self.api("rules")["groups"] for r in g["rules"]]

        wait_until(
            lambda: all(r.get("lastEvaluation", "").startswith("2") for r in rules()),
            timeout,
            "every rule to be evaluated",
        )
        return rules()

    def reload(self) -> None:
        self.client.post(f"{self.url}/-/reload").raise_for_status()

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def prometheus_config(job: str, target: str, scrape_interval: str = "1s") -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "evaluation_interval": scrape_interval,
        },
        "rule_files": [str(p) for p in sorted(RULES.glob("*.yml"))],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}],
    }


def start_prometheus(
    workdir: Path, target: str | None = None, job: str = "gateway", startup_timeout: float = 30.0
) -> PrometheusServer:
    """Start Prometheus scraping `target` (host:port; None = Prometheus itself) as `job`."""
    binary = sources.require_binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    target = target or f"127.0.0.1:{port}"
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(job, target)), encoding="utf-8")
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    server = PrometheusServer(url, job, target, process, log_path, httpx.Client(timeout=5.0))

    def ready() -> bool:
        if process.poll() is not None:
            raise PrometheusError(f"prometheus exited with {process.returncode}:\n{server.log()}")
        try:
            return server.client.get(f"{url}/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, startup_timeout, "prometheus /-/ready")
    except BaseException:
        server.stop()
        raise
    return server
