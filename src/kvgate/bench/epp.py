"""What the endpoint picker costs: CPU per decision and the latency it adds, over loopback gRPC.

Starts two emulated workers (``kvgate worker-sim``; they only see the picker's
probes and scrapes), the picker (``kvgate epp``) and, for comparison, the
built-in proxy (``kvgate serve``) on the same workers, each in its own process.
A client then plays Envoy's ext_proc filter in full-duplex mode for each request
(the headers and body, the decision with the body streamed back, the response
headers with the endpoint that served, one response body chunk holding the
usage, the end), without moving the bytes itself: the picker's own work only.

- **CPU per request and per decision**: the picker process's CPU time
  (``/proc/<pid>/stat``) over a concurrent phase, divided by its streams: whole
  requests (the response messages feed the same accounting), then request phases
  only (the stream ends after the decision, as when Envoy gives up on the request).
- **Added latency**: from the first request message to the decision, one request
  at a time (p50, p99): what Envoy waits before it can forward. The response
  messages' round trips are given too (in full-duplex mode Envoy waits for each).
- **The built-in proxy's CPU per request**: the same number of small
  non-streaming requests through ``kvgate serve``, concurrently.
- **The floor**: the same streams against a grpc.aio server that answers with fixed
  messages (``bench.extproc_floor``): what the transport costs before any decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.bench.processes import cpu_seconds, free_port, running

KVGATE = str(Path(sys.executable).parent / "kvgate")
_USAGE_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {
            "prompt_tokens": 40,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 32},
        },
    }
).encode()


@dataclass(frozen=True, slots=True)
class EppBenchResult:
    """The measured figures (milliseconds)."""

    requests: int
    concurrency: int
    picker_cpu_ms_per_request: float
    picker_cpu_ms_per_decision: float
    """The request phase only (headers and body in, the decision and the body out; the
    stream then ends, so the slot is given back as on a cancellation)."""
    decisions_per_cpu_second: float
    decision_p50_ms: float
    decision_p99_ms: float
    response_round_trips_p50_ms: float
    proxy_cpu_ms_per_request: float
    floor_cpu_ms_per_request: float
    """The same streams against a server that decides nothing (``bench.extproc_floor``)."""
    floor_decision_p50_ms: float
    errors: int

    def table(self) -> str:
        """The figures as the lines ``epp_bench.py`` prints."""
        rows = [
            ("picker CPU per request (decision + response feed)", self.picker_cpu_ms_per_request),
            ("picker CPU per decision (the request phase only)", self.picker_cpu_ms_per_decision),
            ("picker decisions per CPU-second (request phase)", self.decisions_per_cpu_second),
            ("added latency p50 (to the decision)", self.decision_p50_ms),
            ("added latency p99 (to the decision)", self.decision_p99_ms),
            (
                "response messages' round trips p50 (headers + 1 chunk)",
                self.response_round_trips_p50_ms,
            ),
            ("built-in proxy CPU per request", self.proxy_cpu_ms_per_request),
            ("floor: gRPC server deciding nothing, CPU per request", self.floor_cpu_ms_per_request),
            ("floor: its latency p50 to the 'decision'", self.floor_decision_p50_ms),
        ]
        lines = [f"{name:<58}{value:>10.3f}" for name, value in rows]
        counts = f"{self.requests} {self.concurrency} {self.errors}"
        lines.append(f"{'requests, concurrency, errors':<58}{counts:>10}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@contextlib.contextmanager
def _floor(port: int) -> Iterator[subprocess.Popen[bytes]]:
    args = [sys.executable, "-m", "kvgate.bench.extproc_floor", str(port)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "up"
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def _body(n: int) -> bytes:
    system = "You are a helpful assistant. " * 8
    return json.dumps(
        {
            "model": "demo",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question number {n}: what is {n} plus {n}?"},
            ],
            "max_tokens": 4,
        }
    ).encode()


class _Client:
    """Plays Envoy's ext_proc filter (full-duplex) against the picker; times each step."""

    def __init__(self, target: str) -> None:
        import grpc
        from envoy.service.ext_proc.v3.external_processor_pb2_grpc import ExternalProcessorStub

        self.grpc = grpc
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = ExternalProcessorStub(self.channel)
        self.errors = 0

    async def one(self, n: int, respond: bool = True) -> tuple[float, float]:
        """One request's stream: (seconds to the decision, seconds of the response messages).
        ``respond=False``: the stream ends after the decision (the request phase only)."""
        from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
        from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
        from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
        from google.protobuf.struct_pb2 import Struct

        def headers(pairs: dict[str, str], end: bool) -> pb.HttpHeaders:
            values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
            return pb.HttpHeaders(headers=HeaderMap(headers=values), end_of_stream=end)

        duplex = ProcessingMode.FULL_DUPLEX_STREAMED
        call = self.stub.Process()
        started = time.perf_counter()
        await call.write(
            pb.ProcessingRequest(
                request_headers=headers(
                    {
                        ":method": "POST",
                        ":path": "/v1/chat/completions",
                        "x-session-id": f"u{n % 64}",
                    },
                    False,
                ),
                protocol_config=pb.ProtocolConfiguration(
                    request_body_mode=duplex, response_body_mode=duplex
                ),
            )
        )
        await call.write(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=_body(n), end_of_stream=True))
        )
        decision = await call.read()
        decided = time.perf_counter()
        if decision.HasField("immediate_response"):
            self.errors += 1
            call.cancel()
            return decided - started, 0.0
        await call.read()  # the body, streamed back
        if not respond:
            await call.done_writing()
            await call.read()
            return decided - started, 0.0
        endpoint = (
            decision.dynamic_metadata.fields["envoy.lb"]
            .struct_value.fields["x-gateway-destination-endpoint"]
            .string_value.split(",")[0]
        )
        served = Struct()
        served.update({"x-gateway-destination-endpoint-served": endpoint})
        begun = time.perf_counter()
        await call.write(
            pb.ProcessingRequest(
                response_headers=headers(
                    {":status": "200", "content-type": "application/json"}, False
                ),
                metadata_context=Metadata(filter_metadata={"envoy.lb": served}),
            )
        )
        await call.read()
        await call.write(
            pb.ProcessingRequest(response_body=pb.HttpBody(body=_USAGE_BODY, end_of_stream=True))
        )
        await call.read()
        await call.done_writing()
        await call.read()
        return decided - started, time.perf_counter() - begun

    async def close(self) -> None:
        await self.channel.close()


async def _drive_picker(
    target: str, pid: int, requests: int, concurrency: int, sequential: int
) -> tuple[list[float], list[float], float, float, int]:
    """Sequential streams (timed), then concurrent ones (the server's CPU over them):
    whole requests, then the request phase only. Returns the decision and response
    times, the CPU of a whole request and of a request phase, and the errors."""
    client = _Client(target)
    try:
        for n in range(50):  # warm up: connections, caches, the first scrapes
            await client.one(n)
        decisions, responses = [], []
        for n in range(sequential):
            decision, response = await client.one(1000 + n)
            decisions.append(decision)
            responses.append(response)
        cpu = []
        for respond in (True, False):
            queue = list(range(requests))

            async def loop(queue: list[int] = queue, respond: bool = respond) -> None:
                while queue:
                    await client.one(100_000 + queue.pop(), respond)

            before = cpu_seconds(pid)
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            cpu.append(cpu_seconds(pid) - before)
        return decisions, responses, cpu[0], cpu[1], client.errors
    finally:
        await client.close()


async def _drive_proxy(url: str, pid: int, requests: int, concurrency: int) -> float:
    async with aiohttp.ClientSession() as session:

        async def one(n: int) -> None:
            async with session.post(url + "/v1/chat/completions", data=_body(n)) as resp:
                await resp.read()

        for n in range(50):
            await one(n)
        queue = list(range(requests))

        async def loop() -> None:
            while queue:
                await one(100_000 + queue.pop())

        before = cpu_seconds(pid)
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        return cpu_seconds(pid) - before


def run(requests: int = 2000, concurrency: int = 8, sequential: int = 500) -> EppBenchResult:
    """Start the workers, the picker and the proxy; measure both (see the module docs)."""
    with contextlib.ExitStack() as stack:
        urls = []
        for seed in range(2):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            args = [KVGATE, "worker-sim", "--port", str(port), "--model", "demo"]
            args += ["--profile", "fast", "--time-scale", "1000", "--seed", str(seed)]
            stack.enter_context(running(args, url + "/health"))
            urls.append(url)
        workers = [a for url in urls for a in ("--worker", url)]
        grpc_port, http_port = free_port(), free_port()
        picker = stack.enter_context(
            running(
                [KVGATE, "epp", *workers, "--port", str(grpc_port), "--http-port", str(http_port)],
                f"http://127.0.0.1:{http_port}/readyz",
            )
        )
        decisions, responses, cpu, decide_cpu, errors = asyncio.run(
            _drive_picker(f"127.0.0.1:{grpc_port}", picker.pid, requests, concurrency, sequential)
        )
        proxy_port = free_port()
        proxy = stack.enter_context(
            running(
                [KVGATE, "serve", *workers, "--port", str(proxy_port)],
                f"http://127.0.0.1:{proxy_port}/readyz",
            )
        )
        proxy_cpu = asyncio.run(
            _drive_proxy(f"http://127.0.0.1:{proxy_port}", proxy.pid, requests, concurrency)
        )
        floor_port = free_port()
        floor = stack.enter_context(_floor(floor_port))
        floor_decisions, _, floor_cpu, _, _ = asyncio.run(
            _drive_picker(f"127.0.0.1:{floor_port}", floor.pid, requests, concurrency, sequential)
        )
    decisions.sort()
    return EppBenchResult(
        requests=requests,
        concurrency=concurrency,
        picker_cpu_ms_per_request=1000 * cpu / requests,
        picker_cpu_ms_per_decision=1000 * decide_cpu / requests,
        decisions_per_cpu_second=requests / max(decide_cpu, 1e-9),
        decision_p50_ms=1000 * statistics.median(decisions),
        decision_p99_ms=1000 * decisions[int(0.99 * (len(decisions) - 1))],
        response_round_trips_p50_ms=1000 * statistics.median(responses),
        proxy_cpu_ms_per_request=1000 * proxy_cpu / requests,
        floor_cpu_ms_per_request=1000 * floor_cpu / requests,
        floor_decision_p50_ms=1000 * statistics.median(floor_decisions),
        errors=errors,
    )
