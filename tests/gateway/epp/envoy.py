"""A test double of Envoy: its ext_proc filter asking the picker, and its router moving bytes.

``EnvoyLike.request`` does for one HTTP request what Envoy does with the
endpoint picker in front of an ``InferencePool``: it opens one ext_proc stream,
sends the request headers (the processing mode in ``ProtocolConfiguration``,
the subset hint in the metadata context) and the body (one buffered message,
or full-duplex chunks), checks every answer against the protocol (the answer
to each message in order; the destination header equal to the ``envoy.lb``
metadata; in full-duplex mode the body streamed back whole), forwards the
request to the endpoints named, in order, the next one only on a connection
failure or a 5xx (Envoy's retry policy), and reports the response back: its
headers with the endpoint that served, its body chunk by chunk, its end.

Any deviation raises ``ProtocolError``: a test counting none has seen none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub
from google.protobuf.struct_pb2 import Struct

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"

Mode = Literal["buffered", "full_duplex"]
CancelAt = Literal["decision", "response_headers", "first_chunk"] | None


class ProtocolError(AssertionError):
    """The picker answered out of the protocol's order or shape."""


@dataclass
class Result:
    """What the client saw for one request."""

    status: int
    headers: dict[str, str]
    body: bytes
    endpoints: list[str] = field(default_factory=list)
    """The endpoints the picker named, in order (empty: an immediate response)."""
    served: str | None = None
    immediate: bool = False
    cancelled: bool = False


def _headers(pairs: dict[str, str], end: bool) -> pb.HttpHeaders:
    values = [HeaderValue(key=k.lower(), raw_value=v.encode()) for k, v in pairs.items()]
    return pb.HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end)


def _mutated(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {
        h.header.key: (h.header.raw_value.decode() if h.header.raw_value else h.header.value)
        for h in mutation.set_headers
    }


class EnvoyLike:
    """One gateway's ext_proc filter and router, talking to the picker at ``target``."""

    def __init__(self, target: str, *, mode: Mode = "full_duplex", chunk: int = 64) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = ExternalProcessorStub(self.channel)
        self.mode = mode
        self.chunk = chunk
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self.protocol_errors = 0

    async def close(self) -> None:
        await self.http.close()
        await self.channel.close()

    async def request(
        self,
        body: bytes,
        *,
        path: str = "/v1/chat/completions",
        headers: dict[str, str] | None = None,
        subset: Sequence[str] | None = None,
        cancel_at: CancelAt = None,
        mode: Mode | None = None,
        method: str | None = None,
    ) -> Result:
        try:
            return await self._request(
                body,
                path,
                extra=headers or {},
                subset=subset,
                cancel_at=cancel_at,
                mode=mode,
                method=method or ("POST" if body else "GET"),
            )
        except ProtocolError:
            self.protocol_errors += 1
            raise

    async def _request(
        self,
        body: bytes,
        path: str,
        *,
        extra: dict[str, str],
        subset: Sequence[str] | None,
        cancel_at: CancelAt,
        mode: Mode | None,
        method: str,
    ) -> Result:
        duplex = (mode or self.mode) == "full_duplex"
        body_mode = ProcessingMode.FULL_DUPLEX_STREAMED if duplex else ProcessingMode.BUFFERED
        call = self.stub.Process()
        request_headers = {
            ":method": method,
            ":path": path,
            ":authority": "gateway",
            "content-type": "application/json",
            **extra,
        }
        first = pb.ProcessingRequest(
            request_headers=_headers(request_headers, end=not body),
            protocol_config=pb.ProtocolConfiguration(
                request_body_mode=body_mode, response_body_mode=body_mode
            ),
        )
        if subset is not None:
            hint = Struct()
            hint.update({SUBSET: list(subset)})
            first.metadata_context.CopyFrom(
                Metadata(filter_metadata={"envoy.lb.subset_hint": hint})
            )
        await call.write(first)
        decision: pb.ProcessingResponse
        sent_body = body
        if not body:
            decision = await self._read(call)
        elif duplex:
            pieces = [body[i : i + self.chunk] for i in range(0, len(body), self.chunk)]
            for i, piece in enumerate(pieces):
                end = i == len(pieces) - 1
                await call.write(
                    pb.ProcessingRequest(request_body=pb.HttpBody(body=piece, end_of_stream=end))
                )
            decision = await self._read(call)
            if decision.HasField("immediate_response"):
                return self._immediate(call, decision)
            self._expect(decision, "request_headers")
            echoed = bytearray()
            while True:
                answer = await self._read(call)
                self._expect(answer, "request_body")
                streamed = answer.request_body.response.body_mutation.streamed_response
                echoed += streamed.body
                if streamed.end_of_stream:
                    break
            sent_body = bytes(echoed)  # what the proxy forwards: the body as it came back
            length = _mutated(decision.request_headers.response.header_mutation).get(
                "content-length"
            )
            if sent_body != body and length != str(len(sent_body)):
                raise ProtocolError("the body came back changed without its content-length")
        else:
            answer = await self._read(call)
            if answer.HasField("immediate_response"):
                return self._immediate(call, answer)
            self._expect(answer, "request_headers")
            if _mutated(answer.request_headers.response.header_mutation):
                raise ProtocolError("buffered mode: the decision came before the body")
            await call.write(
                pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
            )
            decision = await self._read(call)
            mutation = decision.request_body.response.body_mutation
            if mutation.WhichOneof("mutation") == "body":
                sent_body = bytes(mutation.body)
        if decision.HasField("immediate_response"):
            return self._immediate(call, decision)
        kind = decision.WhichOneof("response")
        if kind not in ("request_headers", "request_body"):
            raise ProtocolError(f"no decision: got {kind}")
        common = getattr(decision, kind).response
        value = _mutated(common.header_mutation).get(DESTINATION)
        meta = decision.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        if value is None or meta[DESTINATION].string_value != value:
            raise ProtocolError("the destination header and metadata differ")
        endpoints = [e for e in value.split(",") if e]
        if cancel_at == "decision":
            call.cancel()
            return Result(0, {}, b"", endpoints, cancelled=True)
        return await self._forward(
            call,
            path,
            sent_body,
            extra=extra,
            endpoints=endpoints,
            duplex=duplex,
            cancel=cancel_at,
            method=method,
        )

    async def _forward(
        self,
        call: Any,
        path: str,
        body: bytes,
        *,
        extra: dict[str, str],
        endpoints: list[str],
        duplex: bool,
        cancel: CancelAt,
        method: str = "POST",
    ) -> Result:
        for n, endpoint in enumerate(endpoints):
            last = n == len(endpoints) - 1
            try:
                response = await self.http.request(
                    method,
                    f"http://{endpoint}{path}",
                    data=body,
                    headers={"content-type": "application/json", **extra},
                )
            except aiohttp.ClientConnectionError:
                if last:
                    call.cancel()
                    return Result(503, {}, b"", endpoints)
                continue
            if response.status >= 500 and not last:
                response.release()
                continue
            async with response:
                return await self._respond(
                    call, response, endpoint, endpoints=endpoints, duplex=duplex, cancel_at=cancel
                )
        raise ProtocolError("no endpoint")

    async def _respond(
        self,
        call: Any,
        response: aiohttp.ClientResponse,
        served: str,
        *,
        endpoints: list[str],
        duplex: bool,
        cancel_at: CancelAt,
    ) -> Result:
        headers = {":status": str(response.status)}
        headers.update({k.lower(): v for k, v in response.headers.items()})
        served_meta = Struct()
        served_meta.update({SERVED: served})
        message = pb.ProcessingRequest(
            response_headers=_headers(headers, end=False),
            metadata_context=Metadata(filter_metadata={"envoy.lb": served_meta}),
        )
        await call.write(message)
        answer = await self._read(call)
        self._expect(answer, "response_headers")
        headers.update(_mutated(answer.response_headers.response.header_mutation))
        if cancel_at == "response_headers":
            call.cancel()
            return Result(response.status, headers, b"", endpoints, served, cancelled=True)
        out = bytearray()
        if duplex:
            async for piece in response.content.iter_any():
                await call.write(
                    pb.ProcessingRequest(response_body=pb.HttpBody(body=piece, end_of_stream=False))
                )
                out += await self._echo(call)
                if cancel_at == "first_chunk":
                    call.cancel()
                    return Result(
                        response.status, headers, bytes(out), endpoints, served, cancelled=True
                    )
            await call.write(
                pb.ProcessingRequest(response_body=pb.HttpBody(body=b"", end_of_stream=True))
            )
            out += await self._echo(call, last=True)
        else:
            data = await response.read()
            await call.write(
                pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=True))
            )
            self._expect(await self._read(call), "response_body")
            out += data
        await call.done_writing()
        if await call.read() is not grpc.aio.EOF:
            raise ProtocolError("the picker sent more than the protocol asks")
        return Result(response.status, headers, bytes(out), endpoints, served)

    async def _echo(self, call: Any, last: bool = False) -> bytes:
        answer = await self._read(call)
        self._expect(answer, "response_body")
        streamed = answer.response_body.response.body_mutation.streamed_response
        if streamed.end_of_stream != last:
            raise ProtocolError("the streamed response body ended at the wrong chunk")
        return bytes(streamed.body)

    def _immediate(self, call: Any, answer: pb.ProcessingResponse) -> Result:
        immediate = answer.immediate_response
        headers = _mutated(immediate.headers)
        call.cancel()  # Envoy closes the stream once it answered the client itself
        return Result(int(immediate.status.code), headers, bytes(immediate.body), immediate=True)

    async def _read(self, call: Any) -> pb.ProcessingResponse:
        try:
            answer = await asyncio.wait_for(call.read(), 20)
        except grpc.aio.AioRpcError as exc:
            raise ProtocolError(f"the stream failed: {exc.code()}: {exc.details()}") from None
        if answer is grpc.aio.EOF:
            raise ProtocolError("the picker closed the stream before answering")
        assert isinstance(answer, pb.ProcessingResponse)
        return answer

    def _expect(self, answer: pb.ProcessingResponse, kind: str) -> None:
        got = answer.WhichOneof("response")
        if got != kind:
            raise ProtocolError(f"expected an answer to {kind}, got {got}")
