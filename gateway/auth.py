"""Client authentication: `Authorization: Bearer <key>` against server.api_keys, compared in
constant time against every key. An empty key list means no client auth."""

from __future__ import annotations

import hmac

from gateway.errors import Unauthorized


class ClientAuth:
    def __init__(self, keys: list[str]) -> None:
        self._keys = [k.encode() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: str | None) -> None:
        if not self._keys:
            return
        supplied = authorization or ""
        token = supplied[7:].strip().encode() if supplied[:7].lower() == "bearer " else b""
        ok = False
        for key in self._keys:  # every key, so the time taken does not say which one nearly matched
            ok |= hmac.compare_digest(token, key)
        if not ok:
            raise Unauthorized("Missing or invalid API key.")
