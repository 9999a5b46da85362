"""The slot plane against a small stand-in for llama.cpp's slot API: the failure paths.

The real engine's happy paths are in ``tests/realengine/test_offload.py``. Here a
stand-in server keeps, per slot, the prompt it last served (cached tokens are the
words it shares with the next prompt) and saves/restores slots to files in a
shared folder; it can be told to fail restores or saves, or to hold answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kvgate.core.features import RequestFeatures
from kvgate.core.slotmap import KvTier
from kvgate.gateway.config import ConfigError, parse_config
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.tasks import cancel_and_wait
from kvgate.testing import wait_until


@dataclass
class FakeLlamaCpp:
    """llama.cpp's slot API in miniature (see ``gateway.upstream.slots`` for the real one)."""

    folder: Path
    slots: int = 1
    fail_restore: bool = False
    fail_save: bool = False
    hold: asyncio.Event | None = None
    hold_first_save: asyncio.Event | None = None
    """The first save waits for it, then writes its file (llama.cpp finishes a save whose
    caller went away)."""
    saves: list[str] = field(default_factory=list)
    content: list[list[str]] = field(default_factory=list)
    pinned: list[int] = field(default_factory=list)
    prefill_s: float | None = None
    """Seconds a prompt token, as llama.cpp's ``/metrics`` report it (None: no page)."""
    url: str = ""

    def app(self) -> web.Application:
        self.content = [[] for _ in range(self.slots)]
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/slots", self.list_slots)
        app.router.add_post("/slots/{id}", self.action)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        if self.prefill_s is None:
            return web.Response(status=404)
        return web.Response(
            text="# TYPE llamacpp:prompt_tokens_total counter\n"
            "llamacpp:prompt_tokens_total 1000\n"
            "# TYPE llamacpp:prompt_seconds_total counter\n"
            f"llamacpp:prompt_seconds_total {1000 * self.prefill_s}\n"
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def list_slots(self, request: web.Request) -> web.Response:
        return web.json_response([{"id": i, "is_processing": False} for i in range(self.slots)])

    async def action(self, request: web.Request) -> web.Response:
        slot = int(request.match_info["id"])
        action = request.query["action"]
        body = await request.json()
        if action == "erase":
            self.content[slot] = []
            return web.json_response({"id_slot": slot})
        path = self.folder / body["filename"]
        if action == "save":
            self.saves.append(body["filename"])
            kept = list(self.content[slot])  # the engine takes its tasks in order
            if self.hold_first_save is not None and len(self.saves) == 1:
                with contextlib.suppress(TimeoutError):  # a failing test ends all the same
                    await asyncio.wait_for(self.hold_first_save.wait(), 10)
            if self.fail_save:
                return web.json_response({"error": {"message": "disk full"}}, status=500)
            path.write_text(json.dumps(kept))
            n = len(kept)
            return web.json_response(
                {"n_saved": n, "n_written": 100 * n, "timings": {"save_ms": 1}}
            )
        if self.fail_restore or not path.exists():
            return web.json_response({"error": {"message": "invalid slot file"}}, status=400)
        self.content[slot] = json.loads(path.read_text())
        n = len(self.content[slot])
        return web.json_response({"n_restored": n, "n_read": 100 * n, "timings": {"restore_ms": 1}})

    async def chat(self, request: web.Request) -> web.Response:
        payload = await request.json()
        slot = int(payload["id_slot"])
        self.pinned.append(slot)
        if self.hold is not None:
            await self.hold.wait()
        words = " ".join(m["content"] for m in payload["messages"]).split()
        cached = 0
        for old, new in zip(self.content[slot], words, strict=False):
            if old != new:
                break
            cached += 1
        self.content[slot] = words
        return web.json_response(
            {
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "usage": {
                    "prompt_tokens": len(words),
                    "completion_tokens": 1,
                    "total_tokens": len(words) + 1,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            }
        )


@contextlib.asynccontextmanager
async def serving(fakes: list[FakeLlamaCpp]) -> AsyncIterator[None]:
    runners = []
    try:
        for fake in fakes:
            runner = web.AppRunner(fake.app())
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            runners.append(runner)
        yield
    finally:
        for runner in runners:
            await runner.cleanup()


def _config(fakes: list[FakeLlamaCpp], folder: Path) -> dict[str, Any]:
    return {
        "workers": [{"url": f.url, "engine": "llamacpp"} for f in fakes],
        "health": {"interval_s": 0.1, "timeout_s": 2.0},
        "slots": {"dir": str(folder), "max_saved": 8},
    }


async def _chat(gw: GatewayHandle, session: str, text: str) -> tuple[int, dict[str, Any], str]:
    """(status, body, KV tier header) of one chat through the gateway; the route reason
    ends with the same tier."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            gw.url + "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": text}]},
            headers={"X-Session-ID": session},
        ) as resp,
    ):
        tier = resp.headers.get("X-Kvgate-KV-Tier", "")
        if resp.status == 200:
            assert resp.headers["X-Kvgate-Route-Reason"].endswith("/" + tier)
        return resp.status, await resp.json(), tier


def _metric(gw: GatewayHandle, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in gw.gateway.metrics.registry.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


async def test_failed_restore_falls_back_to_recompute(folder: Path) -> None:
    fake = FakeLlamaCpp(folder)
    async with serving([fake]), running_gateway(_config([fake], folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        assert (await _chat(gw, "a", "alpha beta gamma"))[2] == "recompute"
        assert (await _chat(gw, "b", "delta epsilon"))[2] == "recompute"  # a saved
        status, body, tier = await _chat(gw, "a", "alpha beta gamma again")
        assert (status, tier) == (200, "disk")
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
        assert (await _chat(gw, "b", "delta epsilon more"))[2] == "disk"

        fake.fail_restore = True
        status, body, tier = await _chat(gw, "a", "alpha beta gamma again and again")
        # The client sees an ordinary answer; only the cache was lost.
        assert (status, tier) == (200, "fallback")
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert _metric(gw, "kvgate_slot_recompute_fallbacks_total", step="restore") == 1
        assert _metric(gw, "kvgate_slot_restores_total", result="error") == 1
        assert fake.pinned == [0, 0, 0, 0, 0]


async def test_failed_save_drops_the_kv_but_serves(folder: Path) -> None:
    fake = FakeLlamaCpp(folder, fail_save=True)
    async with serving([fake]), running_gateway(_config([fake], folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        await _chat(gw, "a", "alpha beta")
        assert (await _chat(gw, "b", "gamma"))[:1] == (200,)
        status, _, tier = await _chat(gw, "a", "alpha beta again")
        assert (status, tier) == (200, "recompute")
        assert _metric(gw, "kvgate_slot_saves_total", result="error") == 2
        assert _metric(gw, "kvgate_slot_saved_sessions") == 0


async def test_requests_wait_for_a_slot_and_a_cancelled_one_gives_its_slot_back(
    folder: Path,
) -> None:
    hold = asyncio.Event()
    fake = FakeLlamaCpp(folder, hold=hold)
    async with serving([fake]), running_gateway(_config([fake], folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        first = asyncio.create_task(_chat(gw, "a", "alpha"))
        await wait_until(lambda: len(fake.pinned) == 1, message="first request at the worker")
        # One slot, in use: the second can only get it once the first gives it back.
        second = asyncio.create_task(_chat(gw, "b", "beta"))
        await cancel_and_wait(first)
        await wait_until(lambda: len(fake.pinned) == 2, message="second request got the slot")
        hold.set()
        status, _, tier = await second
        assert status == 200 and tier == "recompute"
        # The cancelled turn left its slot unknown: nothing of ``a`` was saved.
        assert gw.gateway.slots.map.holders(fake.url) == ["b"]


async def test_pressure_offload_saves_idle_slots_and_the_next_worker_restores(
    folder: Path,
) -> None:
    fakes = [FakeLlamaCpp(folder), FakeLlamaCpp(folder)]
    async with serving(fakes), running_gateway(_config(fakes, folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        status, _, _ = await _chat(gw, "a", "alpha beta gamma")
        source = next(w for w in gw.gateway.pool if "a" in gw.gateway.slots.map.holders(w.id))
        plane = gw.gateway.slots
        # What the pressure planner is told moving costs, by tier: a slot is saved and
        # restored, a saved slot only restored, an unknown session recomputed.
        in_slot = plane.move_seconds("a")
        assert in_slot is not None and plane.move_seconds("nobody") is None
        assert await gw.gateway.slots.offload(source, ["a"]) == 1
        on_disk = plane.move_seconds("a")
        assert on_disk is not None and on_disk < in_slot
        # The policy is told the session's prefix (but its new last block) can follow it.
        turn = RequestFeatures("r", "m", session_key="a", prefix_hashes=(1, 2, 3))
        assert plane.annotate(turn).restorable_blocks == 2
        assert plane.annotate(replace(turn, session_key="nobody")).restorable_blocks == 0
        assert gw.gateway.slots.map.holders(source.id) == [None]
        gw.gateway.pressure.set_admin_drain(source, True)
        status, body, tier = await _chat(gw, "a", "alpha beta gamma delta")
        assert (status, tier) == (200, "disk")
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
        other = next(w for w in gw.gateway.pool if w is not source)
        assert gw.gateway.slots.map.holders(other.id) == ["a"]


def test_config_refuses_slot_offload_over_several_processes() -> None:
    workers = [{"url": "http://127.0.0.1:9", "engine": "llamacpp"}]
    redis = {"url": "redis://127.0.0.1:6379/0"}  # several processes need a shared store
    with pytest.raises(ConfigError, match="one process"):
        parse_config({"workers": workers, "listen": {"processes": 2}, "store": redis})
    parsed = parse_config(
        {
            "workers": workers,
            "listen": {"processes": 2},
            "store": redis,
            "slots": {"enabled": False},
        }
    )
    assert parsed.workers[0].engine == "llamacpp"
    with pytest.raises(ConfigError, match="engine"):
        parse_config({"workers": [{"url": "http://127.0.0.1:9", "engine": "vllm-ish"}]})


async def test_a_new_session_takes_the_idle_slot_sharing_its_system_prompt(folder: Path) -> None:
    """As llama.cpp picks a slot itself: a new session goes where its system prompt is
    already computed (its holder saved first), not to an empty slot that computes it again."""
    fake = FakeLlamaCpp(folder, slots=2)
    system = " ".join(f"rule{i}" for i in range(400))

    async def chat(session: str, text: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                gw.url + "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": text},
                    ],
                },
                headers={"X-Session-ID": session},
            ) as resp,
        ):
            body = await resp.json()
            return body["usage"]["prompt_tokens_details"]["cached_tokens"], resp.headers[
                "X-Kvgate-KV-Tier"
            ]

    async with serving([fake]), running_gateway(_config([fake], folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        assert await chat("a", "alpha") == (0, "recompute")
        assert await chat("b", "beta") == (400, "recompute")  # in a's slot: 400 words reused
        assert fake.pinned == [0, 0]
        assert gw.gateway.slots.map.holders(fake.url) == ["b", None]
        assert await chat("a", "alpha gamma") == (401, "disk")  # a restored, to the empty slot
        assert fake.pinned == [0, 0, 1]


async def test_a_cancelled_save_keeps_its_file_until_the_worker_has_written_it(
    folder: Path,
) -> None:
    """A client gone while its slot's holder is saved: llama.cpp writes the file anyway.
    Were its cell freed at once, the next save (here ``x``'s) would take the same file and
    the late write land last — ``x`` restored from ``a``'s KV. The cell stays taken until
    the save returns, which then counts ``a`` as saved."""
    release = asyncio.Event()
    fake = FakeLlamaCpp(folder, slots=2, hold_first_save=release)
    async with serving([fake]):
        config = _config([fake], folder)
        config["slots"]["max_saved"] = 2
        async with running_gateway(config) as gw:
            await wait_until(gw.gateway.ready, message="gateway ready")
            plane = gw.gateway.slots
            assert (await _chat(gw, "a", "alpha one"))[0] == 200
            assert (await _chat(gw, "x", "xray two"))[0] == 200
            assert plane.map.holders(fake.url) == ["a", "x"]
            cut = asyncio.create_task(_chat(gw, "b", "beta"))  # a, least recent, is saved first
            await wait_until(lambda: len(fake.saves) == 1, message="a's save at the worker")
            await cancel_and_wait(cut)
            slot0 = plane.map._slots[fake.url][0]
            await wait_until(lambda: not slot0.busy, message="the cancelled request let go")
            assert (await _chat(gw, "c", "charlie"))[2] == "recompute"  # the empty slot 0
            assert (await _chat(gw, "d", "delta"))[2] == "recompute"  # x saved first
            assert fake.saves == [
                "kvgate-0.bin",
                "kvgate-1.bin",
            ]  # not a's file, still being written
            release.set()
            await wait_until(lambda: plane.map.where("a")[0] is KvTier.DISK, message="a saved")
            status, body, tier = await _chat(gw, "a", "alpha one more")
            assert (status, tier) == (200, "disk")
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


async def test_a_migration_cancelled_during_its_save_keeps_its_file_until_written(
    folder: Path,
) -> None:
    """The same for a migration's save on the old worker: its cell stays taken until the
    save returns, then is freed and its file deleted."""
    release = asyncio.Event()
    fakes = [FakeLlamaCpp(folder), FakeLlamaCpp(folder)]
    async with serving(fakes):
        config = _config(fakes, folder)
        config["slots"]["max_saved"] = 2
        async with running_gateway(config) as gw:
            await wait_until(gw.gateway.ready, message="gateway ready")
            assert (await _chat(gw, "a", "alpha one"))[0] == 200
            source = next(w for w in gw.gateway.pool if "a" in gw.gateway.slots.map.holders(w.id))
            held = next(f for f in fakes if f.url == source.id)
            other = next(f for f in fakes if f is not held)
            held.hold_first_save = release
            gw.gateway.pressure.set_admin_drain(source, True)
            cut = asyncio.create_task(_chat(gw, "a", "alpha one two"))  # migrates: saved there
            await wait_until(lambda: len(held.saves) == 1, message="the migration's save")
            await cancel_and_wait(cut)
            slot = gw.gateway.slots.map._slots[other.url][0]
            await wait_until(lambda: not slot.busy, message="the cancelled request let go")
            assert (await _chat(gw, "x", "xray"))[2] == "recompute"
            assert (await _chat(gw, "y", "yankee"))[2] == "recompute"  # x saved first
            assert held.saves == ["kvgate-0.bin"] and other.saves == ["kvgate-1.bin"]
            release.set()
            free = gw.gateway.slots.map._free_cells
            await wait_until(lambda: free == [0], message="the cell freed once written")
            assert not (folder / "kvgate-0.bin").exists()  # and its file deleted


def _system_chat(gw: GatewayHandle, system: str) -> Any:
    async def chat(session: str, text: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                gw.url + "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": text},
                    ],
                },
                headers={"X-Session-ID": session},
            ) as resp,
        ):
            body = await resp.json()
            cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            return cached, resp.headers["X-Kvgate-KV-Tier"]

    return chat


async def test_a_saved_slot_seeds_a_new_session_on_another_worker(folder: Path) -> None:
    """A new session whose system prompt a saved slot holds has that file restored into
    an empty slot (tier ``shared``): read back, on another worker, not computed again."""
    one, two = FakeLlamaCpp(folder, slots=1), FakeLlamaCpp(folder, slots=2)
    system = " ".join(f"rule{i}" for i in range(400))
    async with (
        serving([one, two]),
        running_gateway({**_config([one, two], folder), "policy": {"name": "round_robin"}}) as gw,
    ):
        await wait_until(gw.gateway.ready, message="gateway ready")
        chat = _system_chat(gw, system)
        assert await chat("a", "alpha") == (0, "recompute")  # one
        assert await chat("b", "beta") == (0, "recompute")  # two, slot 0
        assert await chat("c", "gamma") == (400, "recompute")  # one: a saved first
        # two: b's idle slot shares as much, but a's file is read into the empty slot.
        assert await chat("d", "delta") == (400, "shared")
        assert two.pinned == [0, 1] and len(one.saves) == 1 and len(two.saves) == 0
        assert gw.gateway.slots.map.holders(two.url) == ["b", "d"]
        assert await chat("a", "alpha again") == (401, "disk")  # a's own file, still a's
        assert _metric(gw, "kvgate_slot_turns_total", tier="shared") == 1


@pytest.mark.parametrize("prefill_s", [0.01, 1e-6])
async def test_a_new_session_waits_for_the_slot_computing_its_system_prompt(
    folder: Path, prefill_s: float
) -> None:
    """Two sessions arriving together: the second waits for the slot computing the shared
    system prompt (then takes it, its holder saved) rather than compute it again in the
    empty slot, for at most what computing it would take alongside the request in flight
    (``/metrics``' rate: ~14 s at 10 ms a token; at 1 us a token the wait is not worth it
    and it is not made)."""
    fake = FakeLlamaCpp(folder, slots=2, hold=asyncio.Event(), prefill_s=prefill_s)
    system = " ".join(f"rule{i}" for i in range(400))
    async with serving([fake]), running_gateway(_config([fake], folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        worker = gw.gateway.pool.get(fake.url)
        assert worker is not None
        await wait_until(lambda: worker.signals is not None, message="metrics scraped")
        chat = _system_chat(gw, system)
        first = asyncio.create_task(chat("a", "alpha"))
        await wait_until(lambda: fake.pinned == [0], message="a sent")
        second = asyncio.create_task(chat("b", "beta"))
        if prefill_s > 0.001:
            await asyncio.sleep(0.3)
            assert fake.pinned == [0]  # b waits for the slot computing the system prompt
            fake.hold.set()
            assert await first == (0, "recompute")
            assert await second == (400, "recompute")  # in a's slot, a saved first
            assert fake.pinned == [0, 0] and len(fake.saves) == 1
        else:
            await wait_until(lambda: fake.pinned == [0, 1], message="b sent at once")
            fake.hold.set()
            assert await first == (0, "recompute") and await second == (0, "recompute")


def test_the_share_wait_is_what_computing_the_shared_part_alongside_would_take() -> None:
    from types import SimpleNamespace
    from typing import cast

    from prometheus_client import CollectorRegistry

    from kvgate.gateway.config import SlotSettings
    from kvgate.gateway.control.offload import SlotPlane
    from kvgate.gateway.observe.metrics import SlotMetrics
    from kvgate.gateway.observe.pool import Worker

    plane = SlotPlane(SlotSettings(), SlotMetrics(CollectorRegistry()), wait_limit_s=60.0)
    plane.map.add_worker("w", 4)
    system = tuple(range(100, 120))
    assert plane.map.acquire("w", "a", 0.0, (*system, 1)) is not None

    def worker(rate: float | None) -> Worker:
        signals = SimpleNamespace(prefill_s_per_token=rate)
        return cast(Worker, SimpleNamespace(id="w", signals=signals))

    # 20 of 21 blocks shared: 952 of 1,000 tokens at 10 ms, beside the 1 request in flight.
    wait = plane.share_wait_s(worker(0.01), "b", (*system, 2), 1000)
    assert wait == pytest.approx(20 / 21 * 1000 * 0.01 * 2)
    assert plane.share_wait_s(worker(None), "b", (*system, 2), 1000) == 0.0  # no evidence
    assert plane.share_wait_s(worker(0.01), "b", tuple(range(300, 321)), 1000) == 0.0
    assert plane.share_wait_s(worker(1.0), "b", (*system, 2), 1000) == 60.0  # the limit


def test_annotate_tells_the_policy_what_each_worker_would_give_a_new_session() -> None:
    from prometheus_client import CollectorRegistry

    from kvgate.core.features import request_features
    from kvgate.gateway.config import SlotSettings
    from kvgate.gateway.control.offload import SlotPlane
    from kvgate.gateway.observe.metrics import SlotMetrics
    from kvgate.types import BlockHash, SessionKey

    plane = SlotPlane(SlotSettings(), SlotMetrics(CollectorRegistry()), wait_limit_s=60.0)
    plane.map.add_worker("w1", 2)
    plane.map.add_worker("w2", 2)
    system = tuple(BlockHash(h) for h in range(100, 120))
    computing = plane.map.acquire("w1", SessionKey("a"), 0.0, (*system, BlockHash(1)))
    assert computing is not None
    plane._flights[("w1", computing.place.slot)] = "req-a"  # what ``post`` notes
    b = request_features(
        "b", "m", session_key=SessionKey("b"), prefix_hashes=(*system, 2), prompt_chars=2000
    )
    b = plane.annotate(b)
    assert b.slot_shares == (("w1", 20, "req-a"),) and not b.restorable_blocks
    # The policy's reading: 20 blocks' characters on w1, after req-a; nothing on w2.
    assert b.slot_credit("w1", lambda blocks: 64 * blocks) == (1280, "req-a")
    assert b.slot_credit("w2", lambda blocks: 64 * blocks) == (0, "")
    # A session whose KV the plane holds is restorable everywhere, as before.
    a = request_features("a2", "m", session_key=SessionKey("a"), prefix_hashes=(*system, 1, 2))
    plane.map.release(computing, 1.0, served=True)
    assert plane.annotate(a).restorable_blocks == 21


def test_annotate_tells_the_policy_what_each_worker_computes_of_a_later_turn() -> None:
    """A session's turn's usage on a llama.cpp worker (an attempt's end) says what its slot
    holds: the next turn is told, per worker, the engine tokens it computes there (its slot's
    worker: its new part; elsewhere: the reply too, restored from a save), not a guess from
    the index's 256-character blocks (``core.slot_turns``)."""
    from types import SimpleNamespace
    from typing import cast

    from prometheus_client import CollectorRegistry

    from kvgate.core.attempt import AttemptEnd
    from kvgate.core.features import request_features
    from kvgate.gateway.config import SlotSettings
    from kvgate.gateway.control.offload import SlotPlane
    from kvgate.gateway.observe.metrics import SlotMetrics
    from kvgate.types import BlockHash, SessionKey

    plane = SlotPlane(SlotSettings(), SlotMetrics(CollectorRegistry()), wait_limit_s=60.0)
    plane.map.add_worker("w1", 2)
    plane.map.add_worker("w2", 2)
    key, chain = SessionKey("a"), tuple(BlockHash(h) for h in range(100, 118))
    first = request_features("r1", "m", session_key=key, prefix_hashes=chain, prompt_chars=4_400)
    first = plane.annotate(first)
    assert first.slot_uncached == ()  # no turn seen yet: the policy's own guess stands
    plan = plane.map.acquire("w1", key, 0.0, chain)
    assert plan is not None
    end = SimpleNamespace(worker="w1", prompt_tokens=1_100, cached_tokens=0, completion_tokens=32)
    plane.ended(first, cast(AttemptEnd, end))
    plane.map.release(plan, 1.0, served=True)
    second = request_features(
        "r2", "m", session_key=key, prefix_hashes=(*chain, BlockHash(7)), prompt_chars=4_800
    )
    second = plane.annotate(second)
    assert second.slot_uncached == (("w1", 69, 0.0), ("w2", 100, 0.0))
    assert second.slot_tokens("w1", 5.0) == (69, 0.0) and second.slot_tokens("w3", 5.0) == (
        5.0,
        0.0,
    )
    assert second.restorable_blocks == 18  # as before: restorable everywhere
    # Its usage: 1,200 tokens, 1,100 found (the reply's not reused): 31 more than it was
    # told; once three such turns say so, the next is told that much more.
    plan = plane.map.acquire("w1", key, 2.0, second.prefix_hashes)
    assert plan is not None
    end = SimpleNamespace(
        worker="w1", prompt_tokens=1_200, cached_tokens=1_100, completion_tokens=1
    )
    for _ in range(3):
        plane.ended(second, cast(AttemptEnd, end))
    plane.map.release(plan, 3.0, served=True)
    third = replace(second, request_id="r3", prompt_chars=5_200)
    assert plane.annotate(third).slot_uncached == (("w1", 100 + 31, 0.0), ("w2", 100 + 31, 0.0))


def test_a_turn_whose_kv_is_being_saved_is_told_it_will_be_restored() -> None:
    """Its slot was just taken by another session: its KV is on its way to disk, and the
    turn waits for the save, then restores it (``SlotMap.acquire``). Told it finds none,
    it was booked at its whole prompt (1,277 tokens; 75 computed)."""
    from types import SimpleNamespace
    from typing import cast

    from prometheus_client import CollectorRegistry

    from kvgate.core.attempt import AttemptEnd
    from kvgate.core.features import request_features
    from kvgate.gateway.config import SlotSettings
    from kvgate.gateway.control.offload import SlotPlane
    from kvgate.gateway.observe.metrics import SlotMetrics
    from kvgate.types import BlockHash, SessionKey

    plane = SlotPlane(SlotSettings(), SlotMetrics(CollectorRegistry()), wait_limit_s=60.0)
    plane.map.add_worker("w1", 1)
    key, chain = SessionKey("a"), tuple(BlockHash(h) for h in range(100, 118))
    first = request_features("r1", "m", session_key=key, prefix_hashes=chain, prompt_chars=4_400)
    plan = plane.map.acquire("w1", key, 0.0, chain)
    assert plan is not None
    end = SimpleNamespace(worker="w1", prompt_tokens=1_100, cached_tokens=0, completion_tokens=32)
    plane.ended(first, cast(AttemptEnd, end))
    plane.map.release(plan, 1.0, served=True)
    other = plane.map.acquire("w1", SessionKey("b"), 2.0, tuple(BlockHash(h) for h in range(9)))
    assert other is not None and other.evict == key  # a's save under way
    second = request_features(
        "r2", "m", session_key=key, prefix_hashes=(*chain, BlockHash(7)), prompt_chars=4_800
    )
    second = plane.annotate(second)
    assert second.slot_uncached == (("w1", 100, 0.0),) and second.restorable_blocks == 18


async def test_the_plane_measures_how_long_it_takes_before_a_turn_is_sent(folder: Path) -> None:
    """A session restored from disk waits for the restore before its turn is sent: the
    plane measures it (``SlotTurns.prepared``), so the next turn so placed is told it."""
    fake = FakeLlamaCpp(folder, slots=1)
    async with serving([fake]), running_gateway(_config([fake], folder)) as gw:
        await wait_until(gw.gateway.ready, message="gateway ready")
        turns = gw.gateway.slots.turns
        assert (await _chat(gw, "a", "alpha"))[2] == "recompute"
        assert (await _chat(gw, "b", "beta"))[2] == "recompute"  # a saved first
        assert turns.setup[2] > 0.0 and turns.setup[1] == 0.0
        assert (await _chat(gw, "a", "alpha gamma"))[2] == "disk"
        assert turns.setup[1] > 0.0  # the restore's time, measured
