"""``POST /admin/reload`` with ``--processes 2`` reaches both processes, or says which not.

Issue 45.7: the reload changed only the process that took the connection, so a new
alias worked on some requests only and a rotated-out admin token was still accepted
by the other process. Each check below opens a new connection per request, which
the kernel spreads over the processes (``SO_REUSEPORT``).
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kvgate.testing import free_port
from kvgate.testing_redis import RedisServer

from .fake_worker import fake_workers

KVGATE = str(Path(sys.executable).parent / "kvgate")
TRIES = 24


def _write(path: Path, config: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(config))


async def _status(method: str, url: str, token: str, body: Any = None) -> int:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as session,  # a new connection: any process may take it
        session.request(method, url, json=body, headers=headers) as resp,
    ):
        await resp.read()
        return resp.status


async def _statuses(method: str, url: str, token: str, body: Any = None) -> list[int]:
    return [await _status(method, url, token, body) for _ in range(TRIES)]


async def test_a_rotated_admin_token_and_a_new_alias_hold_in_every_process(
    tmp_path: Path,
) -> None:
    with RedisServer() as redis:
        async with fake_workers(1) as (fake,):
            port = free_port()
            config: dict[str, Any] = {
                "listen": {"port": port, "processes": 2},
                "workers": [{"url": fake.url, "model": "demo"}],
                "store": {"url": redis.url},
                "admin_token": "old-token",
                "drain_timeout_s": 2.0,
            }
            path = tmp_path / "kvgate.yaml"
            _write(path, config)
            proc = await asyncio.create_subprocess_exec(
                KVGATE, "serve", "--config", str(path),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                await _check(proc, port, path, config)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


async def _check(
    proc: asyncio.subprocess.Process, port: int, path: Path, config: dict[str, Any]
) -> None:
    assert proc.stderr is not None
    listening = 0
    while listening < 2:
        line = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert line, "the gateway exited before both processes listened"
        listening += bool(re.search(rb"gateway process \d .* listening", line))
    rest = asyncio.create_task(proc.stderr.read())
    base = f"http://127.0.0.1:{port}"
    models = base + "/admin/models"
    assert set(await _statuses("GET", models, "old-token")) == {200}

    # A key that needs a restart: refused, and nothing changes in either process.
    _write(path, {**config, "admin_token": "x", "limits": {"max_headers": 64}})
    assert await _status("POST", base + "/admin/reload", "old-token") == 409
    assert set(await _statuses("GET", models, "old-token")) == {200}

    # Rotate the token and add an alias: both processes reload, and say so.
    _write(path, {**config, "admin_token": "new-token", "model_aliases": {"gpt-x": "demo"}})
    headers = {"Authorization": "Bearer old-token"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + "/admin/reload", headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    assert {"admin_token", "model_aliases"} <= set(answer["changed"])

    assert set(await _statuses("GET", models, "old-token")) == {401}
    assert set(await _statuses("GET", models, "new-token")) == {200}
    body = {"model": "gpt-x", "prompt": "hello"}
    completions = await _statuses("POST", base + "/v1/completions", "new-token", body)
    assert set(completions) == {200}
    assert sorted(p["process"] for p in answer["processes"]) == [0, 1]
    assert {p["status"] for p in answer["processes"]} == {"reloaded"}

    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 20) == 0
    await rest
