"""Enforce a route's context cap before a request leaves the gateway: estimate the prompt's
tokens, ask the engine for an exact count near the cap, then reject, truncate or clamp. The result
is a value (the Edits and the prompt's count); the request itself is never changed."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from engines.context_error import context_message
from gateway.config import RouteConfig
from gateway.errors import ContextLengthExceeded, GatewayError
from gateway.fleet.registry import Backend
from gateway.metrics import GatewayMetrics
from gateway.pipeline.context import Candidate, Request
from gateway.policy.caps import (
    PER_MESSAGE_TOKENS,
    CapDecision,
    TokenEstimator,
    cap_source,
    decide,
    effective_cap,
    learnable,
    message_chars,
    prompt_size,
    truncate_oldest,
)
from gateway.protocols.edits import NO_EDITS, Edits
from gateway.upstream.client import UpstreamClient
from gateway.value import value

log = logging.getLogger(__name__)


@value
class PromptCount:
    """What the cap step knows of the prompt: the estimator's key and inputs, and the counts."""

    key: tuple[str, str] | None = None
    chars: int = 0
    messages: int = 0
    wide: int = 0
    """Non-ASCII bytes, counted as tokens in the estimate (policy/caps.py wide_bytes)."""
    estimate: int = 0
    exact: int | None = None


NO_PROMPT = PromptCount()


class CapEnforcer:
    def __init__(self, upstream: UpstreamClient, metrics: GatewayMetrics, count_timeout_s: float = 5.0) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self._timeout_s = count_timeout_s
        self.estimator = TokenEstimator()

    def routing_estimate(self, request: Request) -> int:
        """The prompt-token estimate that prompt-size rules see, before a backend is chosen."""
        if request.size is None:
            return 0
        chars, messages, known, wide = request.size
        key = (request.route.label, request.route.upstream_model or request.inbound.model)
        return self.estimator.estimate(key, chars, messages, known + wide)

    async def apply(self, request: Request, candidate: Candidate) -> tuple[Edits, PromptCount]:
        """The cap's edits for this request on the candidate's backend (asked about the name it is
        sent), and the prompt's count; raises ContextLengthExceeded when it cannot be made to fit. The
        cap is the route's or the backend's context window, whichever is smaller."""
        view, size = request.view, request.size
        if view is None or size is None:
            return NO_EDITS, NO_PROMPT
        route, inbound, backend = request.route, request.inbound, candidate.backend
        caps = route.caps
        chars, messages, known, wide = size
        model = candidate.model or inbound.model  # the name the backend is sent
        key = (route.label, model)
        estimate = self.estimator.estimate(key, chars, messages, known + wide)
        count = PromptCount(key, chars, messages, wide, estimate)
        window = backend.window
        cap = effective_cap(caps.max_context_tokens, window)
        if cap is None and caps.default_max_tokens is None and caps.max_tokens_limit is None:
            return NO_EDITS, count
        prompt, method = estimate, "estimate"
        decision = decide(caps, estimate, inbound.max_tokens, window)
        # The output the request will carry: the gateway's own budget when it sets one. A budget it
        # fills up to the cap (no max_tokens, or a clamp) leaves no room for the estimate's error, so
        # it is the engine's exact count that decides then, not the estimate.
        budget = decision.max_tokens if decision.max_tokens is not None else inbound.max_tokens
        if cap is not None and estimate + (budget or 1) >= cap * (1 - caps.exact_margin):
            exact = await self.count(backend, model, view)
            if exact is None:
                method = "estimate_fallback"
                decision = _spare_margin(decision, cap, prompt, caps.exact_margin)
            else:
                prompt, method = exact, "exact"
                count = PromptCount(key, chars, messages, wide, estimate, exact)
                decision = decide(caps, prompt, inbound.max_tokens, window)
        edits = NO_EDITS
        if decision.action == "reject" or (cap is not None and prompt > cap):
            if caps.on_exceed == "truncate_oldest" and inbound.messages is not None and cap is not None:
                edits, count, decision = await self._truncate(request, backend, model, prompt, method)
            else:
                self._metrics.cap_actions.labels(route.label, "rejected", method).inc()
                raise ContextLengthExceeded(decision.message, param="messages")
        return edits.then(self._max_tokens(route, decision, method)), count

    def _max_tokens(self, route: RouteConfig, decision: CapDecision, method: str) -> Edits:
        if decision.max_tokens is None or decision.action not in ("clamp", "default"):
            return NO_EDITS
        value = str(decision.max_tokens).encode()
        if decision.action == "clamp":
            self._metrics.cap_actions.labels(route.label, "clamped", method).inc()
            return Edits(max_tokens=decision.max_tokens, headers=((b"x-gateway-max-tokens-clamped", value),))
        self._metrics.cap_actions.labels(route.label, "defaulted", method).inc()
        return Edits(max_tokens=decision.max_tokens, headers=((b"x-gateway-max-tokens", value),))

    async def _truncate(
        self, request: Request, backend: Backend, model: str, prompt: int, method: str
    ) -> tuple[Edits, PromptCount, CapDecision]:
        route, inbound, view, window = request.route, request.inbound, request.view, backend.window
        assert view is not None
        assert inbound.messages is not None
        cap = effective_cap(route.caps.max_context_tokens, window)
        assert cap is not None
        key = (route.label, model)
        ratio = self.estimator.ratio(key)
        per = [PER_MESSAGE_TOKENS + int(message_chars(m) / ratio + 0.999) for m in inbound.messages]
        # Scale the per-message estimates so that they add up to the count that decided.
        total = sum(per) or 1
        per = [max(1, round(p * prompt / total)) for p in per]
        reserve = min(inbound.max_tokens or route.caps.default_max_tokens or 256, cap // 4)
        result = truncate_oldest(inbound.messages, per, cap - reserve)
        if result is None or result[1] == 0:
            self._metrics.cap_actions.labels(route.label, "rejected", method).inc()
            raise ContextLengthExceeded(
                context_message(cap, prompt, inbound.max_tokens)
                + " Dropping old messages cannot make it fit: the system prompt and the last user message"
                " are always kept." + cap_source(route.caps.max_context_tokens, window),
                param="messages",
            )
        kept, dropped = result
        messages = tuple(dict(m) for m in kept)
        shorter = {**view, "messages": list(messages)}
        chars, count, _, wide = prompt_size(shorter)
        new_prompt = self.estimator.estimate(key, chars, count, wide)
        exact: int | None = None
        if method == "exact":
            exact = await self.count(backend, model, shorter)
            new_prompt = exact if exact is not None else new_prompt
        self._metrics.cap_actions.labels(route.label, "truncated", method).inc()
        self._metrics.truncated_messages.labels(route.label).inc(dropped)
        edits = Edits(
            messages=messages,
            dropped_messages=dropped,
            headers=((b"x-gateway-truncated-messages", str(dropped).encode()),),
        )
        decision = decide(route.caps, new_prompt, inbound.max_tokens, window)
        if decision.action == "reject":
            raise ContextLengthExceeded(decision.message, param="messages")
        return edits, PromptCount(key, chars, count, wide, new_prompt, exact), decision

    async def count(self, backend: Backend, model: str, body: Mapping[str, Any]) -> int | None:
        """The engine's exact prompt token count, or None when it can't say."""
        messages = body.get("messages") if isinstance(body.get("messages"), list) else None
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else None
        adapter = backend.adapter
        headers = backend.auth_headers()
        answers: list[Any] = []
        try:
            calls = list(adapter.tokenize_calls(model, messages, prompt))
            while calls:
                call = calls.pop(0)
                status, data = await self._upstream.post_json(
                    backend.url + call.path, dict(call.json), headers, self._timeout_s, backend.name
                )
                if status != 200 or data is None:
                    return None
                answers.append(data)
                if not calls:  # llama.cpp counts in two steps: apply the template, then tokenize
                    follow = adapter.next_tokenize_call(answers)
                    if follow is not None:
                        calls.append(follow)
        except GatewayError as exc:
            log.debug("exact count on %s failed: %s", backend.name, exc.message)
            return None
        return adapter.count_tokens(answers) if answers else None

    def learn(self, count: PromptCount, prompt_tokens: int | None) -> None:
        """Teach the estimator from what the engine counted (or the exact count, without usage)."""
        if count.key is None or not learnable(count.chars, count.wide):
            return
        tokens = prompt_tokens if prompt_tokens is not None else count.exact
        if tokens:
            self.estimator.learn(count.key, count.chars, count.messages, tokens)


def _spare_margin(decision: CapDecision, cap: int, estimate: int, margin: float) -> CapDecision:
    """Without the engine's count, a budget the gateway sets keeps `margin` of the estimate free:
    an estimate that is short by up to that share still fits (a best effort, not a proof)."""
    if decision.max_tokens is None or decision.action not in ("clamp", "default"):
        return decision
    spare = max(1, cap - math.ceil(estimate * (1 + margin)))
    return CapDecision(decision.action, max_tokens=spare) if decision.max_tokens > spare else decision
