"""`--part`: tests/run.sh runs the suite in two parts. `parallel` holds the tests that share a machine
with others well (unit, deploy, live, sim), run by pytest-xdist's workers side by side; `serial` holds
the rest, one at a time: the real engines (each uses every core), the real Prometheus, and the tests
marked `serial`, which judge latency or lag against a baseline taken in the same test. Without the
option every selected test runs, as in any plain pytest call."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
SERIAL_DIRS = ("integration", "prometheus")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        choices=("parallel", "serial"),
        default=None,
        help="keep only the tests that may run beside others (parallel) or only those that must run alone (serial)",
    )


def serial(item: pytest.Item) -> bool:
    parts = item.path.resolve().relative_to(_HERE).parts
    return (bool(parts) and parts[0] in SERIAL_DIRS) or item.get_closest_marker("serial") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    part = config.getoption("--part")
    if part is None:
        return
    want = part == "serial"
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (keep if serial(item) == want else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep
