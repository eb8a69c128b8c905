"""Client keys: which configured key a request's `Authorization: Bearer` names, and which models
it may use. Keys are held only as SHA-256 digests (a `sha256:` entry is one already) and a
presented key is compared, in constant time, against every one. Pure: no I/O."""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from dataclasses import dataclass

from gateway.config import BudgetConfig, GatewayConfig, Priority
from gateway.errors import Unauthorized


@dataclass(frozen=True, slots=True)
class ClientKey:
    name: str
    models: tuple[str, ...] = ()
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    priority: Priority | None = None
    max_priority: Priority | None = None
    weight: float = 1.0
    budgets: tuple[BudgetConfig, ...] = ()

    def allows(self, model: str) -> bool:
        return not self.models or any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    @property
    def limited(self) -> bool:
        return self.requests_per_minute is not None or self.tokens_per_minute is not None


def digest(stored: str) -> bytes:
    """The SHA-256 digest a stored key stands for: `sha256:<hex>` as given, anything else hashed."""
    if stored.startswith("sha256:"):
        return bytes.fromhex(stored.removeprefix("sha256:"))
    return hashlib.sha256(stored.encode()).digest()


class KeyRing:
    """Every client key of one config. Empty means no client auth: identify() returns None."""

    def __init__(self, entries: list[tuple[bytes, ClientKey]]) -> None:
        self._entries = entries

    @classmethod
    def from_config(cls, config: GatewayConfig) -> KeyRing:
        entries = [
            (digest(k.get_secret_value()), ClientKey(f"api_keys-{i}")) for i, k in enumerate(config.server.api_keys)
        ]
        for k in config.keys:
            client = ClientKey(
                k.name,
                k.models,
                k.requests_per_minute,
                k.tokens_per_minute,
                k.priority,
                k.max_priority,
                k.weight,
                k.budgets,
            )
            entries.append((digest(k.key.get_secret_value()), client))
        return cls(entries)

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    def identify(self, authorization: str | None, api_key: str | None = None) -> ClientKey | None:
        """The key named by an `Authorization: Bearer` header, else by `x-api-key` (Anthropic's
        clients); None when client auth is off; Unauthorized when neither names a key. Every key is
        compared, so timing tells nothing."""
        if not self._entries:
            return None
        supplied = authorization or ""
        token = supplied[7:].strip() if supplied[:7].lower() == "bearer " else ""
        if not token and api_key:
            token = api_key.strip()
        presented = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest() if token else b""
        found: ClientKey | None = None
        for stored, client in self._entries:
            if hmac.compare_digest(presented, stored) and found is None:
                found = client
        if found is None:
            raise Unauthorized("Missing or invalid API key.")
        return found
