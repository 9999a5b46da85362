"""The endpoint picker protocol's messages: what the picker reads of Envoy's ext_proc
requests (headers, the subset hint and the served endpoint in the metadata context) and
the answers it builds (the destination as a header and as ``envoy.lb`` metadata,
immediate responses, bodies streamed back in full-duplex mode). ``extproc`` holds a
stream's state; this module only the shapes, names as the Gateway API Inference
Extension's protocol spells them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct
from multidict import CIMultiDict

from kvgate.gateway.dataplane.errors import GatewayError

DESTINATION = "x-gateway-destination-endpoint"
"""The header, and the ``envoy.lb`` metadata key, naming the picked endpoint(s)."""
SERVED = "x-gateway-destination-endpoint-served"
"""The ``envoy.lb`` metadata key, in the response's metadata context: who served."""
SUBSET = "x-gateway-destination-endpoint-subset"
"""The key, under ``envoy.lb.subset_hint``, of the endpoints the picker must pick from."""
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
REQUEST_ID = "x-request-id"


def header(key: str, value: str) -> HeaderValueOption:
    """A header to set, its value as raw bytes (what current Envoys read)."""
    return HeaderValueOption(header=HeaderValue(key=key, raw_value=value.encode()))


def metadata(value: str) -> Struct:
    """The dynamic metadata naming the picked endpoint(s) under ``envoy.lb``."""
    found = Struct()
    found.update({LB_NAMESPACE: {DESTINATION: value}})
    return found


def immediate(error: GatewayError) -> pb.ProcessingResponse:
    """``error`` as an immediate response: Envoy answers the client with it, no upstream."""
    headers = [header("content-type", "application/json")]
    headers += [header(name.lower(), value) for name, value in error.headers.items()]
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=HttpStatus(code=error.status),
            headers=pb.HeaderMutation(set_headers=headers),
            body=error.body(),
            details=error.code or error.type,
        )
    )


def headers_of(message: pb.HttpHeaders) -> CIMultiDict[str]:
    """A message's headers, case-insensitive (``raw_value`` or, from older Envoys, ``value``)."""
    found: CIMultiDict[str] = CIMultiDict()
    for h in message.headers.headers:
        found.add(h.key, h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
    return found


def filter_metadata(request: pb.ProcessingRequest, namespace: str) -> Mapping[str, Any] | None:
    """One namespace of the request's metadata context as plain values (``None``: absent)."""
    if not request.HasField("metadata_context"):
        return None
    found = request.metadata_context.filter_metadata.get(namespace)
    return None if found is None else _plain(found)


def _plain(struct: Struct) -> dict[str, Any]:
    return {key: _value(value) for key, value in struct.fields.items()}


def _value(value: Any) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [_value(v) for v in value.list_value.values]
    if kind == "struct_value":
        return _plain(value.struct_value)
    return None


def endpoints_in(raw: Any) -> list[str] | None:
    """The endpoints a metadata value names (a list, or a comma-separated string)."""
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, list):
        return [str(part).strip() for part in raw if isinstance(part, str)]
    return None


def streamed_body(data: bytes, last: bool) -> pb.BodyResponse:
    """A body chunk sent back in full-duplex mode (``last``: it ends the body)."""
    streamed = pb.StreamedBodyResponse(body=data, end_of_stream=last)
    mutation = pb.BodyMutation(streamed_response=streamed)
    return pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))


def streamed_request(data: bytes, last: bool) -> pb.ProcessingResponse:
    """The answer carrying a request body chunk back in full-duplex mode."""
    return pb.ProcessingResponse(request_body=streamed_body(data, last))
