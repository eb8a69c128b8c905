"""The OpenAPI description (gateway/app/openapi.py): a valid OpenAPI 3.1 document that names
every route the app serves, with each endpoint's errors in its protocol's shape."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from gateway.app.build import create_app
from gateway.app.openapi import openapi_bytes, openapi_document
from gateway.config import LimitsConfig
from gateway.config_loader import parse_config

pytestmark = pytest.mark.unit

CONFIG = {
    "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://127.0.0.1:9"}]}},
    "routes": [{"model": "tiny", "pools": ["p"]}],
}


def _shape(path: str) -> str:
    return "AnthropicError" if path.startswith("/v1/messages") else "OpenAIError"


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document()
    assert doc["openapi"].startswith("3.1")
    validate(doc)


def test_every_route_the_app_serves_is_described() -> None:
    app = create_app(parse_config(CONFIG, env={}))
    doc = openapi_document()

    def norm(path: str) -> str:
        return re.sub(r"\{[^}]+\}", "{}", path)

    described = {(norm(p), m.upper()) for p, item in doc["paths"].items() for m in item}
    served = set()
    for route in app.app.routes:
        assert isinstance(route, Route)
        for method in route.methods or ():
            if method != "HEAD" and route.path != "/openapi.json":
                served.add((norm(route.path), method))
    assert served, "the app has routes"
    assert served <= described, served - described


def test_errors_are_in_each_protocols_shape() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            errors = {code: r for code, r in op["responses"].items() if code[0] in "45"}
            if path in ("/healthz", "/health", "/readyz", "/metrics"):
                continue
            assert {"502", "503", "504"} <= set(errors), (method, path)
            for code, response in errors.items():
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref == f"#/components/schemas/{_shape(path)}", (method, path, code)
    schemas: dict[str, Any] = doc["components"]["schemas"]
    assert schemas["OpenAIError"]["properties"]["error"]["required"] == ["message", "type"]
    assert schemas["AnthropicError"]["properties"]["type"] == {"const": "error"}


def test_limits_set_the_documented_maxima() -> None:
    doc = openapi_document(LimitsConfig(max_n=3, max_messages=20))
    chat = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert chat["properties"]["n"]["maximum"] == 3
    assert chat["properties"]["messages"]["maxItems"] == 20
    assert chat["required"] == ["model", "messages"]


def test_the_served_bytes_are_the_document() -> None:
    assert json.loads(openapi_bytes()) == openapi_document()
