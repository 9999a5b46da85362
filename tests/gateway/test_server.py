"""``kvgate serve`` as a real process: SIGTERM drains in-flight streams, then exits 0."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path

import aiohttp

from kvgate.testing import wait_until
from kvgate.workersim import WorkerOptions, running_worker

KVGATE = str(Path(sys.executable).parent / "kvgate")


async def _status(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url) as resp:
            return resp.status
    except aiohttp.ClientError:
        return 0


async def _listening_url(stderr: asyncio.StreamReader) -> str:
    """The gateway's URL from its "listening on" log line (it picked a free port)."""
    while line := await stderr.readline():
        if found := re.search(rb"listening on (http://\S+)", line):
            return found.group(1).decode()
    raise AssertionError("the gateway exited before it was listening")


async def test_sigterm_drains_streams_refuses_new_requests_and_exits_zero() -> None:
    # The default profile in real time: a 200-token stream lasts most of a second.
    async with running_worker(WorkerOptions(port=0, time_scale=1.0)) as worker:
        # Port 0, not a port found free beforehand: the readiness probes' own
        # connections could take that one before the process has bound it.
        proc = await asyncio.create_subprocess_exec(
            KVGATE, "serve", "--worker", worker.url, "--port", "0",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        drain: asyncio.Task[bytes] | None = None
        try:
            assert proc.stderr is not None
            base = await asyncio.wait_for(_listening_url(proc.stderr), 20)
            # Keep reading so the gateway never blocks on a full pipe.
            drain = asyncio.create_task(proc.stderr.read())
            async with aiohttp.ClientSession() as session:

                async def ready() -> bool:
                    return await _status(session, base + "/readyz") == 200

                await wait_until(ready, timeout=20, message="gateway ready")
                body = {"model": "demo", "prompt": "a story", "max_tokens": 200, "stream": True}
                stream = await session.post(base + "/v1/completions", json=body)
                assert stream.status == 200
                first = await stream.content.readline()
                assert first.startswith(b"data:")

                proc.send_signal(signal.SIGTERM)

                async def draining() -> bool:
                    return await _status(session, base + "/readyz") == 503

                await wait_until(draining, message="readiness false")
                async with session.post(base + "/v1/completions", json={**body}) as refused:
                    assert refused.status == 503
                    assert (await refused.json())["error"]["code"] == "draining"

                rest = await stream.content.read()
                stream.release()
                assert rest.rstrip().endswith(b"data: [DONE]")
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if drain is not None:
                await drain
