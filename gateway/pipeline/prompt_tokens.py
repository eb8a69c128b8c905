"""A prompt's token ids as the engine will see them (chat template included), for matching against
the engines' KV events. The ids come from the model's own tokenizer and chat template when the pool
names them (`tokenizer`, pipeline/chat_tokenizer.py), else from the engine's tokenize call (vLLM's
and SGLang's POST /tokenize answer them), asked of the route's `kv_events` backends in turn, in the
background, and are remembered (TokenMemo) by the chained hash of the messages. A request is
matched from:

- its own ids, remembered (the same conversation state sent again);
- its own ids from the pool's tokenizer, encoded now when what is to be encoded is short
  (INLINE_CHARS). A conversation's next turn is encoded from its earlier turn's ids: the template's
  text up to the earlier prompt's last special token (its cut, token_memo.Cut) is checked to be the
  same, its ids are kept, and only the text after it is encoded (the tokenizer encodes the pieces
  between special tokens apart, so the ids are those of the whole text; VERIFY_FIRST and
  VERIFY_EVERY check that they are). An agent's 100,000-character prompt that grew by one turn is
  then a millisecond's encode on the event loop instead of ~50 ms in a thread;
- else the ids of its longest remembered leading run of messages (a conversation's earlier turn, or
  its system prompt alone), a prefix of its own up to that run's last message: all an engine can
  hold of it from earlier requests;
- else nothing: it is routed as if nothing were cached (the balancer's hash, which every replica
  computes alike, so a conversation's first turns have one home).

A match from a leading run says so (PromptIds.whole false): past that run the prompt's ids are not
known, so "nothing cached" then means "not known", and the balancer treats it as such.

No request waits for a tokenize call: one round trip before routing cost more time to first token
under load than the match saved (docs/routing.md, "kv_events"). Each request not remembered has its
own ids asked (of the engine, or of the tokenizer in a worker thread when the prompt is long), and
a leading run of system messages its own, for the requests after it.

The pool's tokenizer is trusted only while it agrees with the engine: its first CHECK_FIRST prompts
and one in CHECK_EVERY after are also asked of the engine, and one difference turns it off for the
pool and empties the memo (a warning, and the `mismatch` count)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import prometheus_client

from gateway.config import GatewayConfig, RouteConfig
from gateway.fleet.registry import Registry
from gateway.metrics import GatewayMetrics
from gateway.pipeline.chat_tokenizer import ChatTokenizer
from gateway.pipeline.engine_tokens import Asked, EngineTokens
from gateway.pipeline.token_memo import Cut, TokenMemo, message_keys, prompt_key
from gateway.policy.cached_prefix import PromptIds
from gateway.upstream.client import UpstreamClient

log = logging.getLogger(__name__)

Resumable = tuple[Sequence[int], Cut]
"""An earlier prompt's ids and cut (TokenMemo.resumable)."""

BACKGROUND_CALLS: Final = 8
"""Tokenize calls in flight at most; past it a request's ids are not learned (its next turn then
matches from an earlier one, or from nothing)."""
INLINE_CHARS: Final = 8192
"""A prompt with up to this many characters to encode (its whole text, or what follows an earlier
turn's cut) is encoded by the pool's tokenizer before routing, on the event loop: ~0.4 ms for the
1,900 characters of the affinity benchmark's prompts with the test model's tokenizer
(docs/routing.md). More is encoded in a worker thread (with the GIL released) for the
requests after it, so the loop never waits on an agent's 100,000 characters."""
VERIFY_FIRST: Final = 4
VERIFY_EVERY: Final = 64
"""A pool's first VERIFY_FIRST prompts encoded from an earlier prompt's cut or in pieces, and one
in VERIFY_EVERY after, are also encoded whole in the worker thread and compared: one difference and its
prompts are encoded whole from then on (a tokenizer whose normalizer treats a text's start apart)."""
CHECK_FIRST: Final = 4
CHECK_EVERY: Final = 256
"""The pool's tokenizer's first CHECK_FIRST prompts, and one in CHECK_EVERY after, are also asked
of the engine (in the background) and compared."""


class PromptTokens:
    def __init__(
        self,
        config: GatewayConfig,
        registry: Registry,
        upstream: UpstreamClient,
        streaming: set[str],
        metrics: GatewayMetrics,
        local: Mapping[str, ChatTokenizer] | None = None,
    ) -> None:
        self._engines = EngineTokens(config, registry, upstream, streaming)
        self._metrics = metrics
        self.memo = TokenMemo()
        self._counters: dict[str, prometheus_client.Counter] = {}
        """Source -> its child of kv_prompt_ids, found once (every request counts one)."""
        self._asking: set[int] = set()
        """The keys of the prompts being asked: one call a prompt, however many requests send it."""
        self._background: set[asyncio.Task[Any]] = set()
        self._local = dict(local or {})
        """Pool -> its tokenizer, while it agrees with the engine."""
        self._encoded: Counter[str] = Counter()
        """Pool -> prompts its tokenizer encoded (which of them are checked)."""
        self._resuming = set(self._local)
        """The pools whose prompts are encoded from the cut of an earlier prompt (while that gives
        the ids that encoding them whole gives)."""
        self._resumed: Counter[str] = Counter()
        self._thread: ThreadPoolExecutor | None = None
        """The one worker thread for long prompts' encodes and the resumed encodings' checks, started
        with the gateway when a pool has a tokenizer: a thread started on the request path (as the
        loop's default executor does, lazily) blocks the event loop until the OS first runs it,
        which on an engine-loaded host is milliseconds of every request's time. One thread also
        bounds what this background work takes from the engines' cores."""
        if self._local:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="gateway-encode")
            self._thread.submit(int).result()  # started now, not on a request

    def wanted(self, route: RouteConfig) -> bool:
        return self._engines.wanted(route)

    def ids(self, route: RouteConfig, model: str, view: Mapping[str, Any] | None) -> PromptIds | None:
        """The ids to match now (None: none known), and the calls that learn them for later."""
        if view is None:
            return None
        messages = view.get("messages") if isinstance(view.get("messages"), list) else None
        prompt = view.get("prompt") if isinstance(view.get("prompt"), str) else None
        if messages is not None:
            keys = message_keys(model, messages)
            if not keys:
                return None
        elif prompt is not None:
            keys = [prompt_key(model, prompt)]
        else:
            return None
        own = self.memo.get(keys[-1])
        if own is not None:
            self._count("remembered")
            return PromptIds(own, True)
        asked = Asked(route, model, view, messages, prompt, keys[-1])
        local = self._tokenizer(route)
        text = local[1].prompt_text(view) if local is not None else None
        if local is not None and text is not None:
            pool = local[0]
            start = self.memo.resumable(keys[:-1]) if not text[1] and pool in self._resuming else None
            if len(text[0]) - (start[1].chars if start is not None else 0) <= INLINE_CHARS:
                ids, resumed = self._local_ids(asked, local, text, start)
                self._count("resumed" if resumed else "local")
                return PromptIds(ids, True)
            self._learn(asked, self._encode(asked, local, text, start))
        self._learn(asked, None)  # no-op when the tokenizer took it
        if messages is not None:
            system = _system_run(messages)
            if 0 < system < len(keys) and self.memo.get(keys[system - 1]) is None:
                run = messages[:system]
                lead = Asked(route, model, {"messages": run}, run, None, keys[system - 1])
                run_text = local[1].prompt_text(lead.view) if local is not None else None
                self._learn(lead, self._encode(lead, local, run_text, None) if local and run_text else None)
        earlier = self.memo.longest(keys[:-1])
        self._count("prefix" if earlier is not None else "none")
        return PromptIds(earlier, False) if earlier is not None else None

    def _learn(self, asked: Asked, work: Coroutine[Any, Any, None] | None) -> None:
        """Learn `asked`'s ids in the background: by `work` (None: asking the engine), unless its
        ids are being asked already or too many calls are in flight."""
        if len(self._background) >= BACKGROUND_CALLS or asked.key in self._asking:
            if work is not None:
                work.close()  # never awaited
            return
        self._asking.add(asked.key)  # now, not when the task starts: the next request may come first
        self._start(work if work is not None else self._ask(asked))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _tokenizer(self, route: RouteConfig) -> tuple[str, ChatTokenizer] | None:
        for pool in route.pools:
            tokenizer = self._local.get(pool)
            if tokenizer is not None:
                return pool, tokenizer
        return None

    def _local_ids(
        self, asked: Asked, local: tuple[str, ChatTokenizer], text: tuple[str, bool], earlier: Resumable | None
    ) -> tuple[Sequence[int], bool]:
        """The prompt's ids from the pool's tokenizer, remembered, checked as the pool's tokenizer
        is; and whether they were resumed from an earlier prompt's. The memo's copy when it keeps
        them: the same object the next request sending this prompt gets, whose block keys are then
        not hashed again (kvevents/chains.py)."""
        pool, tokenizer = local
        pieces = self._in_pieces(pool, text)
        ids, cut, resumed = _encoded(tokenizer, text, earlier, pieces=pieces)
        self.memo.put(asked.key, ids, cut)
        self._check(asked, pool, ids)
        if resumed or pieces:
            self._verify(asked.route, pool, tokenizer, text[0], ids)
        kept = self.memo.get(asked.key)
        return (kept if kept is not None else ids), resumed

    def _in_pieces(self, pool: str, text: tuple[str, bool]) -> bool:
        """Whether a chat text is encoded in pieces: while the pool's resumed encodings agree."""
        return pool in self._resuming and not text[1]

    async def _encode(
        self, asked: Asked, local: tuple[str, ChatTokenizer], text: tuple[str, bool], earlier: Resumable | None
    ) -> None:
        """A prompt's ids from the pool's tokenizer, for the requests after it: in the worker thread
        (the GIL released while it encodes) when more than INLINE_CHARS are to be encoded, else on
        the event loop once the request that brought it is on its way (a leading run of system
        messages, learnt beside a prompt too long to encode before routing)."""
        pool, tokenizer = local
        pieces = self._in_pieces(pool, text)
        try:
            if len(text[0]) - (earlier[1].chars if earlier is not None else 0) <= INLINE_CHARS:
                await asyncio.sleep(0)
                ids, cut, resumed = _encoded(tokenizer, text, earlier, pieces=pieces)
            else:
                encode: Callable[[], tuple[list[int], Cut | None, bool]] = lambda: _encoded(  # noqa: E731
                    tokenizer, text, earlier, True, pieces
                )
                ids, cut, resumed = await asyncio.get_running_loop().run_in_executor(self._thread, encode)
            self.memo.put(asked.key, ids, cut)
            self._check(asked, pool, ids)
            if resumed or pieces:
                self._verify(asked.route, pool, tokenizer, text[0], ids)
        finally:
            self._asking.discard(asked.key)

    def _verify(self, route: RouteConfig, pool: str, tokenizer: ChatTokenizer, text: str, ids: list[int]) -> None:
        """The first VERIFY_FIRST encodings of a pool resumed or in pieces, and one in VERIFY_EVERY
        after, are encoded whole too (in the worker thread, at a quiet moment) and compared."""
        n = self._resumed[pool]
        self._resumed[pool] = n + 1
        if n < VERIFY_FIRST or n % VERIFY_EVERY == 0:
            self._start(self._compare_whole(route, pool, tokenizer, text, ids))

    async def _compare_whole(
        self, route: RouteConfig, pool: str, tokenizer: ChatTokenizer, text: str, ids: list[int]
    ) -> None:
        await self._engines.quiet(route)
        whole: Callable[[], list[int]] = lambda: tokenizer.encode_chat(text, release=True)[0]  # noqa: E731
        if await asyncio.get_running_loop().run_in_executor(self._thread, whole) == ids or pool not in self._resuming:
            return
        self._resuming.discard(pool)
        self._count("resume_mismatch")
        self.memo.clear()
        log.warning(
            "pool %s: the tokenizer in %s encodes a prompt differently in pieces than whole; "
            "its prompts are encoded whole from now on",
            pool,
            tokenizer.path,
        )

    def _check(self, asked: Asked, pool: str, ids: list[int]) -> None:
        n = self._encoded[pool]
        self._encoded[pool] = n + 1
        if n < CHECK_FIRST or n % CHECK_EVERY == 0:
            self._start(self._compare(asked, pool, ids))

    async def _compare(self, asked: Asked, pool: str, ids: list[int]) -> None:
        engine = await self._engines.call(asked, await self._engines.quiet(asked.route))
        if engine is None or engine == ids:
            return
        tokenizer = self._local.pop(pool, None)
        if tokenizer is None:
            return
        self._count("mismatch")
        self.memo.clear()  # some of what it holds is that tokenizer's
        first = next(
            (i for i, (a, b) in enumerate(zip(ids, engine, strict=False)) if a != b), min(len(ids), len(engine))
        )
        log.warning(
            "pool %s: the tokenizer in %s gave %d token ids where the engine gave %d (first difference at %d); "
            "its prompts are asked of the engine from now on",
            pool,
            tokenizer.path,
            len(ids),
            len(engine),
            first,
        )

    def _count(self, source: str) -> None:
        counter = self._counters.get(source)
        if counter is None:
            counter = self._counters[source] = self._metrics.child(self._metrics.kv_prompt_ids, source)
        counter.inc()

    async def _ask(self, asked: Asked) -> None:
        try:
            tokens = await self._engines.call(asked)
            if tokens is not None:
                self.memo.put(asked.key, tokens)
        finally:
            self._asking.discard(asked.key)

    def busy(self) -> bool:
        """Whether background calls or encodings are still running."""
        return bool(self._background)

    async def close(self) -> None:
        """Cancel the background calls (the gateway is stopping)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._thread is not None:
            self._thread.shutdown(wait=False, cancel_futures=True)


def _encoded(
    tokenizer: ChatTokenizer,
    text: tuple[str, bool],
    earlier: Resumable | None,
    release: bool = False,
    pieces: bool = False,
) -> tuple[list[int], Cut | None, bool]:
    """A prompt's ids, its cut, and whether they were resumed from `earlier` (an earlier prompt of
    the conversation: its ids and cut); `release`: in a worker thread, the GIL released while
    encoding; `pieces`: a chat text encoded piece by piece (ChatTokenizer.pieced)."""
    prompt, special = text
    if special:
        return tokenizer.encode(prompt, True, release=release), None, False
    if earlier is not None:
        resumed = tokenizer.resume(prompt, *earlier, release=release, pieces=pieces)
        if resumed is not None:
            return resumed[0], resumed[1], True
    ids, cut = tokenizer.encode_chat(prompt, release=release, pieces=pieces)
    return ids, cut, False


def _system_run(messages: list[Any]) -> int:
    """How many messages the conversation opens with that are system or developer instructions."""
    n = 0
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
            break
        n += 1
    return n
