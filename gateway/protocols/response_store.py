"""Which backend holds which stored response: a bounded map from a Responses id to a backend name,
so that ``previous_response_id``, ``GET /v1/responses/{id}`` and ``/cancel`` reach the backend that
stored it. Pure (no I/O, no clock); the least recently used id is forgotten past the bound."""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

DEFAULT_MAX_IDS = 100_000
# A Responses object's own id: the first "id":"resp_..." of a body or of a stream's response.created
# (the object's id precedes its output items' ids in vLLM's, SGLang's and llama.cpp's answers).
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,200})"')


def find_response_id(data: bytes) -> str | None:
    """The response id in a native /v1/responses answer (a body, or a stream's first bytes), so that
    the pipeline can ``put`` it with the backend that answered; None when absent."""
    match = _RESPONSE_ID.search(data)
    return match.group(1).decode() if match else None


class ResponseStore:
    """An LRU map, id -> backend name. Past ``max_ids`` the least recently used id (put or looked
    up) is forgotten; a later request naming it gets ``not_found_body`` (OpenAI's 404
    ``response_not_found``), the same answer as for an id the gateway never saw. The default bound
    holds ~17 MB (measured: 9 MB of map and 8 MB of 29-character ids)."""

    __slots__ = ("_ids", "evicted", "max_ids")

    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_ids < 1:
            raise ValueError("max_ids must be at least 1")
        self.max_ids = max_ids
        self._ids: OrderedDict[str, str] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._ids)

    def put(self, response_id: str, backend: str) -> None:
        self._ids[response_id] = backend
        self._ids.move_to_end(response_id)
        while len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)
            self.evicted += 1

    def get(self, response_id: str) -> str | None:
        backend = self._ids.get(response_id)
        if backend is not None:
            self._ids.move_to_end(response_id)
        return backend

    def resized(self, max_ids: int) -> ResponseStore:
        """A store with a new bound holding the most recently used ids of this one."""
        out = ResponseStore(max_ids)
        for response_id, backend in self._ids.items():
            out.put(response_id, backend)
        out.evicted = self.evicted + max(0, len(self._ids) - max_ids)
        return out

    def forget(self, response_id: str) -> None:
        """Drop one id (its backend said it no longer has it)."""
        self._ids.pop(response_id, None)

    def forget_backend(self, backend: str) -> int:
        """Drop every id held by a backend that left the fleet (its store went with it); returns how
        many. O(n), for membership changes only."""
        gone = [rid for rid, name in self._ids.items() if name == backend]
        for rid in gone:
            del self._ids[rid]
        return len(gone)


def not_found_body(response_id: str, param: str = "previous_response_id") -> dict[str, Any]:
    """OpenAI's 404 body for an unknown, forgotten or gone response id (send with status 404)."""
    return {
        "error": {
            "message": f"Response with id '{response_id}' not found.",
            "type": "invalid_request_error",
            "param": param,
            "code": "response_not_found",
        }
    }
