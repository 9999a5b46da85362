"""``kvgate serve`` as a process: the drain deadline, SIGHUP, a port already in use."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
import time
from pathlib import Path

import aiohttp
import yaml

from .fake_worker import fake_workers

KVGATE = str(Path(sys.executable).parent / "kvgate")


async def _listening_url(stderr: asyncio.StreamReader, seen: list[bytes]) -> str:
    while line := await stderr.readline():
        seen.append(line)
        if found := re.search(rb"listening on (http://\S+)", line):
            return found.group(1).decode()
    raise AssertionError(f"the gateway exited before it was listening: {b''.join(seen)!r}")


async def _start(config: dict[str, object], tmp_path: Path) -> asyncio.subprocess.Process:
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(config))
    return await asyncio.create_subprocess_exec(
        KVGATE, "serve", "--config", str(path),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


async def test_the_drain_deadline_is_kept_and_a_cut_drain_exits_non_zero(tmp_path: Path) -> None:
    async with fake_workers(1) as (fake,):
        config = {
            "listen": {"port": 0},
            "workers": [{"url": fake.url, "model": "demo"}],
            "drain_timeout_s": 1.0,
        }
        proc = await _start(config, tmp_path)
        seen: list[bytes] = []
        try:
            assert proc.stderr is not None
            base = await asyncio.wait_for(_listening_url(proc.stderr, seen), 20)
            rest = asyncio.create_task(proc.stderr.read())
            async with aiohttp.ClientSession() as session:
                body = {"model": "demo", "prompt": "mode:slow_stream", "stream": True}
                stream = await session.post(base + "/v1/completions", json=body)
                assert stream.status == 200
                assert (await stream.content.readline()).startswith(b"data:")
                proc.send_signal(signal.SIGTERM)
                signalled = time.monotonic()
                status = await asyncio.wait_for(proc.wait(), 15)
                took = time.monotonic() - signalled
                stream.close()
            await rest
        finally:
            await _stop(proc)
    assert status == 3  # DRAIN_CUT_SHORT: requests were cut at the deadline
    assert took < 4.0, f"exited {took:.1f}s after SIGTERM with a 1s drain deadline"


async def test_sighup_does_not_kill_the_gateway(tmp_path: Path) -> None:
    async with fake_workers(1) as (fake,):
        config = {"listen": {"port": 0}, "workers": [{"url": fake.url, "model": "demo"}]}
        proc = await _start(config, tmp_path)
        seen: list[bytes] = []
        try:
            assert proc.stderr is not None
            base = await asyncio.wait_for(_listening_url(proc.stderr, seen), 20)
            proc.send_signal(signal.SIGHUP)
            line = await asyncio.wait_for(proc.stderr.readline(), 10)
            assert b"SIGHUP" in line
            async with aiohttp.ClientSession() as session, session.get(base + "/healthz") as resp:
                assert resp.status == 200
            assert proc.returncode is None
            rest = asyncio.create_task(proc.stderr.read())
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 15) == 0
            await rest
        finally:
            await _stop(proc)


async def test_a_port_in_use_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = {
            "listen": {"port": port},
            "workers": [{"url": "http://127.0.0.1:9", "model": "demo"}],
        }
        proc = await _start(config, tmp_path)
        try:
            assert proc.stderr is not None
            err = await asyncio.wait_for(proc.stderr.read(), 30)
            status = await asyncio.wait_for(proc.wait(), 10)
        finally:
            await _stop(proc)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert status == 2
    assert "Traceback" not in err.decode()
    assert any("cannot listen" in line and str(port) in line for line in lines), lines
    assert len([line for line in lines if "ERROR" in line or "kvgate serve" in line]) <= 2, lines
