"""promtool (from Debian's `prometheus` package) checks the Prometheus config and rules, and runs
the rules' unit tests. Skipped without promtool, unless GATEWAY_REQUIRE_PROMETHEUS=1."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.promql_sources import DEPLOY, require_binary, rule_files

pytestmark = pytest.mark.unit

RULE_TESTS = sorted((Path(__file__).parent / "promtool").glob("*_test.yml"))


def _promtool(*args: str | Path) -> str:
    promtool = require_binary("promtool")
    out = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{out.stdout}{out.stderr}"
    return out.stdout + out.stderr


def test_promtool_check_config() -> None:
    out = _promtool("check", "config", DEPLOY / "prometheus" / "prometheus.yml")
    assert f"{len(rule_files())} rule files found" in out


def test_promtool_check_rules() -> None:
    _promtool("check", "rules", *rule_files())


@pytest.mark.parametrize("path", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_promtool_rule_unit_tests(path: Path) -> None:
    _promtool("test", "rules", path)


def test_there_are_rule_unit_tests() -> None:
    assert RULE_TESTS
