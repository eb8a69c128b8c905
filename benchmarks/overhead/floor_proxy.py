"""The floor: a 35-line Starlette + aiohttp reverse proxy (one upstream; no routing, metrics or checks).

python floor_proxy.py UPSTREAM_BASE_URL PORT
"""

import contextlib
import sys

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

UPSTREAM, PORT = sys.argv[1], int(sys.argv[2])
HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}
state: dict[str, aiohttp.ClientSession] = {}


@contextlib.asynccontextmanager
async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
    state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    yield


async def proxy(request: Request) -> Response:
    body = await request.body()
    up = await state["s"].post(UPSTREAM + request.url.path, data=body, headers={"content-type": "application/json"})
    headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP}
    if up.headers.get("content-type", "").startswith("text/event-stream"):

        async def relay():
            async for chunk in up.content.iter_any():
                yield chunk
            up.release()

        return StreamingResponse(relay(), status_code=up.status, headers=headers)
    data = await up.read()
    up.release()
    return Response(data, status_code=up.status, headers=headers)


app = Starlette(routes=[Route("/{path:path}", proxy, methods=["GET", "POST"])], lifespan=lifespan)
uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", access_log=False)
