"""The client's model name in a native answer: where the gateway sent the engine another name (an
alias, a wildcard route's rewrite), the engine answers with that one, and a client that checks the
name it asked for (or keys its cost and context tables on it) must get its own back. The served name
stays in the x-gateway-model header. Pure: bytes in, bytes out."""

from __future__ import annotations

import json


class ModelRename:
    """Rewrites `"model": "<served>"` to the client's name in a body or a stream's reads. A stream
    transform: a read that ends in what may be the start of the field holds those few bytes back
    until the next read (an event never ends inside it, so nothing waits past the stream's end)."""

    __slots__ = ("_held", "_pairs", "_prefixes")

    def __init__(self, served: str, client: str) -> None:
        old = json.dumps(served, ensure_ascii=False).encode()
        new = json.dumps(client, ensure_ascii=False).encode()
        self._pairs = ((b'"model":' + old, b'"model":' + new), (b'"model": ' + old, b'"model": ' + new))
        longest = max(len(p[0]) for p in self._pairs)
        self._prefixes = tuple(p[0][:n] for p in self._pairs for n in range(longest - 1, 0, -1) if n < len(p[0]))
        self._held = b""

    def whole(self, body: bytes) -> bytes:
        for old, new in self._pairs:
            if old in body:
                body = body.replace(old, new)
        return body

    def feed(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        if b'"model"' in data or self._held:
            data = self.whole(data)
        self._held = b""
        if data.endswith(self._prefixes):  # (cheap: a read usually ends in "\n\n")
            cut = max(len(p) for p in self._prefixes if data.endswith(p))
            data, self._held = data[:-cut], data[-cut:]
        return data

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held
