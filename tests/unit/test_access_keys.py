"""Client keys and their limits, the pure parts: who a key is (hashed or plain), what it may use,
and the per-minute decisions (docs/configuration.md `keys`)."""

from __future__ import annotations

import hashlib

import pytest

from gateway.access.keys import ClientKey, KeyRing
from gateway.access.limiter import WINDOW_S, counter_names, decide, tokens_of, window
from gateway.access.memory_store import MemoryStore
from gateway.config_loader import ConfigError, parse_config
from gateway.errors import Unauthorized

pytestmark = pytest.mark.unit

BASE = {
    "pools": {"p": {"engine": "vllm", "backends": [{"url": "http://x"}]}},
    "routes": [{"model": "m", "pools": ["p"]}],
}


def ring(**sections: object) -> KeyRing:
    return KeyRing.from_config(parse_config({**BASE, **sections}, env={"TEAM_KEY": "sk-env"}))


def test_plain_hashed_and_environment_keys() -> None:
    hashed = "sha256:" + hashlib.sha256(b"sk-hashed").hexdigest()
    keys = ring(
        server={"api_keys": ["sk-plain", hashed]},
        keys=[{"name": "team", "key": "${TEAM_KEY}", "models": ["llama-*"], "requests_per_minute": 5}],
    )
    assert keys.identify("Bearer sk-plain") == ClientKey("api_keys-0")
    assert keys.identify("bearer  sk-hashed ") == ClientKey("api_keys-1")
    team = keys.identify("Bearer sk-env")
    assert team is not None and team.name == "team" and team.requests_per_minute == 5
    for bad in (None, "", "Bearer", "Bearer sk-wrong", "sk-plain", "Basic sk-plain", "Bearer " + hashed):
        with pytest.raises(Unauthorized):
            keys.identify(bad)


def test_no_keys_means_no_auth() -> None:
    assert ring().identify(None) is None and not ring().enabled


def test_model_allowlist_globs() -> None:
    key = ClientKey("k", models=("llama-*", "tiny"))
    assert key.allows("llama-3") and key.allows("tiny") and not key.allows("gpt-4") and not key.allows("tiny2")
    assert ClientKey("open").allows("anything")


@pytest.mark.parametrize(
    "keys",
    [
        [{"name": "a", "key": "sha256:abc"}],
        [{"name": "a", "key": ""}],
        [{"name": "a", "key": "x"}, {"name": "a", "key": "y"}],
        [{"name": "bad name", "key": "x"}],
        [{"name": "a", "key": "x", "requests_per_minute": 0}],
    ],
)
def test_bad_key_configs_are_refused(keys: list[dict[str, object]]) -> None:
    with pytest.raises(ConfigError):
        parse_config({**BASE, "keys": keys}, env={})


def test_requests_per_minute_decision_and_retry_after() -> None:
    key = ClientKey("k", requests_per_minute=3)
    now = 100 * WINDOW_S + 15.0
    assert decide(key, 3, 0, now).allowed
    refused = decide(key, 4, 0, now)
    assert not refused.allowed and refused.limit == "requests" and refused.cap == 3
    assert refused.retry_after_s == pytest.approx(45.0)  # to the end of this minute
    index, left = window(now)
    assert index == 100 and left == pytest.approx(45.0)


def test_tokens_per_minute_decision() -> None:
    key = ClientKey("k", tokens_per_minute=1000)
    assert decide(key, 1, 999, 0.0).allowed
    refused = decide(key, 1, 1000, 0.0)
    assert not refused.allowed and refused.limit == "tokens" and refused.used == 1000


def test_counter_names_change_with_the_window_and_share_a_hash_tag() -> None:
    key = ClientKey("team")
    a, b = counter_names("p:", key, 59.0), counter_names("p:", key, 60.0)
    assert a != b and a[0].startswith("p:{team}:requests:") and a[1].startswith("p:{team}:tokens:")


def test_tokens_of_prefers_the_engines_usage() -> None:
    assert tokens_of({"total_tokens": 42, "prompt_tokens": 1}, 7) == 42
    assert tokens_of({"prompt_tokens": 10, "completion_tokens": 5}, 7) == 15
    assert tokens_of({"prompt_tokens": 10}, 7) == 7
    assert tokens_of(None, 7) == 7 and tokens_of(None, -1) == 0


async def test_memory_store_counts_expires_and_stays_bounded() -> None:
    store = MemoryStore()
    assert await store.hit("r", "t", True, 60) == (1, 0)
    await store.add("t", 30, 60)
    assert await store.hit("r", "t", True, 60) == (2, 30)
    assert await store.hit("r", "t", False, 60) == (0, 30)
    assert await store.hit("gone", "t2", True, 0) == (1, 0)
    assert await store.hit("gone", "t2", True, 0) == (1, 0)  # ttl 0: already expired
    for i in range(1000):
        await store.hit(f"old{i}", "t", True, 0)
    assert len(store._counts) < 300
