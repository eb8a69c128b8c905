"""The docs agree with the code: every config key in docs/configuration.md's tables is a field of
the config models and every field is documented, with the code's default; the complete config
examples validate; every `gateway <subcommand>` the README and these docs mention exists; and no
development-diary phrase is left in them or in the code (tests/lint_docs.py)."""

from __future__ import annotations

import argparse
import re
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gateway.cli import parser
from gateway.config import GatewayConfig
from gateway.config_loader import parse_config
from tests import lint_docs

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CONFIG_DOC = REPO / "docs" / "configuration.md"
README = REPO / "README.md"
# The docs whose `gateway <subcommand>` mentions are checked, besides the README.
COMMAND_DOCS = [
    README,
    *(REPO / "docs" / f"{name}.md" for name in ("configuration", "routing", "simulator", "testing", "bench")),
]
# Environment for the doc's complete examples, which may use ${NAME} without a default.
EXAMPLE_ENV = {"GATEWAY_API_KEY": "sk-example"}

REQUIRED = "required"
UNSET = "unset"

# ---------------------------------------------------------------------------------------------------
# The config models: every field as a dotted path, `<name>` for a mapping's key, `[]` for a list item.


def _models_in(annotation: Any) -> list[tuple[str, type[BaseModel]]]:
    """(suffix, model) for each pydantic model a field's type holds: "" for the model itself,
    "[]" for the items of a sequence, ".<name>" for the values of a mapping."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _models_in(args[0])
    if origin is Union or origin is types.UnionType:
        return [found for arg in args for found in _models_in(arg)]
    if origin in (tuple, list, Sequence):
        return [("[]" + suffix, model) for arg in args if arg is not Ellipsis for suffix, model in _models_in(arg)]
    if origin in (dict, Mapping):
        return [(".<name>" + suffix, model) for suffix, model in _models_in(args[1])]
    return []


def _walk(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo | None]]:
    """(path, field) for every key of the config. A field that is just a nested section (its type
    is one model, such as `server` or `routes[].caps`) yields (path, None): it is documented by its
    own table rather than a row, and may have a row but need not."""
    for name, field in model.model_fields.items():
        path = prefix + name
        nested = _models_in(field.annotation)
        section = len(nested) == 1 and nested[0][0] == ""
        yield path, None if section else field
        for suffix, sub in nested:
            yield from _walk(sub, f"{path}{suffix}.")


def config_fields() -> dict[str, FieldInfo | None]:
    return dict(_walk(GatewayConfig))


def expected_default(field: FieldInfo) -> Any:
    if field.is_required():
        return REQUIRED
    value = field.get_default(call_default_factory=True)
    if value is None:
        return UNSET
    if isinstance(value, tuple):
        return list(value)
    return value


# ---------------------------------------------------------------------------------------------------
# The doc: tables whose header's first cell is "key"; each row's first cell is one `dotted.key`.

_CELL_SPLIT = re.compile(r"(?<!\\)\|")
_KEY_CELL = re.compile(r"^`([^`\s]+)`$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _CELL_SPLIT.split(line.strip().strip("|"))]


def doc_rows(text: str) -> list[tuple[str, dict[str, str]]]:
    """(key, {column: cell}) for every row of every key table, in document order."""
    rows: list[tuple[str, dict[str, str]]] = []
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells if cells[0] == "key" else []
            continue
        if not header or set(cells[0]) <= set("-: "):
            continue
        match = _KEY_CELL.match(cells[0])
        assert match, f"a key table row whose first cell is not one `key`: {line!r}"
        rows.append((match.group(1), dict(zip(header, cells, strict=False))))
    return rows


def documented_default(cell: str) -> Any:
    """`literal` (parsed as YAML), `required` or `unset`."""
    if cell in (REQUIRED, UNSET):
        return cell
    match = re.fullmatch(r"`([^`]*)`", cell)
    assert match, f"a default must be `literal`, required or unset, got {cell!r}"
    return yaml.safe_load(match.group(1))


@pytest.fixture(scope="module")
def rows() -> list[tuple[str, dict[str, str]]]:
    found = doc_rows(CONFIG_DOC.read_text(encoding="utf-8"))
    assert len(found) > 20, "docs/configuration.md has no key tables (a header row starting with `key`)"
    return found


def test_every_documented_key_exists(rows: list[tuple[str, dict[str, str]]]) -> None:
    fields = config_fields()
    unknown = [key for key, _ in rows if key not in fields]
    assert not unknown, f"docs/configuration.md documents keys the config models do not have: {unknown}"


def test_every_config_key_is_documented(rows: list[tuple[str, dict[str, str]]]) -> None:
    documented = {key for key, _ in rows}
    missing = [path for path, field in config_fields().items() if field is not None and path not in documented]
    assert not missing, f"config keys missing from docs/configuration.md's tables: {missing}"


def test_each_key_is_documented_once(rows: list[tuple[str, dict[str, str]]]) -> None:
    keys = [key for key, _ in rows]
    assert sorted({k for k in keys if keys.count(k) > 1}) == []


def test_documented_defaults_are_the_code_defaults(rows: list[tuple[str, dict[str, str]]]) -> None:
    fields = config_fields()
    wrong = []
    for key, row in rows:
        field = fields.get(key)
        if field is None:
            continue
        assert "default" in row, f"the table documenting {key} has no default column"
        want, got = expected_default(field), documented_default(row["default"])
        if got != want or isinstance(got, bool) != isinstance(want, bool):
            wrong.append(f"{key}: documented {row['default']}, code has {want!r}")
    assert not wrong, "docs/configuration.md defaults differ from gateway/config/:\n" + "\n".join(wrong)


def test_walker_sees_the_nested_keys() -> None:
    fields = config_fields()
    for path in (
        "server.port",
        "routing.shared_prefix.min_seen",
        "pools",
        "pools.<name>.backends",
        "pools.<name>.backends[].url",
        "routes[].rules[].when.header",
        "routes[].caps.on_exceed",
    ):
        assert fields.get(path) is not None, path
    for section in ("server", "routing.shared_prefix", "routes[].caps", "routes[].rules[].when"):
        assert section in fields and fields[section] is None, section


def _yaml_blocks(path: Path) -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.M | re.S)


@pytest.mark.parametrize("doc", ["configuration.md", "routing.md"])
def test_complete_config_examples_validate(doc: str) -> None:
    path = REPO / "docs" / doc
    checked = 0
    for block in _yaml_blocks(path):
        data = yaml.safe_load(block)
        if isinstance(data, dict) and "pools" in data and "routes" in data:
            parse_config(data, env=EXAMPLE_ENV)
            checked += 1
    if doc == "configuration.md":
        assert checked >= 1, "docs/configuration.md lost its complete example"


def test_shipped_config_is_what_the_doc_describes() -> None:
    config = parse_config(yaml.safe_load((REPO / "gateway.yaml").read_text(encoding="utf-8")), env={})
    assert list(config.pools) == ["vllm", "sglang", "llamacpp"]
    (route,) = config.routes
    assert (route.model, route.label, route.pools) == ("*", "default", ("vllm", "sglang", "llamacpp"))
    assert [(r.name, r.pool) for r in route.rules] == [
        ("mac", "llamacpp"),
        ("no-gpu", "llamacpp"),
        ("shared-prefix", "sglang"),
        ("default", "vllm"),
    ]
    assert (route.caps.max_context_tokens, route.caps.on_exceed, route.caps.default_max_tokens) == (
        65536,
        "reject",
        4096,
    )


# ---------------------------------------------------------------------------------------------------
# `gateway <subcommand>` in the README and these docs.


def subcommands() -> set[str]:
    (action,) = (a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def mentioned_subcommands(text: str) -> set[str]:
    """Words after `gateway ` inside code: fenced blocks and `inline spans` (prose is not code)."""
    fences = re.findall(r"^```.*?^```", text, flags=re.M | re.S)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    code = fences + re.findall(r"`([^`\n]+)`", prose)
    return {m for chunk in code for m in re.findall(r"(?<![\w./-])gateway ([a-z][a-z_-]*)", chunk)}


@pytest.mark.parametrize("path", COMMAND_DOCS, ids=lambda p: p.name)
def test_mentioned_subcommands_exist(path: Path) -> None:
    mentioned = mentioned_subcommands(path.read_text(encoding="utf-8"))
    unknown = sorted(mentioned - subcommands())
    assert not unknown, f"{path.name} mentions gateway subcommands the CLI does not have: {unknown}"


def test_readme_lists_every_subcommand() -> None:
    mentioned = mentioned_subcommands(README.read_text(encoding="utf-8"))
    assert mentioned, "found no `gateway <subcommand>` in README.md"
    missing = sorted(subcommands() - mentioned)
    assert not missing, f"README.md does not mention these gateway subcommands: {missing}"


def test_subcommand_scan_reads_code_not_prose() -> None:
    text = "The gateway sends it.\n`gateway serve --port 1` and `gateway.yaml`\n```bash\nx && gateway demo\n```\n"
    assert mentioned_subcommands(text) == {"serve", "demo"}


def python_snippets(text: str) -> list[str]:
    """The README's Python snippets: the demo's, then "Use it with your engines"'s."""
    snippets: list[str] = re.findall(r"^```python\n(.*?)^```", text, flags=re.M | re.S)
    return snippets


def test_readme_engine_snippet_names_a_model_the_gateway_lists() -> None:
    """The engines' snippet names no model of its own: it takes one that the gateway's /v1/models
    lists (tests/integration/test_real_model_routing.py runs it against real vLLM and llama.cpp)."""
    _demo, engines = python_snippets(README.read_text(encoding="utf-8"))
    assert "client.models.list()" in engines and 'model="' not in engines
    assert 'base_url="http://127.0.0.1:4000/v1"' in engines  # the shipped gateway.yaml's port


def test_readme_snippet_names_a_model_the_demo_lists() -> None:
    """The README's Python snippet runs against `gateway demo` as it stands: its model is one of the
    demo's exact route names, which are what /v1/models lists (tests/live/test_demo.py checks that)."""
    from gateway.tools.demo import demo_config

    text = README.read_text(encoding="utf-8")
    demo, _engines = python_snippets(text)
    snippet = demo
    models = set(re.findall(r'model="([^"]+)"', snippet))
    listed = {r.model for r in demo_config({"vllm": 1, "sglang": 2, "llamacpp": 3}).routes if not r.is_glob}
    assert models and models <= listed, (models, listed)
    assert 'base_url="http://127.0.0.1:4000/v1"' in snippet  # the demo's default port
    assert "python3 -m venv .venv" in text and "pip install -e '.[test]'" in text and "git clone" in text


# ---------------------------------------------------------------------------------------------------
# No development diary in the README, docs, code, tests or benchmarks (tests/lint_docs.py).

# Each phrase class, assembled here so that this file does not trip the check it tests.
DIARY = [
    "measured in this st" + "op's runs",
    "the previous st" + "op's figures",
    "two stops" + " ago it was slower",
    "0.6x in the oth" + "er runs",
    "the second " + "run gave 0.7x",
    "see issue" + " 13 for the targets",
    "Issue" + " 12 defect 4: a 10 MiB body",
    "at commit" + " 5dc39b3, noise 2 %",
    "a fresh clone of main (88" + "2e709), warm",
    "508 s at b2" + "b7a9a",
]
PROSE = [
    "The gateway stops accepting connections on SIGTERM.",
    "A client that stops reading is cut.",
    "the bus st" + "op's shelter",  # a possessive that is not about work stops
    "The first run downloads the engines; later runs reuse the cache.",
    "finish_reason: stop",
    "Each run writes a record; compare two runs with compare.py.",
    "vllm-project/vllm#1234 tracks the upstream bug.",
    "Commit your changes, then run the tests.",
    "the colour (deadbeef) and the count (1234567) are not hashes",
    "benchmarks/results/2026-12-02-overhead-5dc39" + "b3.json holds the run",
]


@pytest.mark.parametrize("text", DIARY)
def test_a_diary_phrase_fails_the_docs_lint(text: str) -> None:
    assert list(lint_docs.hits(text)), text


@pytest.mark.parametrize("text", PROSE)
def test_ordinary_prose_passes_the_docs_lint(text: str) -> None:
    assert not list(lint_docs.hits(text)), text


def test_the_docs_lint_reports_a_planted_phrase_with_its_place(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\nFine prose.\nFigures of this st" + "op.\n", encoding="utf-8")
    found = lint_docs.check([doc], root=tmp_path)
    assert found == ["doc.md:4: work-stop: 'this st" + "op'"]


def test_the_repository_has_no_diary_phrases() -> None:
    found = lint_docs.check(lint_docs.files())
    assert not found, "\n".join(found)
