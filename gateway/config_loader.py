"""Reading gateway.yaml into a GatewayConfig: `${ENV}` substitution, validation, and errors that name
the YAML path of each mistake (with a "did you mean" for a mistyped key)."""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from gateway.config import GatewayConfig

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A config that cannot be used; `problems` lists each error with its YAML path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def substitute_env(value: Any, env: Mapping[str, str], path: str = "") -> Any:
    """Replace `${NAME}` and `${NAME:-default}` in every string; a missing variable is an error."""
    if isinstance(value, str):

        def repl(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError([f"{path or '<root>'}: environment variable {name} is not set"])

        return _ENV_PATTERN.sub(repl, value)
    if isinstance(value, dict):
        return {k: substitute_env(v, env, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_env(v, env, f"{path}.{i}") for i, v in enumerate(value)]
    return value


def parse_config(data: Any, env: Mapping[str, str] | None = None) -> GatewayConfig:
    if not isinstance(data, dict):
        raise ConfigError(["<root>: the config must be a mapping"])
    data = substitute_env(data, os.environ if env is None else env)
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_problems(exc)) from None


def _problems(exc: ValidationError) -> list[str]:
    """One line per mistake the user made, with its YAML path and, where a name was mistyped, a
    suggestion. Pydantic also reports a list as too short when its only items were invalid; that
    error follows from the others, so it is dropped."""
    errors = exc.errors()
    locs = [tuple(err["loc"]) for err in errors]
    # A misspelt required key is one mistake, not two: "unknown key 'backend'; did you mean
    # 'backends'?" says it all, so the "backends: Field required" it causes is dropped.
    meant = {
        (*loc[:-1], _suggest(str(loc[-1]), _model_at(loc[:-1])))
        for err, loc in zip(errors, locs, strict=True)
        if err["type"] == "extra_forbidden" and loc
    }
    problems = []
    for err, loc in zip(errors, locs, strict=True):
        if err["type"] == "too_short" and any(len(o) > len(loc) and o[: len(loc)] == loc for o in locs):
            continue
        if err["type"] == "missing" and loc in meant:
            continue
        path = ".".join(str(p) for p in loc) or "<root>"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden" and loc:
            msg = _unknown_key(str(loc[-1]), _model_at(loc[:-1]))
        elif err["type"] == "literal_error" and isinstance(err.get("input"), str):
            allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
            msg += _did_you_mean(err["input"], allowed)
        problems.append(f"{path}: {msg}")
    return problems


def _unknown_key(key: str, model: type[BaseModel] | None) -> str:
    if model is None:
        return f"unknown key {key!r}"
    known = list(model.model_fields)
    return f"unknown key {key!r}" + (_did_you_mean(key, known) or f" (known keys: {', '.join(known)})")


def _suggest(key: str, model: type[BaseModel] | None) -> str:
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6) if model else []
    return close[0] if close else ""


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config model found at a YAML path (list indices and mapping keys step into items)."""
    tp: Any = GatewayConfig
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) in (tuple, Mapping, dict, list):
            args = get_args(tp)
            tp = args[-1] if get_origin(tp) in (Mapping, dict) else args[0]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Annotated[X, ...] -> X; X | None -> X."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(str(path), exc)]) from None
    return parse_config(data, env)


def _yaml_problem(path: str, exc: yaml.YAMLError) -> str:
    """`FILE, line L, column C: invalid YAML: what`, not PyYAML's "<unicode string>" text."""
    mark = getattr(exc, "problem_mark", None)
    if not isinstance(exc, yaml.MarkedYAMLError) or mark is None:
        return f"{path}: invalid YAML: {exc}"
    what = ", ".join(x for x in (exc.context, exc.problem) if x)
    return f"{path}, line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {what}"
