"""Enforce a route's context cap before a request leaves the gateway: estimate the prompt's
tokens, ask the engine for an exact count near the cap, then reject, truncate or clamp."""

from __future__ import annotations

import logging
from typing import Any

from engines.context_error import context_message
from gateway.caps import (
    PER_MESSAGE_TOKENS,
    ROUTE_CAP,
    CapDecision,
    TokenEstimator,
    decide,
    message_chars,
    prompt_size,
    truncate_oldest,
)
from gateway.config import RouteConfig
from gateway.errors import ContextLengthExceeded, GatewayError
from gateway.exchange import Exchange
from gateway.inbound import InboundRequest
from gateway.metrics import GatewayMetrics
from gateway.registry import Backend
from gateway.upstream import UpstreamClient

log = logging.getLogger(__name__)


class CapEnforcer:
    def __init__(self, upstream: UpstreamClient, metrics: GatewayMetrics, count_timeout_s: float = 5.0) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self._timeout_s = count_timeout_s
        self.estimator = TokenEstimator()

    def routing_estimate(self, route: RouteConfig, inbound: InboundRequest) -> int:
        """The prompt-token estimate that prompt-size rules see, before a backend is chosen."""
        if inbound.kind == "embeddings":
            return 0
        chars, messages, known = prompt_size(inbound.body)
        return self.estimator.estimate((route.label, route.upstream_model or inbound.model), chars, messages, known)

    async def apply(self, ex: Exchange, route: RouteConfig, backend: Backend) -> None:
        inbound = ex.inbound
        assert inbound is not None
        if inbound.kind == "embeddings":
            return
        caps = route.caps
        chars, messages, known = prompt_size(inbound.body)
        model = backend.model or route.upstream_model or inbound.model
        key = (route.label, model)
        ex.estimator_key, ex.prompt_chars, ex.prompt_messages = key, chars, messages
        estimate = ex.prompt_estimate = self.estimator.estimate(key, chars, messages, known)
        cap = caps.max_context_tokens
        if cap is None and caps.default_max_tokens is None and caps.max_tokens_limit is None:
            return
        prompt, method = estimate, "estimate"
        if cap is not None and estimate + (inbound.max_tokens or 1) >= cap * (1 - caps.exact_margin):
            exact = await self.count(backend, model, inbound.body)
            if exact is None:
                method = "estimate_fallback"
            else:
                prompt, method = exact, "exact"
                ex.prompt_exact = exact
        decision = decide(caps, prompt, inbound.max_tokens)
        if decision.action == "reject" or (cap is not None and prompt > cap):
            if caps.on_exceed == "truncate_oldest" and inbound.messages is not None and cap is not None:
                decision, prompt = await self._truncate(ex, route, backend, model, prompt, method)
            else:
                self._metrics.cap_actions.labels(route.label, "rejected", method).inc()
                raise ContextLengthExceeded(decision.message, param="messages")
        self._set_max_tokens(ex, route, decision, method)

    def _set_max_tokens(self, ex: Exchange, route: RouteConfig, decision: CapDecision, method: str) -> None:
        inbound = ex.inbound
        assert inbound is not None
        if decision.max_tokens is None or decision.action not in ("clamp", "default"):
            return
        inbound.body[inbound.max_tokens_field] = decision.max_tokens
        inbound.modified = True
        if decision.action == "clamp":
            self._metrics.cap_actions.labels(route.label, "clamped", method).inc()
            ex.extra_headers.append((b"x-gateway-max-tokens-clamped", str(decision.max_tokens).encode()))
        else:
            self._metrics.cap_actions.labels(route.label, "defaulted", method).inc()
            ex.extra_headers.append((b"x-gateway-max-tokens", str(decision.max_tokens).encode()))

    async def _truncate(
        self, ex: Exchange, route: RouteConfig, backend: Backend, model: str, prompt: int, method: str
    ) -> tuple[CapDecision, int]:
        inbound = ex.inbound
        assert inbound is not None and inbound.messages is not None
        cap = route.caps.max_context_tokens
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
                " are always kept." + ROUTE_CAP,
                param="messages",
            )
        kept, dropped = result
        inbound.body["messages"] = inbound.messages = [dict(m) for m in kept]
        inbound.modified = True
        chars, count, _ = prompt_size(inbound.body)
        ex.prompt_chars, ex.prompt_messages = chars, count
        new_prompt = self.estimator.estimate(key, chars, count)
        if method == "exact":
            exact = await self.count(backend, model, inbound.body)
            new_prompt = exact if exact is not None else new_prompt
            ex.prompt_exact = exact
        ex.prompt_estimate = new_prompt
        self._metrics.cap_actions.labels(route.label, "truncated", method).inc()
        self._metrics.truncated_messages.labels(route.label).inc(dropped)
        ex.extra_headers.append((b"x-gateway-truncated-messages", str(dropped).encode()))
        decision = decide(route.caps, new_prompt, inbound.max_tokens)
        if decision.action == "reject":
            raise ContextLengthExceeded(decision.message, param="messages")
        return decision, new_prompt

    async def count(self, backend: Backend, model: str, body: dict[str, Any]) -> int | None:
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

    def learn(self, ex: Exchange, prompt_tokens: int | None) -> None:
        if ex.estimator_key is None:
            return
        tokens = prompt_tokens if prompt_tokens is not None else ex.prompt_exact
        if tokens:
            self.estimator.learn(ex.estimator_key, ex.prompt_chars, ex.prompt_messages, tokens)
