"""``kvgate epp``: the command serves ext_proc and gRPC health, and drains on SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.testing import free_port, wait_until

from ..conftest import worker_fleet
from .conftest import chat
from .envoy import EnvoyLike

KVGATE = str(Path(sys.executable).parent / "kvgate")

pytestmark = pytest.mark.asyncio


async def _port_from_log(proc: asyncio.subprocess.Process) -> int:
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
        assert line, "kvgate epp exited before it listened"
        if found := re.search(r"ext_proc on port (\d+)", line):
            return int(found.group(1))


async def test_kvgate_epp_serves_health_and_picks_then_drains_on_sigterm() -> None:
    async with worker_fleet(1) as fleet:
        proc = await asyncio.create_subprocess_exec(
            KVGATE,
            "epp",
            "--worker",
            fleet[0].url,
            "--port",
            "0",
            "--http-port",
            str(free_port()),
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            port = await _port_from_log(proc)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                request = health_pb2.HealthCheckRequest(service="readiness")

                async def ready() -> bool:  # once the worker's first probe passed
                    answer = await stub.Check(request)
                    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

                await wait_until(ready, timeout=30, message="readiness SERVING")
            client = EnvoyLike(f"127.0.0.1:{port}")
            try:
                result = await client.request(chat("hello"))
            finally:
                await client.close()
            assert result.status == 200 and result.served == fleet[0].url.removeprefix("http://")
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 60) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
