"""The floor of an ext_proc picker in this Python: a server that decides nothing.

It answers the message pattern ``kvgate.bench.epp`` drives (full-duplex headers and
body; the decision and the body streamed back; response headers; one response
chunk) with fixed answers, on the same grpc.aio server as ``kvgate epp``. Its CPU
per request is what the gRPC transport costs before any routing:

    python -m kvgate.bench.extproc_floor PORT
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3.external_processor_pb2_grpc import (
    ExternalProcessorServicer,
    add_ExternalProcessorServicer_to_server,
)
from google.protobuf.struct_pb2 import Struct

_KEY = "x-gateway-destination-endpoint"


def _echo(data: bytes) -> pb.BodyResponse:
    streamed = pb.StreamedBodyResponse(body=data, end_of_stream=True)
    mutation = pb.BodyMutation(streamed_response=streamed)
    return pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))


class FloorServicer(ExternalProcessorServicer):  # type: ignore[misc]
    """Fixed answers in the protocol's order: no parsing, no routing, no accounting."""

    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802 (gRPC's name)
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            kind = message.WhichOneof("request")
            if kind == "request_body":
                metadata = Struct()
                metadata.update({"envoy.lb": {_KEY: "127.0.0.1:1"}})
                header = HeaderValueOption(header=HeaderValue(key=_KEY, raw_value=b"127.0.0.1:1"))
                common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[header]))
                headers = pb.HeadersResponse(response=common)
                await context.write(
                    pb.ProcessingResponse(request_headers=headers, dynamic_metadata=metadata)
                )
                body = _echo(message.request_body.body)
                await context.write(pb.ProcessingResponse(request_body=body))
            elif kind == "response_headers":
                await context.write(pb.ProcessingResponse(response_headers=pb.HeadersResponse()))
            elif kind == "response_body":
                body = _echo(message.response_body.body)
                await context.write(pb.ProcessingResponse(response_body=body))
                return


async def serve(port: int) -> None:
    """Serve on ``127.0.0.1:port`` until killed; prints ``up`` once listening."""
    server = grpc.aio.server()
    add_ExternalProcessorServicer_to_server(FloorServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("up", flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
