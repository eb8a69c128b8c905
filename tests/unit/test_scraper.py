"""The load scraper: an engine that will not export its metrics (llama-server without --metrics
answers 501) is said once in the log, naming the flag, and again only after it worked in between."""

from __future__ import annotations

import logging

import pytest
from aiohttp import web

from gateway.config_loader import parse_config
from gateway.fleet.registry import Registry
from gateway.fleet.scraper import LoadScraper
from gateway.metrics import GatewayMetrics
from gateway.upstream.client import UpstreamClient

pytestmark = pytest.mark.unit

LLAMACPP_METRICS = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n"


async def test_a_refused_scrape_is_logged_once_until_it_works(caplog: pytest.LogCaptureFixture) -> None:
    answer = {"status": 501}

    async def metrics(_: web.Request) -> web.Response:
        if answer["status"] == 200:
            return web.Response(text=LLAMACPP_METRICS)
        body = {"error": {"code": 501, "message": "This server does not support metrics."}}
        return web.json_response(body, status=501)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = parse_config(
        {
            "pools": {"local": {"engine": "llamacpp", "backends": [{"url": f"http://127.0.0.1:{port}"}]}},
            "routes": [{"model": "m", "pools": ["local"]}],
        },
        env={},
    )
    registry = Registry(config)
    upstream = UpstreamClient(config.timeouts)
    await upstream.start()
    scraper = LoadScraper(registry, upstream, GatewayMetrics(), config.health)
    backend = registry.by_name["local-0"]
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.fleet.scraper"):
            for _ in range(3):
                await scraper.scrape(backend)
            refused = [r.getMessage() for r in caplog.records]
            assert len(refused) == 1
            assert "local-0 (llamacpp): GET /metrics answered 501" in refused[0] and "--metrics" in refused[0]
            assert backend.load is None
            answer["status"] = 200
            await scraper.scrape(backend)
            assert backend.load is not None
            answer["status"] = 501
            await scraper.scrape(backend)
            assert len(caplog.records) == 2  # it stopped working again: said again
    finally:
        await upstream.close()
        await runner.cleanup()
