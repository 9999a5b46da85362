"""Two gateway replicas on one Redis share llama.cpp workers and their save folder.

Each pins only its share of the slots and writes its own files, so every turn
restored from disk finds its own KV (issue 45: both wrote ``kvgate-0..N.bin`` and
half the "restored" turns had nothing cached); a replica with no share left
refuses to start; a slot or restore the worker then reports empty is counted, not
reported as served, and the worker's slots are learned again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kvgate.gateway.config import ConfigError
from kvgate.gateway.control import slotclaim
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import free_port, wait_until
from kvgate.testing_redis import RedisServer, find_redis_server
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker

from .test_slot_offload_emulated import Conversation, Turn, _metric, emulated_fleet

pytestmark = pytest.mark.skipif(find_redis_server() is None, reason="redis-server not installed")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def _config(workers: list[WorkerHandle], folder: Path, redis: str, **slots: Any) -> dict[str, Any]:
    return {
        "workers": [{"url": w.url, "engine": "llamacpp"} for w in workers],
        "policy": {"name": "default"},
        "health": {"interval_s": 0.2, "timeout_s": 2.0},
        "store": {"url": redis, "timeout_s": 1.0, "connect_timeout_s": 1.0},
        "slots": {"dir": str(folder), "max_saved": 8, **slots},
        "expose_worker_urls": True,
        "listen": {"processes": 1},
    }


@contextlib.asynccontextmanager
async def _replicas(config: dict[str, Any], count: int) -> AsyncIterator[list[GatewayHandle]]:
    async with contextlib.AsyncExitStack() as stack:
        gateways = [await stack.enter_async_context(running_gateway(config)) for _ in range(count)]
        for gw in gateways:
            await wait_until(gw.gateway.ready, timeout=30, message="gateway ready")
        yield gateways


async def test_two_replicas_restore_only_their_own_sessions(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    async with emulated_fleet(folder, 2, slots=2) as workers:
        config = _config(workers, folder, redis_server.url, replicas=2)
        async with _replicas(config, 2) as gateways, aiohttp.ClientSession() as http:
            # Three sessions per replica, one slot per worker each: slots are reused,
            # their holders saved to disk and restored on the sessions' next turns.
            talks = [
                Conversation(http, gw.url, f"r{r}s{i}", 10 * r + i)
                for r, gw in enumerate(gateways)
                for i in range(3)
            ]
            turns: list[Turn] = []
            for round_ in range(4):
                for talk in talks:
                    turns.append(await talk.turn(None if round_ == 0 else f"question {round_}"))
            restored = [t for t in turns if t.tier == "disk"]
            assert {t.session[:2] for t in restored} == {"r0", "r1"}, turns
            for turn in restored:
                assert turn.cached_tokens > 0, turn
            for gw in gateways:
                assert _metric(gw, "kvgate_slot_restores_total", result="empty") == 0
            claims = sorted(gw.gateway.slots.claim.index for gw in gateways)  # type: ignore[union-attr]
            assert claims == [0, 1]
        names = {p.name for p in folder.glob("kvgate-*.bin")}
        assert names and all(n.startswith(("kvgate-r0-", "kvgate-r1-")) for n in names), names


async def test_a_replica_without_a_share_refuses_to_start(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slotclaim, "LEASE_S", 0.5)  # the second waits one lease time
    folder = tmp_path / "slots"
    folder.mkdir()
    async with emulated_fleet(folder, 1) as workers:
        config = _config(workers, folder, redis_server.url)  # replicas: 1, both on one prefix
        async with running_gateway(config) as first:
            assert first.gateway.slots.claim is not None
            assert first.gateway.slots.claim.index == 0
            with pytest.raises(ConfigError, match=r"slots\.replicas"):
                second = dict(config, slots=dict(config["slots"], file_prefix="kvgate"))
                async with running_gateway(second):
                    pass


async def test_an_emptied_slot_is_counted_and_relearned(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    async with emulated_fleet(folder, 1) as workers:
        config = _config(workers, folder, redis_server.url)
        async with running_gateway(config) as gw, aiohttp.ClientSession() as http:
            await wait_until(gw.gateway.ready, timeout=30, message="gateway ready")
            talk = Conversation(http, gw.url, "s", 1)
            await talk.turn()
            # The worker loses its slot's KV behind the gateway's back (as a restart would).
            async with http.post(workers[0].url + "/slots/0?action=erase") as resp:
                assert resp.status == 200
            emptied = await talk.turn("again")
            assert emptied.tier == "slot" and emptied.cached_tokens == 0
            assert _metric(gw, "kvgate_slot_recompute_fallbacks_total", step="verify") == 1
            assert not gw.gateway.slots.map.manages(workers[0].url)
            after = await talk.turn("and again")  # the slots learned anew, then kept
            assert after.tier == "recompute"
            assert (await talk.turn("once more")).cached_tokens > 0


async def test_a_restarted_worker_has_its_slots_learned_again(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    options = WorkerOptions(
        port=free_port(), profile="cpu-small", time_scale=200.0, slots=1, slot_save_path=str(folder)
    )
    worker_cm = running_worker(options)
    worker = await worker_cm.__aenter__()
    try:
        config = _config([worker], folder, redis_server.url)
        config["health"] = {"interval_s": 0.05, "timeout_s": 1.0, "fall": 1, "rise": 1}
        async with running_gateway(config) as gw, aiohttp.ClientSession() as http:
            await wait_until(gw.gateway.ready, timeout=30, message="gateway ready")
            talk = Conversation(http, gw.url, "s", 1)
            await talk.turn()
            assert gw.gateway.slots.map.holders(worker.url) == ["s"]
            await worker_cm.__aexit__(None, None, None)
            await wait_until(lambda: not gw.gateway.ready(), message="seen down")
            worker_cm = running_worker(options)  # the same address, empty slots
            worker = await worker_cm.__aenter__()
            await wait_until(gw.gateway.ready, timeout=30, message="seen up again")
            assert not gw.gateway.slots.map.manages(worker.url)
            turn = await talk.turn("after the restart")
            assert turn.tier == "recompute", turn  # not "slot" with nothing cached
            assert _metric(gw, "kvgate_slot_recompute_fallbacks_total", step="verify") == 0
    finally:
        await worker_cm.__aexit__(None, None, None)
