"""The access log's batching sink: the same line format as the rest of the log, written in batches,
through plain logging when someone else configured it, and nothing at all below INFO."""

from __future__ import annotations

import asyncio
import io
import logging
import re
from collections.abc import Iterator

import pytest

from gateway import accesslog
from gateway.metrics import GatewayMetrics
from gateway.pipeline.accounting import Accounting
from gateway.pipeline.exchange import Exchange

pytestmark = pytest.mark.unit

FMT = "%(asctime)s %(levelname)s %(name)s %(message)s"
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gateway\.access (.*)$")


class CountingStream(io.StringIO):
    writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


@pytest.fixture
def access() -> Iterator[logging.Logger]:
    logger = logging.getLogger("gateway.access")
    saved = (list(logger.handlers), logger.propagate, logger.level)
    logger.handlers.clear()
    yield logger
    logger.handlers[:] = saved[0]
    logger.propagate, logger.level = saved[1], saved[2]


def test_lines_are_batched_in_the_log_format(access: logging.Logger) -> None:
    stream = CountingStream()
    accesslog.install(stream, FMT)
    accesslog.install(stream, FMT)  # idempotent
    assert len(access.handlers) == 1

    async def two_lines() -> None:
        accesslog.write(access, "one")
        accesslog.write(access, "two")
        assert stream.getvalue() == ""  # waiting for the batch

    asyncio.run(two_lines())
    access.handlers[0].flush()
    lines = stream.getvalue().splitlines()
    assert [LINE.match(x).group(1) for x in lines] == ["one", "two"]  # type: ignore[union-attr]
    assert stream.writes == 1


def test_without_an_event_loop_each_line_is_written_at_once(access: logging.Logger) -> None:
    stream = io.StringIO()
    accesslog.install(stream, FMT)
    accesslog.write(access, "now")
    assert stream.getvalue().endswith(" INFO gateway.access now\n")


def test_other_logging_setups_get_ordinary_records(access: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        accesslog.write(access, "via logging")
    assert [r.getMessage() for r in caplog.records] == ["via logging"]


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])
def test_finish_writes_one_line_at_info_and_none_above(access: logging.Logger, level: int) -> None:
    stream = io.StringIO()
    accesslog.install(stream, FMT)
    access.setLevel(level)
    ex = Exchange(request_id="rid", api="chat", path="/v1/chat/completions", route="r1", pool="p", backend_name="b")
    ex.outcome, ex.status = "success", 200
    Accounting(GatewayMetrics()).finish(ex)
    out = stream.getvalue()
    if level == logging.INFO:
        assert LINE.match(out.strip()) and "rid /v1/chat/completions model=" in out and "status=200" in out
    else:
        assert out == ""
