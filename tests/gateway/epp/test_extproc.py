"""The endpoint picker speaks Envoy's ext_proc as the Gateway API Inference Extension says."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvgate.gateway.epp import EXT_PROC_SERVICE
from kvgate.testing import wait_until

from ..conftest import gateway_config, worker_fleet
from .conftest import chat, envoy, leases_released, running_picker
from .envoy import ProtocolError

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("mode", ["buffered", "full_duplex"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_is_picked_forwarded_and_its_usage_fed_back(
    mode: str, stream: bool
) -> None:
    async with worker_fleet(2) as fleet, running_picker(gateway_config(fleet)) as picker:
        async with envoy(picker, mode, chunk=16) as client:  # type: ignore[arg-type]
            result = await client.request(chat("hello there", stream=stream))
        assert result.status == 200
        urls = {w.url.removeprefix("http://") for w in fleet}
        assert result.endpoints[0] in urls
        assert set(result.endpoints) == urls  # the picked one, then the other as fallback
        assert result.served == result.endpoints[0]
        assert result.headers["x-kvgate-worker"] == "http://" + result.served
        if stream:
            assert b"data: [DONE]" in result.body
        else:
            assert json.loads(result.body)["usage"]["prompt_tokens"] > 0
        await wait_until(lambda: leases_released(picker), message="lease released")
        tokens = picker.gateway.metrics.prompt_tokens
        assert (
            sum(s.value for m in tokens.collect() for s in m.samples if s.name.endswith("_total"))
            > 0
        )


async def test_a_request_without_a_body_is_decided_on_its_headers() -> None:
    async with worker_fleet(1) as fleet, running_picker(gateway_config(fleet)) as picker:
        async with envoy(picker) as client:
            result = await client.request(b"", path="/v1/models")
        assert result.status == 200 and b"demo" in result.body
        await wait_until(lambda: leases_released(picker), message="lease released")


async def test_the_subset_hint_is_obeyed_and_an_ineligible_subset_is_a_503() -> None:
    async with worker_fleet(3) as fleet, running_picker(gateway_config(fleet)) as picker:
        only = fleet[2].url.removeprefix("http://")
        async with envoy(picker) as client:
            for n in range(6):
                result = await client.request(chat(f"subset {n}"), subset=[only])
                assert result.endpoints == [only]
            refused = await client.request(chat("nowhere"), subset=["10.9.9.9:8000"])
            empty = await client.request(chat("nowhere"), subset=[])
        assert refused.immediate and refused.status == 503
        assert empty.immediate and empty.status == 503
        assert json.loads(refused.body)["error"]["code"] == "no_healthy_worker"


async def test_no_ready_endpoint_is_an_immediate_503() -> None:
    async with worker_fleet(1) as fleet:
        config = gateway_config(fleet, health={"interval_s": 0.1, "timeout_s": 2.0})
        async with running_picker(config) as picker:
            await fleet[0].stop()
            pool = picker.gateway.pool
            await wait_until(lambda: not any(w.probe_ok for w in pool), message="worker down")
            async with envoy(picker) as client:
                result = await client.request(chat("anyone?"))
    assert result.immediate and result.status == 503
    assert json.loads(result.body)["error"]["type"] == "server_error"


async def test_shedding_is_an_immediate_429_with_retry_after() -> None:
    async with worker_fleet(1) as fleet:
        # No queue and room for one request: the second one concurrently is shed.
        config = gateway_config(fleet, admission={"worker_max_in_flight": 1, "queue_size": 0})
        async with running_picker(config) as picker, envoy(picker) as client:
            held = await client.request(chat("first"), cancel_at="response_headers")
            assert held.cancelled
            # cancelled: its slot is back, so the next one is placed again
            await wait_until(lambda: leases_released(picker), message="released")
            worker = next(iter(picker.gateway.pool))
            lease = picker.gateway.pool.lease(worker, 0)  # one request in flight
            try:
                shed = await client.request(chat("second"))
            finally:
                lease.release()
            registry = picker.gateway.metrics.registry
            shed_count = registry.get_sample_value(
                "kvgate_epp_decisions_total", {"outcome": "shed"}
            )
    assert shed.immediate and shed.status == 429
    assert int(shed.headers["retry-after"]) >= 1
    assert json.loads(shed.body)["error"]["type"] == "rate_limit_error"
    assert shed_count == 1


async def test_bad_requests_are_answered_by_the_picker() -> None:
    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker, "buffered") as client,
    ):
        bad = await client.request(b"{not json")
        unknown = await client.request(chat("hi", model="nobody"))
    assert bad.immediate and bad.status == 400
    assert unknown.immediate and unknown.status == 404
    assert json.loads(unknown.body)["error"]["param"] == "model"


@pytest.mark.parametrize("cancel_at", ["decision", "response_headers", "first_chunk"])
async def test_a_stream_cancelled_mid_request_gives_its_lease_back(cancel_at: str) -> None:
    async with worker_fleet(1) as fleet, running_picker(gateway_config(fleet)) as picker:
        async with envoy(picker) as client:
            result = await client.request(
                chat("a long answer", stream=True, max_tokens=64),
                cancel_at=cancel_at,  # type: ignore[arg-type]
            )
        assert result.cancelled
        await wait_until(lambda: leases_released(picker), message="lease released")
        await wait_until(lambda: picker.extproc.streams == 0, message="stream closed")


async def test_the_endpoint_that_served_is_the_one_charged() -> None:
    async with worker_fleet(2) as fleet:
        config = gateway_config(fleet, outlier={"consecutive_failures": 1})
        async with running_picker(config) as picker, envoy(picker) as client:
            first = await client.request(chat("pick"), cancel_at="decision")
            picked, fallback = first.endpoints
            await wait_until(lambda: leases_released(picker), message="released")
            # The picked worker goes away: the proxy falls back to the next endpoint.
            dead = next(w for w in fleet if w.url.endswith(picked))
            await dead.stop()
            result = await client.request(chat("pick"))  # same prompt, same pick
        assert result.status == 200
        if result.endpoints[0] == picked:
            assert result.served == fallback
            worker = picker.gateway.pool.get("http://" + picked)
            assert worker is not None and worker.ejected  # the skipped one was charged
        await wait_until(lambda: leases_released(picker), message="released")


async def test_grpc_health_answers_liveness_readiness_and_the_ext_proc_service() -> None:
    async with worker_fleet(1) as fleet, running_picker(gateway_config(fleet)) as picker:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{picker.port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("liveness", "readiness", EXT_PROC_SERVICE):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
            await picker.drain(0.1)
            ready = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
            alive = await stub.Check(health_pb2.HealthCheckRequest(service="liveness"))
            assert ready.status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert alive.status == health_pb2.HealthCheckResponse.SERVING
        async with envoy(picker) as client:
            refused = await client.request(chat("late"))
        assert refused.immediate and refused.status == 503


async def test_a_message_out_of_order_ends_the_stream_without_a_decision() -> None:
    async with worker_fleet(1) as fleet, running_picker(gateway_config(fleet)) as picker:
        async with envoy(picker) as client:
            with pytest.raises(ProtocolError):
                # response headers before any request: not an ext_proc exchange
                from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

                call = client.stub.Process()
                await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"x")))
                await call.done_writing()
                await client._read(call)
        assert leases_released(picker)


async def test_a_stream_the_proxy_closes_after_the_decision_gives_its_lease_back() -> None:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    from .envoy import _headers

    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker, "buffered") as client,
    ):
        call = client.stub.Process()
        from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

        buffered = pb.ProtocolConfiguration(request_body_mode=ProcessingMode.BUFFERED)
        headers = _headers({":path": "/v1/completions"}, end=False)
        await call.write(pb.ProcessingRequest(request_headers=headers, protocol_config=buffered))
        await client._read(call)  # the headers' answer; the decision comes with the body
        body = b'{"model": "demo", "prompt": "hi", "max_tokens": 4}'
        await call.write(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))
        )
        decision = await client._read(call)
        assert decision.WhichOneof("response") == "request_body"
        assert picker.gateway.pool.in_flight() == 1  # placed: its slot is held
        await call.done_writing()  # the proxy ends the stream without a response
        await wait_until(lambda: leases_released(picker), message="lease released")
        await wait_until(lambda: picker.extproc.streams == 0, message="stream closed")


def _prompt_tokens(picker: object) -> float:
    tokens = picker.gateway.metrics.prompt_tokens  # type: ignore[attr-defined]
    return float(
        sum(s.value for m in tokens.collect() for s in m.samples if s.name.endswith("_total"))
    )


async def test_a_streams_usage_is_asked_for_and_taken_out_again_in_full_duplex() -> None:
    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker, "full_duplex", chunk=32) as client,
    ):
        body = json.dumps(
            {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        ).encode()
        result = await client.request(body)
        assert result.status == 200 and b"data: [DONE]" in result.body
        assert b'"usage"' not in result.body  # the client did not ask for it
        await wait_until(lambda: leases_released(picker), message="released")
        assert _prompt_tokens(picker) > 0  # the picker had it all the same


async def test_an_alias_is_routed_and_forwarded_as_its_model() -> None:
    async with worker_fleet(1, strict_model=True) as fleet:
        config = gateway_config(fleet, model_aliases={"gpt-4o-mini": "demo"})
        async with running_picker(config) as picker:
            for mode in ("buffered", "full_duplex"):
                async with envoy(picker, mode) as client:  # type: ignore[arg-type]
                    result = await client.request(chat("hi", model="gpt-4o-mini"))
                assert result.status == 200, (mode, result.body)


async def test_trailers_end_the_request_body_and_the_response_in_full_duplex() -> None:
    from envoy.config.core.v3.base_pb2 import HeaderMap, Metadata
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
    from google.protobuf.struct_pb2 import Struct

    from .envoy import _headers

    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker) as client,
    ):
        duplex = ProcessingMode.FULL_DUPLEX_STREAMED
        config = pb.ProtocolConfiguration(request_body_mode=duplex, response_body_mode=duplex)
        call = client.stub.Process()
        headers = _headers({":path": "/v1/chat/completions"}, end=False)
        await call.write(pb.ProcessingRequest(request_headers=headers, protocol_config=config))
        body = chat("trailers")
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body)))
        trailers = pb.HttpTrailers(trailers=HeaderMap())
        await call.write(pb.ProcessingRequest(request_trailers=trailers))
        kinds = [(await client._read(call)).WhichOneof("response") for _ in range(3)]
        assert kinds == ["request_headers", "request_body", "request_trailers"]
        assert picker.gateway.pool.in_flight() == 1
        served = Struct()
        served.update({"x-gateway-destination-endpoint-served": fleet[0].url[len("http://") :]})
        response = _headers({":status": "200", "content-type": "application/json"}, end=False)
        await call.write(
            pb.ProcessingRequest(
                response_headers=response,
                metadata_context=Metadata(filter_metadata={"envoy.lb": served}),
            )
        )
        assert (await client._read(call)).WhichOneof("response") == "response_headers"
        answer = b'{"id": "x", "usage": {"prompt_tokens": 7, "completion_tokens": 1}}'
        await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=answer)))
        echoed = await client._read(call)
        assert echoed.response_body.response.body_mutation.streamed_response.body == answer
        await call.write(pb.ProcessingRequest(response_trailers=trailers))
        assert (await client._read(call)).WhichOneof("response") == "response_trailers"
        await wait_until(lambda: leases_released(picker), message="released at the trailers")
        assert _prompt_tokens(picker) == 7  # the usage the body carried


@pytest.mark.parametrize("mode", ["buffered", "full_duplex"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_turn_ending_in_a_tool_call_is_booked_away_through_the_picker(
    mode: str, stream: bool
) -> None:
    """As through the built-in proxy: the attempt's end books the session away (its KV
    reserved on its worker), and its next request, picked, brings it back."""
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    session = {"session_id": "agent-7"}
    async with (
        worker_fleet(2) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker, mode, chunk=32) as client,  # type: ignore[arg-type]
    ):
        plane = picker.gateway.tool_calls
        assert plane is not None
        calls = await client.request(
            chat("agent " * 100, stream=stream, tools=tools, tool_choice="required"),
            headers=session,
        )
        assert calls.status == 200 and b"tool_calls" in calls.body
        await wait_until(lambda: plane.bookings == 1, message="the session booked away")
        away = plane.book.get("agent-7")
        assert away is not None and away.worker == "http://" + calls.served
        reserved = {w.id: w.routed.kv_reserved_tokens for w in picker.gateway.pool}
        assert reserved[away.worker] == away.kv_tokens > 0
        back = await client.request(
            chat("agent " * 100, stream=stream, tools=tools, tool_choice="none"), headers=session
        )
        assert back.status == 200 and back.served == calls.served
        await wait_until(lambda: leases_released(picker), message="released")
        assert plane.returns == 1 and plane.book.get("agent-7") is None
        assert sum(w.routed.kv_reserved_tokens for w in picker.gateway.pool) == 0


async def test_the_picker_scopes_sessions_by_envoys_identity_header() -> None:
    """Envoy ran ext_authz and set ``x-user-id``; the picker trusts it from Envoy's address
    (the gRPC peer) only: two users with one session id are two bindings, and a picker that
    does not trust the peer binds neither."""
    from kvgate.gateway.dataplane.extproc import grpc_peer_address
    from kvgate.store import MemoryStore

    assert grpc_peer_address("ipv4:10.0.0.7:41234") == "10.0.0.7"
    assert grpc_peer_address("ipv6:%5B::1%5D:41234") == "::1"
    assert grpc_peer_address("ipv6:[fe80::1%25eth0]:1") == "fe80::1%eth0"
    assert grpc_peer_address("unix:/run/envoy.sock") is None
    assert grpc_peer_address(None) is None
    for trusted, bindings in ((["127.0.0.1"], 2), (["10.0.0.0/8"], 0)):
        store = MemoryStore()
        features = {"session_scope": {"header": "x-user-id", "trusted_peers": trusted}}
        async with (
            worker_fleet(2) as fleet,
            running_picker(gateway_config(fleet, features=features), store=store) as picker,
            envoy(picker) as client,
        ):
            for user in ("alice", "bob"):
                headers = {"x-session-id": "shared", "x-user-id": user}
                result = await client.request(chat(f"hello {user}"), headers=headers)
                assert result.status == 200
            await wait_until(lambda: leases_released(picker), message="released")
            keys = {a.session_key for w in fleet for a in await store.sessions_of(w.url)}
        assert len(keys) == bindings, keys


async def test_the_picker_confines_paths_as_the_proxy_does() -> None:
    """Envoy's route may send the pool any path: the picker placed a dot segment, a
    worker's own endpoint (vLLM's ``/sleep``, ``/metrics``) or its runtime LoRA loading on
    a worker as readily as a chat. Now it refuses what the built-in proxy does not forward."""
    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker) as client,
    ):
        refused = {
            "/v1/%2e%2e/sleep": 400,
            "/v1/x/../../reset_prefix_cache": 400,
            "/sleep": 404,
            "/metrics": 404,
            "/v1/load_lora_adapter": 403,
            "/v1/unload%5Flora_adapter?x=1": 403,
        }
        for path, status in refused.items():
            result = await client.request(b'{"model":"demo","lora_name":"x"}', path=path)
            assert result.status == status, (path, result.status)
            assert result.endpoints == [], path
        ok = await client.request(chat("still served"))
        assert ok.status == 200
        await wait_until(lambda: leases_released(picker), message="released")


async def test_the_picker_continues_a_stored_response_for_its_creator_only() -> None:
    """The picker binds each response id it sees answered to its worker in its creator's
    scope; another tenant's continuation is the worker's 404 for an unknown id, answered
    by the picker (no endpoint), and the creator's goes back to the worker holding it."""
    async with (
        worker_fleet(2) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker) as client,
    ):
        alice, bob = ({"authorization": f"Bearer sk-{n}-0123456789"} for n in ("alice", "bob"))
        first = await client.request(
            b'{"model":"demo","input":"my plan"}', path="/v1/responses", headers=alice
        )
        assert first.status == 200, first.body
        previous = json.loads(first.body)["id"]
        turn = json.dumps({"model": "demo", "input": "and?", "previous_response_id": previous})
        for _ in range(4):  # a worker picked by the policy would hold it 1 time in 2
            stolen = await client.request(turn.encode(), path="/v1/responses", headers=bob)
            assert (stolen.status, stolen.endpoints) == (404, []), stolen.body
        error = json.loads(stolen.body)["error"]
        assert error["param"] == "previous_response_id"
        assert error["message"] == f"Response with id '{previous}' not found."
        for _ in range(2):
            own = await client.request(turn.encode(), path="/v1/responses", headers=alice)
            assert own.status == 200, own.body
            assert own.served == first.served
        for who, status in ((bob, 404), (alice, 200), (alice, 200)):  # retrieving it
            got = await client.request(b"", path=f"/v1/responses/{previous}", headers=who)
            assert got.status == status, got.body
            assert got.served == (first.served if status == 200 else None)
        await wait_until(lambda: leases_released(picker), message="released")


async def test_the_picker_forgets_a_response_its_worker_deleted() -> None:
    """A ``DELETE /v1/responses/{id}`` the worker confirms drops the id's record before
    the client hears of it: the id is then the picker's own 404 (no endpoint named)."""
    async with (
        worker_fleet(2) as fleet,
        running_picker(gateway_config(fleet)) as picker,
        envoy(picker) as client,
    ):
        alice = {"authorization": "Bearer sk-alice-0123456789"}
        first = await client.request(
            b'{"model":"demo","input":"my plan"}', path="/v1/responses", headers=alice
        )
        assert first.status == 200, first.body
        stored = f"/v1/responses/{json.loads(first.body)['id']}"
        deleted = await client.request(b"", path=stored, headers=alice, method="DELETE")
        assert (deleted.status, deleted.served) == (200, first.served), deleted.body
        for method in ("GET", "DELETE"):
            again = await client.request(b"", path=stored, headers=alice, method=method)
            assert (again.status, again.endpoints) == (404, []), again.body
        await wait_until(lambda: leases_released(picker), message="released")


async def test_a_reused_request_id_leaves_no_phantom_work_in_the_pickers_books() -> None:
    """Envoy's ``x-request-id`` is the client's (Envoy may keep an edge client's): two
    requests with one id at once on two endpoints each leave the policy's books once
    they end (its books are keyed by the picker's own id)."""
    async with (
        worker_fleet(2, extra_latency_ms=300.0) as fleet,
        running_picker(gateway_config(fleet)) as picker,
    ):
        urls = [w.url.removeprefix("http://") for w in fleet]
        async with envoy(picker) as one, envoy(picker) as two:
            results = await asyncio.gather(
                *(
                    client.request(
                        chat(f"same id {n}"), headers={"x-request-id": "same-id"}, subset=[url]
                    )
                    for n, (client, url) in enumerate(zip((one, two), urls, strict=True))
                )
            )
        assert [r.status for r in results] == [200, 200]
        assert [r.served for r in results] == urls
        await wait_until(lambda: leases_released(picker), message="leases released")
        books = picker.gateway.router.policy.speed.books  # type: ignore[attr-defined]
        assert sum(len(book.sent) for book in books.values()) == 0


async def test_the_picker_refuses_a_request_without_a_client_key() -> None:
    """With ``api_keys`` the built-in proxy answers 401 to a request without one; the picker
    placed it on a worker all the same (the config's keys only picked settings), so a
    gateway moved behind Envoy was silently open. Now it is the same 401, never placed;
    the request's one credential (a bearer token, else ``x-api-key``) must be a key."""
    keys = ["sk-picker-0123456789"]
    async with (
        worker_fleet(1) as fleet,
        running_picker(gateway_config(fleet, api_keys=keys)) as picker,
        envoy(picker) as client,
    ):
        for headers in (
            {},
            {"authorization": "Bearer sk-wrong"},
            {"authorization": "Bearer made-up", "x-api-key": keys[0]},
        ):
            refused = await client.request(chat("hi"), headers=headers)
            assert refused.immediate and refused.status == 401, headers
            assert refused.endpoints == [] and keys[0].encode() not in refused.body
        for headers in ({"authorization": f"Bearer {keys[0]}"}, {"x-api-key": keys[0]}):
            ok = await client.request(chat("hi"), headers=headers)
            assert ok.status == 200, headers
        await wait_until(lambda: leases_released(picker), message="released")
