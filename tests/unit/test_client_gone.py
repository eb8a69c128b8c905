"""The disconnect hook the gateway's server hands each request (gateway.asgi.ClientGone)."""

from __future__ import annotations

import pytest

from gateway.asgi import ClientGone

pytestmark = pytest.mark.unit


def test_a_watched_request_is_told_once_when_its_connection_is_lost_mid_request() -> None:
    calls: list[str] = []
    gone = ClientGone()
    gone.watch(lambda: calls.append("left"))
    gone.lost(mid_request=True)
    gone.lost(mid_request=True)
    assert calls == ["left"]


def test_a_request_that_starts_watching_after_the_loss_is_told_at_once() -> None:
    """The client left while the request awaited something before it started watching."""
    calls: list[str] = []
    gone = ClientGone()
    gone.lost(mid_request=False)
    gone.watch(lambda: calls.append("left"))
    assert calls == ["left"]


def test_a_finished_request_is_not_told_and_unwatch_keeps_the_next_ones_callback() -> None:
    calls: list[str] = []
    gone = ClientGone()

    def first() -> None:
        calls.append("first")

    def second() -> None:
        calls.append("second")

    gone.watch(first)
    gone.unwatch(first)
    gone.watch(second)
    gone.unwatch(first)  # a late unwatch from the earlier request leaves the next one's alone
    gone.lost(mid_request=True)
    assert calls == ["second"]

    done = ClientGone()
    done.watch(first)
    done.lost(mid_request=False)  # the response was complete: nobody is left to tell
    assert calls == ["second"]
