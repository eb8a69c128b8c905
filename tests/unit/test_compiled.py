"""The compiled build's module list (setup.py's COMPILED): every entry is a module of the package;
and under the compiled build (GATEWAY_EXPECT_COMPILED=1, which tests/run.sh sets for its compiled
run) every one of them is loaded from its C extension, so that run tests what the image runs."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def compiled_modules() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "COMPILED":
            paths = ast.literal_eval(node.value)
            assert isinstance(paths, list)
            return [str(p) for p in paths]
    raise AssertionError("setup.py has no COMPILED list")


def test_every_listed_module_is_a_module_of_the_package() -> None:
    paths = compiled_modules()
    assert len(paths) == len(set(paths)) and paths == sorted(paths, key=lambda p: (p.count("/"), p))
    for path in paths:
        assert (ROOT / path).is_file() and path.startswith("gateway/") and path.endswith(".py"), path


def test_under_the_compiled_build_every_listed_module_is_native() -> None:
    if os.environ.get("GATEWAY_EXPECT_COMPILED") != "1":
        pytest.skip("the pure-Python run: tests/run.sh's compiled run checks this")
    for path in compiled_modules():
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__
    # And in a child process from the checkout, as the CLI tests start `python -m gateway.cli`.
    child = subprocess.run(
        [sys.executable, "-c", "import gateway.pipeline.endpoint as m; print(m.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip().endswith(".so"), child.stdout
