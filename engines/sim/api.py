"""The simulator's endpoints (all but the completions themselves) and the one way every response is sent,
so that the status/body/die/stall/split fault knobs apply to all of them alike."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from engines.sim.engine import SimEngine
from engines.sim.faults import Fault
from engines.sim.flavour_llamacpp import LlamacppFlavour
from engines.sim.flavour_vllm import VllmFlavour
from engines.sim.flavours import JsonObj, Reply, SglangFlavour
from engines.sim.http import ClientGone, HttpConn, HttpRequest, reason_phrase
from engines.sim.metrics import exposition
from engines.sim.text import count_tokens, embedding, embedding_base64, render_chat, token_pieces

Handler = Callable[[HttpConn, HttpRequest, Fault], Awaitable[None]]
# Paths a gateway polls on its own (health checks, scrapes, discovery): not counted, not recorded, and the
# server-wide fault does not apply to them (see SimServer.set_fault's probe_fault).
PROBE_PATHS = frozenset({"/health", "/metrics", "/v1/models", "/slots", "/props"})


class Killed(Exception):
    """The simulator closed the connection on purpose (the die fault)."""


def dumps(obj: Any) -> bytes:
    # Compact, and raw UTF-8 rather than \u escapes, as pydantic and nlohmann::json write it; this is what
    # puts multi-byte characters on the wire for the split fault to cut through.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class SimApi:
    """Routing and endpoint logic for one server; owns nothing but references."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.params = engine.core.params
        flavours = {"vllm": VllmFlavour, "sglang": SglangFlavour, "llamacpp": LlamacppFlavour}
        self.flavour = flavours[self.params.flavour](self.params)
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.models,
            ("GET", "/metrics"): self.metrics,
            ("POST", "/tokenize"): self.tokenize,
            ("POST", "/detokenize"): self.detokenize,
            ("POST", "/v1/embeddings"): self.embeddings,
        }
        if isinstance(self.flavour, SglangFlavour):
            self.routes[("POST", "/v1/tokenize")] = self.tokenize
            self.routes[("POST", "/v1/detokenize")] = self.detokenize
        self.vocab: dict[int, bytes] = {}
        """Token id -> its bytes, learned from what this server tokenized (its ids are hashes)."""
        if isinstance(self.flavour, LlamacppFlavour):
            self.routes[("POST", "/apply-template")] = self.apply_template
            self.routes[("GET", "/slots")] = self.slots
            self.routes[("GET", "/props")] = self.props
        if self.flavour.version() is not None:
            self.routes[("GET", "/version")] = self.version

    # -- sending --------------------------------------------------------------------------------------
    async def send(
        self,
        conn: HttpConn,
        fault: Fault,
        status: int,
        body: bytes,
        content_type: str | None,
    ) -> None:
        """Send a whole (non-streamed) response, unless the die or stall fault says otherwise."""
        if fault.die_after is not None:
            await conn.kill(fault.die == "rst")
            raise Killed
        headers = [("content-length", str(len(body)))]
        if content_type:
            headers.insert(0, ("content-type", content_type))
        await conn.send_head(status, self.common_headers(conn, fault) + headers)
        if fault.stall_after is not None:
            await conn.gone.wait()
            raise ClientGone
        if fault.short_body and status == 200:
            await conn.send(body[: len(body) // 2])
            await conn.kill(False)
            raise Killed
        await conn.send(body)

    async def send_json(self, conn: HttpConn, fault: Fault, status: int, obj: Any) -> None:
        await self.send(conn, fault, status, dumps(obj), self.flavour.json_type)

    async def send_error(self, conn: HttpConn, fault: Fault, status: int, message: str) -> None:
        await self.send_json(conn, fault, status, self.flavour.error(status, message))

    def common_headers(self, conn: HttpConn, fault: Fault) -> list[tuple[str, str]]:
        headers = [("server", f"sim-{self.params.flavour}")]
        if (retry := fault.retry_after_header) is not None:
            headers.append(("retry-after", retry))
        if conn.close_after:
            headers.append(("connection", "close"))
        return headers

    async def send_status_fault(self, conn: HttpConn, fault: Fault) -> None:
        status = fault.status or 500
        if fault.body == "html":
            phrase = reason_phrase(status)
            page = f"<html><head><title>{status}</title></head><body><h1>{status} {phrase}</h1></body></html>"
            await self.send(conn, fault, status, page.encode(), "text/html")
            return
        message = f"simulated error {status}"
        if fault.client_error:
            message = "[json.exception.out_of_range.406] number overflow parsing '1e400'"
        body = dumps(self.flavour.error(status, message))
        if fault.body == "truncated":
            body = body[: len(body) // 2]
        elif fault.body == "empty":
            body = b""
        await self.send(conn, fault, status, body, self.flavour.json_type if body else None)

    async def route(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        handler = self.routes.get((req.method, req.path))
        if handler is None and req.path.startswith("/v1/responses/") and "/" not in req.path[14:].rstrip("/"):
            handler = self.routes.get((req.method, "/v1/responses/{id}"))
        elif handler is None and req.path.startswith("/v1/responses/") and req.path.endswith("/cancel"):
            handler = self.routes.get((req.method, "/v1/responses/{id}/cancel"))
        if handler is not None:
            await handler(conn, req, fault)
        elif any(path == req.path for _, path in self.routes):
            await self.send_json(conn, fault, *self.flavour.method_not_allowed())
        else:
            await self.send_json(conn, fault, *self.flavour.not_found())

    def parse_body(self, req: HttpRequest) -> JsonObj | Reply:
        """The JSON object in the body, or the flavour's error reply."""
        try:
            body = json.loads(req.body)
        except json.JSONDecodeError as exc:
            return self.flavour.malformed_json(exc)
        except ValueError as exc:  # not UTF-8
            return 400, self.flavour.error(400, f"the request body is not UTF-8 JSON: {exc}")
        return body if isinstance(body, dict) else (400, self.flavour.error(400, "the body must be a JSON object"))

    # -- endpoints ------------------------------------------------------------------------------------
    async def health(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        content_type, body = self.flavour.health()
        await self.send(conn, fault, 200, body, content_type)

    async def models(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        await self.send_json(conn, fault, 200, self.flavour.models())

    async def metrics(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        text = exposition(self.engine.core).encode()
        await self.send(conn, fault, 200, text, "text/plain; version=0.0.4; charset=utf-8")

    async def version(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        await self.send_json(conn, fault, 200, self.flavour.version())

    async def tokenize(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        body = self.parse_body(req)
        if isinstance(body, tuple):
            await self.send_json(conn, fault, *body)
            return
        status, reply = self.flavour.tokenize(body)
        text = body.get("content", body.get("prompt"))
        if status == 200 and isinstance(text, str) and len(self.vocab) < 100_000:
            self.vocab.update(token_pieces(text))
        await self.send_json(conn, fault, status, reply)

    async def detokenize(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        body = self.parse_body(req)
        if isinstance(body, tuple):
            await self.send_json(conn, fault, *body)
            return
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            await self.send_error(conn, fault, 400, '"tokens" must be a list of token ids')
            return
        text = b"".join(self.vocab.get(t, b"<unk>") for t in tokens).decode("utf-8", "replace")
        await self.send_json(conn, fault, 200, self.flavour.detokenized(text))

    async def apply_template(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        body = self.parse_body(req)
        if isinstance(body, tuple):
            await self.send_json(conn, fault, *body)
            return
        try:
            if not isinstance(body.get("messages"), list):
                raise ValueError('"messages" must be a list')
            prompt = render_chat(body["messages"], True, body.get("tools"))
        except ValueError as exc:
            await self.send_error(conn, fault, 400, str(exc))
            return
        await self.send_json(conn, fault, 200, {"prompt": prompt})

    async def slots(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        assert isinstance(self.flavour, LlamacppFlavour)
        await self.send_json(conn, fault, 200, self.flavour.slots(self.engine.core.running))

    async def props(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        assert isinstance(self.flavour, LlamacppFlavour)
        await self.send_json(conn, fault, 200, self.flavour.props())

    async def embeddings(self, conn: HttpConn, req: HttpRequest, fault: Fault) -> None:
        body = self.parse_body(req)
        if isinstance(body, tuple):
            await self.send_json(conn, fault, *body)
            return
        # A string, a list of strings, or token ids (one list or a list of lists).
        raw = body.get("input")
        items = [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw and type(raw[0]) is int) else raw
        if not isinstance(items, list) or not items or not all(_embeddable(x) for x in items):
            await self.send_error(conn, fault, 400, '"input" must be a string, strings, or token ids')
            return
        # As vLLM: "float" (the default) or "base64", float32 bytes in base64 (vLLM's default dtype; it
        # writes the host's byte order, little-endian on every machine it runs on, as OpenAI does).
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            await self.send_error(conn, fault, 400, '"encoding_format" must be "float" or "base64" (simulator)')
            return
        texts = [x if isinstance(x, str) else json.dumps(x) for x in items]
        tokens = sum(len(x) if isinstance(x, list) else count_tokens(str(x)) for x in items)
        encode = embedding_base64 if encoding == "base64" else embedding
        data = [{"object": "embedding", "embedding": encode(t), "index": i} for i, t in enumerate(texts)]
        await self.send_json(
            conn,
            fault,
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model") or self.params.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )


def _embeddable(item: Any) -> bool:
    return isinstance(item, str) or (isinstance(item, list) and all(type(t) is int for t in item))
