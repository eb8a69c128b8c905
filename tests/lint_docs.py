"""Fails on development-diary phrases in the README, the docs, the code, the tests, the benchmarks and
the deploy files: a reader needs what the product does and how to reproduce a figure, not which work
item, stop or run produced it (history goes to CHANGELOG.md and git log).

    python3 tests/lint_docs.py          # exit 1 and one line per hit; tests/run.sh runs it in its lint step

The patterns are built with \\s+ and character classes so that this file does not match its own
phrases; tests/unit/test_docs.py checks that each phrase class fails and that ordinary prose passes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("README.md", "CHANGELOG.md", "docs", "gateway", "engines", "benchmarks", "tests", "deploy")
SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml", ".json", ".txt", ".cfg", ".lua", ".conf", ""}

ORDINALS = r"(?:second|third|fourth|fifth|other|previous)"
# (what the phrase says of itself, its pattern)
PHRASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("work-stop", re.compile(r"\b(?:this|that|previous|next|last|each|every)\s+stop\b(?![-_])", re.I)),
    ("stops-ago", re.compile(r"\b(?:a|one|two|three|four)\s+stops?\s+ago\b", re.I)),
    (
        "stop-possessive",
        re.compile(
            r"\bstop['\u2019]s\s+(?:runs?|figures?|commits?|final|last|first|changes|cuts|targets?|measurements?|work)\b",
            re.I,
        ),
    ),
    ("numbered-run", re.compile(rf"\bthe\s+{ORDINALS}\s+runs?\b", re.I)),
    ("first-run-at", re.compile(r"\bthe\s+first\s+runs?\s+(?:at|of\s+this|of\s+the\s+stop)\b", re.I)),
    ("issue-number", re.compile(r"\bissues?\s+#?\d+", re.I)),
    ("commit-provenance", re.compile(r"\bcommit\s+[0-9a-f]{7,40}\b", re.I)),
    # A bare short hash used as a date, in parentheses or after "at"; it needs a digit and a letter, so that
    # words and numbers in parentheses pass.
    (
        "hash-as-date",
        re.compile(r"(?:\(|\bat\s+|\bof\s+main\s+)(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b(?!-)"),
    ),
)


def files(root: Path = REPO) -> Iterator[Path]:
    """The tracked and untracked-but-not-ignored text files under SCANNED (git's view; a plain walk
    when git is not there)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "--", *SCANNED],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
        paths: Iterable[Path] = (root / name for name in listed)
    except (OSError, subprocess.CalledProcessError):
        paths = (p for top in SCANNED for p in ([root / top] if (root / top).is_file() else (root / top).rglob("*")))
    for path in paths:
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
            yield path


def hits(text: str) -> Iterator[tuple[int, str, str]]:
    """(line number, phrase class, the matched words) for each diary phrase in `text`."""
    for number, line in enumerate(text.splitlines(), 1):
        for name, pattern in PHRASES:
            for match in pattern.finditer(line):
                yield number, name, match.group(0)


def check(paths: Iterable[Path], root: Path = REPO) -> list[str]:
    """One "path:line: class: words" line per hit."""
    out = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        rel = path.relative_to(root) if path.is_relative_to(root) else path
        out += [f"{rel}:{n}: {name}: {words!r}" for n, name, words in hits(text)]
    return out


def main() -> int:
    found = check(files())
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} diary phrase(s): say what the product does, and put history in CHANGELOG.md")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
