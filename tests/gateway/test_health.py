"""Active probes, scraped signals with their age, and passive outlier ejection."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web

from kvgate.core.fleet import Health, WorkerState
from kvgate.core.slotmap import MAX_SLOTS
from kvgate.gateway.config import WorkerConfig
from kvgate.gateway.observe.pool import Worker
from kvgate.gateway.observe.scrape import WorkerSignals
from kvgate.gateway.testing import running_gateway
from kvgate.gateway.upstream.transport import Timeouts, Upstream
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config, set_faults, worker_fleet


def _worker() -> Worker:
    config = WorkerConfig(url="http://127.0.0.1:1", model="m")
    return Worker(config, Upstream(config.url, Timeouts(1, 1, 1)))


def test_stale_signals_count_as_unknown_not_as_good() -> None:
    worker = _worker()
    worker.update(
        probe_ok=True, signals=WorkerSignals(running=3, waiting=1, kv_usage=0.5), signals_at=100.0
    )
    fresh = worker.state(now=101.0, stale_after=3.0)
    stale = worker.state(now=110.0, stale_after=3.0)
    assert fresh.health is Health.HEALTHY and fresh.kv_usage == 0.5 and fresh.waiting == 1
    assert stale.health is Health.DEGRADED
    assert stale.kv_usage is None and stale.waiting is None and stale.running is None


def test_a_worker_never_probed_or_ejected_takes_no_traffic() -> None:
    worker = _worker()
    assert not worker.state(0.0, 3.0).routable
    worker.update(probe_ok=True)
    worker.update(ejected=True)
    assert worker.state(0.0, 3.0).health is Health.EJECTED


async def test_probes_learn_model_version_and_signals(workers: list[WorkerHandle]) -> None:
    config = gateway_config(
        workers,
        workers=[{"url": workers[0].url}, {"url": workers[1].url, "version": "pinned"}],
    )
    async with running_gateway(config) as gw:
        first, second = gw.gateway.pool
        assert (first.model, first.version) == ("demo", "v1")
        assert (second.model, second.version) == ("demo", "pinned")
        assert first.signals is not None and first.signals.engine == "vllm"
        assert first.state(first.signals_at, 1.0).health is Health.HEALTHY


async def test_failing_worker_is_ejected_and_comes_back_when_healthy(
    workers: list[WorkerHandle],
) -> None:
    bad = workers[0]
    config = gateway_config(
        workers,
        outlier={"consecutive_failures": 3, "probe_readmit_after_s": 0.3},
        policy={"name": "round_robin"},
    )
    await set_faults(bad, error_rate=1.0)
    async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
        await every_worker_up(gw)  # the bad one must take its turns to be ejected
        url = gw.openai_base + "/completions"
        body = {"model": "demo", "prompt": "x", "max_tokens": 2}
        pooled = gw.gateway.pool.get(bad.url)
        assert pooled is not None
        for _ in range(8):
            async with session.post(url, json=body) as resp:
                assert resp.status == 200  # retried on the good worker
        assert pooled.ejected
        await set_faults(bad, error_rate=0.0)
        await wait_until(lambda: not pooled.ejected, message="readmitted after a probe")
        served_by = set()
        for _ in range(6):
            async with session.post(url, json=body) as resp:
                assert resp.status == 200
                served_by.add(resp.headers["X-Kvgate-Worker"])
    assert bad.url in served_by


LLAMACPP_METRICS = """\
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 600
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 10.0
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 3
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


async def _slots_probe(
    slots: Callable[[web.Request], Awaitable[web.Response]], api_key: str | None = None
) -> WorkerState:
    """Run a gateway over one llama.cpp-like worker whose ``GET /slots`` is ``slots``; its
    snapshot after two scrapes."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=LLAMACPP_METRICS)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/slots", slots)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        worker: dict[str, object] = {"url": f"http://127.0.0.1:{port}", "model": "m"}
        if api_key is not None:
            worker["api_key"] = api_key
        config = {"workers": [worker], "health": {"interval_s": 0.05, "timeout_s": 2.0}}
        async with running_gateway(config) as gw:
            (pooled,) = gw.gateway.pool
            await wait_until(lambda: pooled.signals is not None, timeout=10)
            first = pooled.signals_at
            await wait_until(lambda: pooled.signals_at > first, timeout=10)
            return pooled.state(pooled.signals_at, 1.0)
    finally:
        await runner.cleanup()


async def test_a_llamacpp_worker_reports_its_slots_and_prefill_rate() -> None:
    """What llama.cpp says of itself reaches the snapshot: ``GET /slots`` (asked once) and
    its prefill seconds over the tokens it evaluated."""
    asked: list[str] = []

    async def slots(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response([{"id": i, "is_processing": i < 3} for i in range(4)])

    state = await _slots_probe(slots)
    assert state.slots == 4 and state.running == 3 and state.waiting == 1
    assert state.engine_prefill_s == 10.0 / 600
    assert asked == ["/slots"]


async def test_slots_are_asked_with_the_workers_key() -> None:
    """A llama.cpp started with ``--api-key`` answers ``/slots`` only to its key."""

    async def slots(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sk-worker":
            return web.json_response({"error": "invalid api key"}, status=401)
        return web.json_response([{"id": i} for i in range(2)])

    state = await _slots_probe(slots, api_key="sk-worker")
    assert (state.slots, state.running) == (2, 3)


async def test_a_hostile_slots_page_is_no_slot_model_and_no_crash() -> None:
    """JSON nested past the parser's depth (``RecursionError``, not ``ValueError``) leaves
    the worker without a slot model; its scrapes go on."""

    async def slots(request: web.Request) -> web.Response:
        return web.Response(text="[" * 200_000, content_type="application/json")

    state = await _slots_probe(slots)
    assert (state.slots, state.running) == (None, 3)


async def test_slots_are_asked_again_while_the_worker_loads() -> None:
    """llama.cpp answers 503 while it loads its model: not kept as "no slots"."""
    asked: list[int] = []

    async def slots(request: web.Request) -> web.Response:
        asked.append(1)
        if len(asked) == 1:
            return web.json_response({"error": {"message": "Loading model"}}, status=503)
        return web.json_response([{"id": i} for i in range(3)])

    state = await _slots_probe(slots)
    assert (state.slots, state.running) == (3, 3)


async def test_a_slots_page_listing_absurdly_many_is_no_slot_model() -> None:
    """A ``GET /slots`` list longer than any llama.cpp's ``--parallel`` (``MAX_SLOTS``) is
    garbage: no slot model, rather than one every prediction scans."""

    async def slots(request: web.Request) -> web.Response:
        return web.json_response([{"id": i} for i in range(MAX_SLOTS + 1)])

    state = await _slots_probe(slots)
    assert (state.slots, state.running) == (None, 3)


def _long_answers_config(fleet: list[WorkerHandle]) -> dict[str, object]:
    return gateway_config(
        fleet,
        timeouts={"first_byte_s": 1.0, "total_s": 2.0},
        outlier={"consecutive_failures": 3},
        policy={"name": "round_robin"},  # every worker takes its share of each kind
    )


def _asker(session: aiohttp.ClientSession, url: str) -> Callable[[int, int, bool], Awaitable[int]]:
    async def ask(n: int, max_tokens: int, stream: bool) -> int:
        body = {"model": "demo", "prompt": f"tell me {n}", "max_tokens": max_tokens,
                "ignore_eos": True, "stream": stream}  # fmt: skip
        async with session.post(url, json=body) as resp:
            text = await resp.text()
            return 599 if stream and "stream_broken" in text else resp.status

    return ask


async def test_a_clients_long_answers_never_eject_a_healthy_worker() -> None:
    """How long an answer takes is the client's choice (``max_tokens``): a non-streamed one
    past the first-byte timeout (its head comes with all of it) while its worker shows life
    (its engine generating, by its own metrics; an answer to another request), or a stream
    cut off at the total timeout while it flows, is the client's answer refused (504, a
    broken-off stream), not a failure of the worker. Six at once ejected a healthy worker
    (consecutive failures 3), on an idle fleet as on a busy one."""
    async with worker_fleet(2, profile="h100-llama3-8b", time_scale=1.0) as fleet:
        config = _long_answers_config(fleet)
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            ask = _asker(session, gw.openai_base + "/completions")
            # Alone on the fleet: nothing but the engines' own counters shows life.
            assert await asyncio.gather(*(ask(n, 2000, False) for n in range(6))) == [504] * 6
            assert not any(w.ejected for w in gw.gateway.pool)
            streams = await asyncio.gather(*(ask(n, 2000, True) for n in range(6, 12)))
            assert streams == [599] * 6 and not any(w.ejected for w in gw.gateway.pool)

            async def others(done: asyncio.Event) -> list[int]:
                served = []
                while not done.is_set():  # another client's short answers meanwhile
                    served.append(await ask(1000 + len(served), 2, False))
                return served

            done = asyncio.Event()
            meanwhile = asyncio.create_task(others(done))
            busy = [ask(n, 2000, False) for n in range(20, 26)]
            assert await asyncio.gather(*busy) == [504] * 6
            done.set()
            served = await meanwhile
            assert served and set(served) == {200}
            assert not any(w.ejected for w in gw.gateway.pool)


async def test_workers_silent_to_everyone_are_still_charged() -> None:
    """A hung engine answers nobody and generates nothing: its timeouts are its own."""
    async with (
        worker_fleet(2, profile="h100-llama3-8b", time_scale=1.0) as fleet,
        running_gateway(_long_answers_config(fleet)) as gw,
        aiohttp.ClientSession() as session,
    ):
        await every_worker_up(gw)
        ask = _asker(session, gw.openai_base + "/completions")
        for worker in fleet:
            await set_faults(worker, hang=True)
        assert await asyncio.gather(*(ask(n, 2, False) for n in range(6))) == [504] * 6
        assert sum(w.ejected for w in gw.gateway.pool) == 1  # the pool's last stays
