"""End to end through the gateway with the official OpenAI client: forwarding,
streaming, headers, retries, timeouts, client disconnects."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from openai import AsyncOpenAI, InternalServerError

from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config, set_faults, worker_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

CHAT = [{"role": "user", "content": "Tell me about paged attention and prefix caching."}]


def client(url: str, **kwargs: object) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url, api_key="test", max_retries=0, **kwargs)  # type: ignore[arg-type]


async def test_non_streaming_chat_is_passed_through_with_route_headers(
    workers: list[WorkerHandle],
) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        raw = await client(gw.openai_base).chat.completions.with_raw_response.create(
            model="demo", messages=CHAT, max_tokens=8
        )
        completion = raw.parse()
    assert raw.headers["x-kvgate-worker"] in {w.url for w in workers}
    assert raw.headers["x-kvgate-model-version"] == "v1"
    assert raw.headers["x-kvgate-route-reason"]
    assert raw.headers["x-request-id"]
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 8


async def test_streaming_chat_arrives_in_chunks_with_usage(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        stream = await client(gw.openai_base).chat.completions.create(
            model="demo",
            messages=CHAT,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        metrics = gw.gateway.metrics.render().decode()
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content
    assert len(chunks) > 3
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 16
    # The gateway read the final usage from the stream it passed through.
    assert 'kvgate_prompt_tokens_total{model="demo"' in metrics
    assert "kvgate_time_to_first_token_seconds_count" in metrics


async def test_completions_and_request_id_round_trip(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        raw = await client(gw.openai_base).completions.with_raw_response.create(
            model="demo",
            prompt="Once upon a time",
            max_tokens=4,
            extra_headers={"X-Request-ID": "req-123"},
        )
    assert raw.headers["x-request-id"] == "req-123"
    assert raw.parse().choices[0].text


async def test_response_headers_can_be_turned_off(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers, response_headers=False)) as gw:
        raw = await client(gw.openai_base).completions.with_raw_response.create(
            model="demo", prompt="hi", max_tokens=2
        )
    assert "x-kvgate-worker" not in raw.headers
    assert raw.headers["x-request-id"]


async def test_models_lists_what_the_fleet_serves(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        models = await client(gw.openai_base).models.list()
    assert [m.id for m in models.data] == ["demo"]


async def test_session_sticks_to_one_worker(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw:
        api = client(gw.openai_base)
        seen = set()
        for turn in range(4):
            raw = await api.chat.completions.with_raw_response.create(
                model="demo",
                messages=[{"role": "user", "content": f"turn {turn}"}],
                max_tokens=2,
                extra_headers={"X-Session-ID": "session-42"},
            )
            seen.add(raw.headers["x-kvgate-worker"])
    assert len(seen) == 1


async def test_failing_worker_is_retried_on_another(workers: list[WorkerHandle]) -> None:
    bad, good = workers
    await set_faults(bad, error_rate=1.0)
    async with running_gateway(gateway_config(workers)) as gw:
        await every_worker_up(gw)  # both: the bad one to fail, the good one to retry on
        api = client(gw.openai_base)
        for i in range(6):
            raw = await api.completions.with_raw_response.create(
                model="demo", prompt=f"prompt {i}", max_tokens=2
            )
            assert raw.headers["x-kvgate-worker"] == good.url
        metrics = gw.gateway.metrics.render().decode()
    assert 'kvgate_retries_total{model="demo"}' in metrics
    assert 'kind="status"' in metrics


async def test_every_worker_failing_gives_502(workers: list[WorkerHandle]) -> None:
    for worker in workers:
        await set_faults(worker, error_rate=1.0)
    async with running_gateway(gateway_config(workers)) as gw:
        with pytest.raises(InternalServerError) as info:
            await client(gw.openai_base).completions.create(model="demo", prompt="x", max_tokens=2)
    assert info.value.status_code == 502
    assert info.value.body["code"] == "upstream_error"  # type: ignore[index]


async def test_hanging_worker_gives_504_after_first_byte_timeout() -> None:
    async with worker_fleet(1) as fleet:
        await set_faults(fleet[0], hang=True)
        config = gateway_config(fleet, timeouts={"first_byte_s": 0.3})
        async with running_gateway(config) as gw:
            with pytest.raises(InternalServerError) as info:
                await client(gw.openai_base).completions.create(
                    model="demo", prompt="x", max_tokens=2
                )
    assert info.value.status_code == 504


async def test_killed_worker_loses_no_request(workers: list[WorkerHandle]) -> None:
    victim, survivor = workers
    async with running_gateway(gateway_config(workers)) as gw:
        await every_worker_up(gw)
        api = client(gw.openai_base)

        async def one(i: int) -> str:
            raw = await api.completions.with_raw_response.create(
                model="demo", prompt=f"request {i} " * 20, max_tokens=20
            )
            return raw.headers["x-kvgate-worker"]

        first = await asyncio.gather(*(one(i) for i in range(20)))
        assert victim.url in first
        tasks = [asyncio.create_task(one(i)) for i in range(20, 60)]
        await victim.kill()
        later = await asyncio.gather(*tasks)
        after = await asyncio.gather(*(one(i) for i in range(60, 80)))
    assert len(later) == 40
    assert set(after) == {survivor.url}


async def test_client_disconnect_aborts_the_request_on_the_worker() -> None:
    async with worker_fleet(1, time_scale=1.0) as fleet:
        worker = fleet[0]
        async with running_gateway(gateway_config(fleet)) as gw:
            body = {"model": "demo", "prompt": "tell a long story", "max_tokens": 2000}
            body["stream"] = True
            async with aiohttp.ClientSession() as session:
                resp = await session.post(gw.openai_base + "/completions", json=body)
                assert resp.status == 200
                await resp.content.readline()  # the stream has started
                resp.close()  # the client goes away mid-stream
            await wait_until(lambda: worker.worker.driver.aborts >= 1, message="engine abort")
            await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="request ended")
            metrics = gw.gateway.metrics.render().decode()
    assert 'kvgate_client_disconnects_total{model="demo"} 1.0' in metrics


async def test_client_disconnect_before_first_byte_aborts_too() -> None:
    async with worker_fleet(1, time_scale=1.0) as fleet:
        worker = fleet[0]
        async with running_gateway(gateway_config(fleet)) as gw:
            body = {"model": "demo", "prompt": "tell a long story", "max_tokens": 2000}
            async with aiohttp.ClientSession() as session:
                task = asyncio.create_task(session.post(gw.openai_base + "/completions", json=body))
                await wait_until(lambda: worker.worker.driver.in_flight > 0, message="started")
                task.cancel()
            await wait_until(lambda: worker.worker.driver.aborts >= 1, message="engine abort")
