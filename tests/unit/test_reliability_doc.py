"""docs/reliability.md names real tests: every `path::name` (and `::name` after it, meaning the
same file) is a test function or fixture helper in that file, and every path exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"
_REF = re.compile(r"`((?:tests/[\w/.]+\.py)?)(?:::(\w+)(?:\[[^\]]*\])?)?`")


def references() -> list[tuple[str, str | None]]:
    refs: list[tuple[str, str | None]] = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        path = ""
        for match in _REF.finditer(line):
            file, name = match.group(1), match.group(2)
            if not file and not name:
                continue
            path = file or path
            if path:
                refs.append((path, name))
    return refs


def test_the_doc_names_tests() -> None:
    assert len(references()) > 80


@pytest.mark.parametrize(("path", "name"), references(), ids=lambda v: str(v))
def test_each_named_test_exists(path: str, name: str | None) -> None:
    file = REPO / path
    assert file.is_file(), f"docs/reliability.md names {path}, which does not exist"
    if name is not None:
        assert re.search(rf"^(async )?def {name}\(", file.read_text(encoding="utf-8"), re.M), f"no {name} in {path}"
