"""Every OpenAI endpoint answers through the gateway, read with the official client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config

pytestmark = pytest.mark.usefixtures("both_servers")


def _client(gw: GatewayHandle) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=gw.openai_base, api_key="test", max_retries=0)


@pytest.fixture
async def gw(workers: list[WorkerHandle]) -> AsyncIterator[GatewayHandle]:
    config = gateway_config(workers, model_aliases={"gpt-4o-mini": "demo"})
    async with running_gateway(config) as handle:
        await every_worker_up(handle)
        yield handle


async def test_models_retrieve_answers_the_model_and_its_alias(gw: GatewayHandle) -> None:
    async with _client(gw) as client:
        model = await client.models.retrieve("demo")
        alias = await client.models.retrieve("gpt-4o-mini")
        listed = [m.id async for m in client.models.list()]
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("nope")
    assert model.id == "demo"
    assert alias.id == "gpt-4o-mini"
    assert (alias.model_extra or {}).get("alias_of") == "demo"
    assert listed == ["demo", "gpt-4o-mini"]


async def test_an_alias_reaches_the_model_it_names(gw: GatewayHandle) -> None:
    async with _client(gw) as client:
        reply = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
    assert reply.model == "demo"  # the worker saw the real name
    assert reply.usage is not None and reply.usage.completion_tokens == 3


async def test_embeddings_float_and_base64(gw: GatewayHandle) -> None:
    async with _client(gw) as client:
        one = await client.embeddings.create(model="demo", input=["the kv pool", "is warm"])
        again = await client.embeddings.create(
            model="demo", input="the kv pool", encoding_format="float"
        )
    assert [d.index for d in one.data] == [0, 1]
    assert len(one.data[0].embedding) == 64
    # base64 (the client's default) decodes to the same vector as float
    assert one.data[0].embedding == pytest.approx(again.data[0].embedding, abs=1e-6)
    assert one.data[0].embedding != one.data[1].embedding
    assert one.usage.prompt_tokens > 0


@pytest.mark.parametrize("policy", ["default", "round_robin", "least_request"])
async def test_responses_continue_on_the_worker_that_holds_the_conversation(
    workers: list[WorkerHandle], policy: str
) -> None:
    # Whatever the policy: another worker does not know the conversation (a 404).
    config = gateway_config(workers, policy={"name": policy})
    async with running_gateway(config) as gw, _client(gw) as client:
        await every_worker_up(gw)
        first = await client.responses.create(model="demo", input="tell me a story")
        worker_ids = set()
        previous = first.id
        for turn in range(6):
            raw = await client.responses.with_raw_response.create(
                model="demo", input=f"and then {turn}?", previous_response_id=previous
            )
            worker_ids.add(raw.headers["x-kvgate-worker"])
            reply = raw.parse()
            assert reply.previous_response_id == previous
            previous = reply.id
    assert first.output_text
    # Each worker keeps its own conversations: a continuation elsewhere would be 404.
    assert len(worker_ids) == 1
    assert reply.usage is not None and reply.usage.input_tokens_details.cached_tokens > 0


async def test_a_streamed_response_is_bound_too(gw: GatewayHandle) -> None:
    async with _client(gw) as client:
        stream = await client.responses.create(model="demo", input="stream it", stream=True)
        events = [event async for event in stream]
        done = events[-1]
        assert done.type == "response.completed"
        follow = await client.responses.create(
            model="demo", input="more", previous_response_id=done.response.id
        )
    assert events[0].type == "response.created"
    assert follow.status == "completed"


# Token ids are a worker's own vocabulary: both calls must reach the same worker, which
# nothing but a session says (a bare id list shares no prefix with the prompt).
SAME_WORKER = {"X-Session-ID": "tokenizer-roundtrip"}


async def test_tokenize_and_detokenize(gw: GatewayHandle) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/tokenize",
            json={"model": "demo", "prompt": "the kv pool is warm"},
            headers=SAME_WORKER,
        ) as resp:
            assert resp.status == 200
            tokens = await resp.json()
        async with session.post(
            gw.url + "/detokenize",
            json={"model": "demo", "tokens": tokens["tokens"]},
            headers=SAME_WORKER,
        ) as resp:
            assert resp.status == 200
            back = await resp.json()
    assert tokens["count"] == len(tokens["tokens"]) == 5
    assert back["prompt"] == "the kv pool is warm"


async def test_other_v1_paths_are_forwarded_with_openai_errors(gw: GatewayHandle) -> None:
    async with aiohttp.ClientSession() as session:
        # no model in the body: the fleet's one model; the worker's own 404 comes back
        async with session.get(gw.openai_base + "/files") as resp:
            assert resp.status == 404
            assert "x-kvgate-worker" in resp.headers
        async with session.post(gw.openai_base + "/embeddings", data=b"{bad") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "invalid_request"
        async with session.post(
            gw.openai_base + "/embeddings", json={"model": "nope", "input": "x"}
        ) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "model_not_found"


async def test_an_empty_fleet_answers_503_until_a_worker_is_added(
    workers: list[WorkerHandle],
) -> None:
    async with running_gateway(gateway_config([])) as gw, aiohttp.ClientSession() as session:
        body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
        async with session.get(gw.url + "/readyz") as resp:
            assert resp.status == 503
            assert (await resp.json())["status"] == "no workers yet"
        async with session.post(gw.openai_base + "/chat/completions", json=body) as resp:
            assert resp.status == 503
            assert (await resp.json())["error"]["code"] == "no_healthy_worker"
        async with session.post(gw.url + "/admin/workers", json={"url": workers[0].url}) as resp:
            assert resp.status == 201
        async with session.post(gw.openai_base + "/chat/completions", json=body) as resp:
            assert resp.status == 200


async def test_a_worker_not_serving_its_configured_model_is_named_in_readyz(
    workers: list[WorkerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    config = gateway_config(workers)
    config["workers"] = [{"url": workers[0].url, "model": "llama-3-8b"}, {"url": workers[1].url}]
    async with (
        running_gateway(config) as gw,
        aiohttp.ClientSession() as session,
        session.get(gw.url + "/readyz") as resp,
    ):
        detail = await resp.json()
    assert detail["model_mismatch"] == {
        workers[0].url: "configured for model 'llama-3-8b' but serves ['demo']"
    }
    assert "is configured for model 'llama-3-8b' but serves ['demo']" in caplog.text
