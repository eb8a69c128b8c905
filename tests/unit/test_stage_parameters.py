"""The pipeline's stages hand each other two values (pipeline/context.py's Request or Dispatch, and
the Exchange), not long parameter lists: no method of a stage takes more than five parameters
besides `self`. Constructors are the composition root's business and are left out."""

from __future__ import annotations

import inspect

import pytest

from gateway.pipeline.admission import Admission
from gateway.pipeline.attempts import Attempts
from gateway.pipeline.endpoint import CompletionEndpoint
from gateway.pipeline.enforcer import CapEnforcer
from gateway.pipeline.relay import Relay
from gateway.pipeline.router import Router

STAGES = (CompletionEndpoint, Router, CapEnforcer, Admission, Attempts, Relay)
MOST = 5


def _too_long(cls: type) -> list[str]:
    out = []
    for name, member in vars(cls).items():
        func = member.__func__ if isinstance(member, staticmethod | classmethod) else member
        if name == "__init__" or not inspect.isfunction(func):
            continue
        params = [p for p in inspect.signature(func).parameters.values() if p.name not in ("self", "cls")]
        if len(params) > MOST:
            out.append(f"{cls.__name__}.{name} takes {len(params)}: {[p.name for p in params]}")
    return out


def test_no_stage_method_takes_more_than_five_parameters() -> None:
    if not inspect.isfunction(Router.plan):
        pytest.skip("the compiled build's methods are native: the pure-Python run checks this")
    found = [line for cls in STAGES for line in _too_long(cls)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_long_signature() -> None:
    class Wide:
        def step(self, a: int, b: int, c: int, d: int, e: int, f: int) -> None: ...

        def narrow(self, a: int) -> None: ...

    assert _too_long(Wide) == ["Wide.step takes 6: ['a', 'b', 'c', 'd', 'e', 'f']"]
