"""`@value` classes (gateway/value.py): immutable to the type checker, equal and hashable by value."""

from __future__ import annotations

import pytest

from gateway.policy.balancer import BalanceKey

pytestmark = pytest.mark.unit


def test_equal_values_are_equal_and_hash_alike() -> None:
    a = BalanceKey(fingerprint=(1, 2), session="s", anchor=None, anchor_block=0)
    b = BalanceKey(fingerprint=(1, 2), session="s", anchor=None, anchor_block=0)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != BalanceKey(fingerprint=(1, 3), session="s", anchor=None, anchor_block=0)


def test_a_value_has_slots_and_no_instance_dict() -> None:
    """No __dict__: a typo'd attribute is an error, and the instance is small."""
    key = BalanceKey(fingerprint=(), session=None, anchor=None, anchor_block=0)
    assert not hasattr(key, "__dict__")
    with pytest.raises(AttributeError):
        key.sesion = "x"  # type: ignore[attr-defined]
