"""Envoy's ext_proc stream for one HTTP request: the request's headers and body in (buffered, or
FULL_DUPLEX_STREAMED), the Picker's decision out (the destination header and `envoy.lb` metadata, the
body the cap and the alias made, or an ImmediateResponse in the client's protocol); then the answer's
headers and body, observed on their way to the client and passed on."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping

from google.protobuf import struct_pb2

from gateway.epp.picker import Asked, Pick, Picker, Refusal
from gateway.epp.proto import core_pb2 as core
from gateway.epp.proto import external_processor_pb2 as ep
from gateway.epp.proto import http_status_pb2 as http_status
from gateway.epp.proto import processing_mode_pb2 as modes
from gateway.errors import GatewayError, PayloadTooLarge
from gateway.pipeline.exchange import Outcome

log = logging.getLogger(__name__)

DESTINATION = "x-gateway-destination-endpoint"
"""The header the data plane's ORIGINAL_DST cluster reads, and the key under `envoy.lb` metadata."""
LB_NAMESPACE = "envoy.lb"
FALLBACK = "x-gateway-destination-endpoint-fallback"
"""A second endpoint, in the same namespace, for a data plane that tries one more."""
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET = "x-gateway-destination-endpoint-subset"
"""The endpoints (ip:port) the data plane allows for this request, in its request metadata."""
FULL_DUPLEX = modes.ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = modes.ProcessingMode.BUFFERED
OVERWRITE = core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


class StreamState:
    """What one ext_proc stream has seen so far."""

    __slots__ = (
        "answer_duplex",
        "arrived",
        "body",
        "duplex",
        "ended",
        "headers",
        "pick",
        "refused",
        "size",
        "status",
        "subset",
    )

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.duplex = False
        self.answer_duplex = False
        """The answer's body comes FULL_DUPLEX_STREAMED: each chunk is passed on by our reply."""
        self.pick: Pick | None = None
        self.refused = False
        self.status = 0
        self.ended = False
        """The answer's last byte went by."""
        self.subset: frozenset[str] | None = None
        self.arrived = time.perf_counter()
        """When the request's headers came: TTFT and the duration run from here, as the client's do."""


class ExternalProcessor:
    """envoy.service.ext_proc.v3.ExternalProcessor/Process, one call per HTTP request."""

    def __init__(self, picker: Picker) -> None:
        self._picker = picker
        self._limit = picker.gateway.config.limits.max_body_bytes

    async def process(
        self, requests: AsyncIterator[ep.ProcessingRequest], context: object
    ) -> AsyncIterator[ep.ProcessingResponse]:
        state = StreamState()
        try:
            async for message in requests:
                for reply in await self._handle(state, message):
                    yield reply
                if state.refused:
                    return
        finally:
            if state.pick is not None:
                self._picker.finish(state.pick, _outcome(state))

    async def _handle(self, state: StreamState, message: ep.ProcessingRequest) -> list[ep.ProcessingResponse]:
        kind = message.WhichOneof("request")
        if kind == "request_headers":
            state.arrived = time.perf_counter()
            state.headers = _headers(message.request_headers.headers.headers)
            if message.HasField("protocol_config"):
                mode = message.protocol_config.request_body_mode
                if mode not in (BUFFERED, FULL_DUPLEX):
                    return self._misconfigured(state)
                state.duplex = mode == FULL_DUPLEX
                state.answer_duplex = message.protocol_config.response_body_mode == FULL_DUPLEX
            state.subset = _subset(message)
            if message.request_headers.end_of_stream:  # no body: nothing the gateway routes
                return await self._decide(state, b"")
            if state.duplex:
                return []  # the headers' answer waits for the body: it carries the destination
            return [ep.ProcessingResponse(request_headers=ep.HeadersResponse())]
        if kind == "request_body":
            chunk = message.request_body
            state.body.append(chunk.body)
            state.size += len(chunk.body)
            if state.size > self._limit:
                err = PayloadTooLarge(f"The request body is larger than the {self._limit}-byte limit.")
                return self._refuse(state, self._picker.refusal(self._picker.protocol(_path(state)), err))
            if chunk.end_of_stream:
                return await self._decide(state, b"".join(state.body))
            if not state.duplex:  # a body in pieces without a protocol_config that says so
                return self._misconfigured(state)
            return []
        if kind == "request_trailers":
            out = [] if state.pick is not None else await self._decide(state, b"".join(state.body))
            if state.refused:
                return out
            return [*out, ep.ProcessingResponse(request_trailers=ep.TrailersResponse())]
        if kind == "response_headers":
            return [self._response_headers(state, message.response_headers)]
        if kind == "response_body":
            return [self._response_body(state, message.response_body)]
        if kind == "response_trailers":
            state.ended = True
            return [ep.ProcessingResponse(response_trailers=ep.TrailersResponse())]
        return []

    async def _decide(self, state: StreamState, raw: bytes) -> list[ep.ProcessingResponse]:
        path = _path(state)
        try:
            pick = await self._picker.pick(Asked(path, state.headers, raw, state.subset, state.arrived))
        except GatewayError as err:
            return self._refuse(state, self._picker.refusal(self._picker.protocol(path), err))
        except Exception:  # a bug: still the protocol's error body, never a broken stream
            log.exception("ext_proc request %s failed", state.headers.get("x-request-id", "-"))
            bug = GatewayError("The gateway failed on this request.", code="internal_error")
            return self._refuse(state, self._picker.refusal(self._picker.protocol(path), bug))
        state.pick = pick
        body = pick.body if pick.body is not None else raw
        set_headers = dict(pick.set_headers)
        if pick.path is not None:
            query = path.partition("?")[2]
            set_headers[":path"] = f"{pick.path}?{query}" if query else pick.path
        metadata = struct_pb2.Struct()
        lb = {DESTINATION: pick.address}
        if pick.fallback is not None:
            lb[FALLBACK] = pick.fallback
        metadata.update({LB_NAMESPACE: lb})
        if state.duplex:
            # Headers first (the destination, and the length of the body that follows: the whole
            # body is known, so the engine need not take a chunked one), then that body as one
            # streamed chunk that ends the request.
            set_headers["content-length"] = str(len(body))
            headers = ep.HeadersResponse(
                response=ep.CommonResponse(header_mutation=_mutation(set_headers, pick.remove_headers))
            )
            streamed = ep.StreamedBodyResponse(body=body, end_of_stream=True)
            body_reply = ep.BodyResponse(
                response=ep.CommonResponse(body_mutation=ep.BodyMutation(streamed_response=streamed))
            )
            return [
                ep.ProcessingResponse(request_headers=headers, dynamic_metadata=metadata),
                ep.ProcessingResponse(request_body=body_reply),
            ]
        common = ep.CommonResponse(header_mutation=_mutation(set_headers, pick.remove_headers))
        if pick.body is not None:
            common.header_mutation.set_headers.append(_header("content-length", str(len(body))))
            common.body_mutation.body = body
        return [ep.ProcessingResponse(request_body=ep.BodyResponse(response=common), dynamic_metadata=metadata)]

    def _misconfigured(self, state: StreamState) -> list[ep.ProcessingResponse]:
        """A request body mode other than BUFFERED and FULL_DUPLEX_STREAMED: with STREAMED the request
        would leave before the pick (to no destination). A deployment error, said to the client as
        the gateway's own failure and in the EPP's log."""
        log.error("Envoy's ext_proc request_body_mode must be BUFFERED or FULL_DUPLEX_STREAMED")
        err = GatewayError("The gateway's data plane is misconfigured.", code="epp_body_mode")
        return self._refuse(state, self._picker.refusal(self._picker.protocol(_path(state)), err))

    @staticmethod
    def _refuse(state: StreamState, refusal: Refusal) -> list[ep.ProcessingResponse]:
        state.refused = True
        immediate = ep.ImmediateResponse(
            status=http_status.HttpStatus(code=refusal.status),  # type: ignore[arg-type]  # an open enum
            headers=_mutation(dict(refusal.headers), ()),
            body=refusal.body,
            details="gateway_refused",
        )
        return [ep.ProcessingResponse(immediate_response=immediate)]

    def _response_headers(self, state: StreamState, message: ep.HttpHeaders) -> ep.ProcessingResponse:
        headers = _headers(message.headers.headers)
        status = int(headers.get(":status", "0") or 0)
        state.status = status
        pick = state.pick
        if pick is None:
            return ep.ProcessingResponse(response_headers=ep.HeadersResponse())
        self._picker.answered(pick, status)
        if message.end_of_stream:
            state.ended = True
        ex = pick.ex
        said = {"x-gateway-pool": ex.pool, "x-gateway-backend": ex.backend_name, "x-gateway-rule": ex.rule}
        if ex.served_model is not None:
            said["x-gateway-model"] = ex.served_model
        for name, value in ex.headers:
            said[name.decode("latin-1")] = value.decode("latin-1")
        common = ep.CommonResponse(header_mutation=_mutation(said, ()))
        return ep.ProcessingResponse(response_headers=ep.HeadersResponse(response=common))

    def _response_body(self, state: StreamState, message: ep.HttpBody) -> ep.ProcessingResponse:
        pick = state.pick
        out = message.body
        if pick is not None:
            out = self._picker.answer_chunk(pick, message.body)
            if message.end_of_stream:
                out += self._picker.answer_end(pick)
        if message.end_of_stream:
            state.ended = True
        if not state.answer_duplex:  # observed only: Envoy passes its own chunk on
            return ep.ProcessingResponse(response_body=ep.BodyResponse())
        streamed = ep.StreamedBodyResponse(body=out, end_of_stream=message.end_of_stream)
        common = ep.CommonResponse(body_mutation=ep.BodyMutation(streamed_response=streamed))
        return ep.ProcessingResponse(response_body=ep.BodyResponse(response=common))


def _outcome(state: StreamState) -> Outcome:
    if not state.ended:
        return "client_closed"  # the stream went before the answer's end: the client left, or Envoy reset it
    status = state.status
    if status == 200:
        return "success"
    if status == 429:
        return "overloaded"
    return "rejected_4xx" if 400 <= status < 500 else "upstream_error_before_first_byte"


def _subset(message: ep.ProcessingRequest) -> frozenset[str] | None:
    """The envoy.lb.subset_hint endpoints, when the data plane sent them (an empty list allows none)."""
    namespaces = message.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    hint = namespaces[SUBSET_NAMESPACE].fields.get(SUBSET)
    if hint is None or hint.WhichOneof("kind") != "list_value":
        return None
    return frozenset(v.string_value for v in hint.list_value.values if v.WhichOneof("kind") == "string_value")


def _path(state: StreamState) -> str:
    return state.headers.get(":path", "/")


def _headers(values: Iterable[core.HeaderValue]) -> dict[str, str]:
    """Envoy sends lower-case names, each value in raw_value (older ones: in value)."""
    return {h.key: h.raw_value.decode("latin-1") if h.raw_value else h.value for h in values}


def _header(name: str, value: str) -> core.HeaderValueOption:
    return core.HeaderValueOption(
        header=core.HeaderValue(key=name, raw_value=value.encode("latin-1", "replace")), append_action=OVERWRITE
    )


def _mutation(set_headers: Mapping[str, str], remove: Iterable[str]) -> ep.HeaderMutation:
    return ep.HeaderMutation(set_headers=[_header(k, v) for k, v in set_headers.items()], remove_headers=list(remove))
