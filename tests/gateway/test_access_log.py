"""One access-log line per request, plain and JSON, with what an operator needs."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import logging
import random
import re
import sys

import aiohttp
import pytest

from kvgate.gateway.observe.logs import (
    ACCESS_LOGGER,
    AccessLog,
    AccessRecord,
    _seconds,
    configure_logging,
)
from kvgate.gateway.testing import running_gateway
from kvgate.workersim.runner import WorkerHandle

from .conftest import every_worker_up, gateway_config

RECORD = AccessRecord(
    request_id="r1",
    model="demo",
    worker="http://127.0.0.1:9000",
    version="v2",
    reason="affinity_hit",
    status=200,
    ttft=0.0123456789,
    duration=0.5,
    retries=1,
    method="POST",
    path="/v1/chat/completions",
    session="header",
    stream=True,
    prompt_tokens=100,
    cached_tokens=96,
    completion_tokens=8,
)


def test_plain_line_reads_like_a_web_server_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        AccessLog(True, json_lines=False).write(RECORD)
    (line,) = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert line.startswith("POST /v1/chat/completions 200 model=demo ")
    for part in (
        "worker=http://127.0.0.1:9000",
        "version=v2",
        "reason=affinity_hit",
        "session=header",
        "stream=true",
        "prompt_tokens=100",
        "cached_tokens=96",
        "completion_tokens=8",
        "ttft=0.012346",
        "duration=0.5",
        "retries=1",
        "request_id=r1",
    ):
        assert f" {part}" in line, part


def test_plain_line_times_are_the_text_of_the_time_rounded_to_six_decimals() -> None:
    rng = random.Random(17)
    edges = [0.0, 5e-05, 9.99999e-05, 0.0001, 0.0000995, 0.1, 0.5, 2.0, 123.0000005, 1e9, -0.5]
    samples = [10 ** rng.uniform(-8, 10) for _ in range(20000)]
    samples += [round(rng.uniform(0, 60), rng.randint(0, 8)) for _ in range(20000)]
    for value in edges + samples:
        assert _seconds(value) == str(round(value, 6)), value


def test_json_line_holds_every_field(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        AccessLog(True, json_lines=True).write(RECORD)
    (line,) = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    data = json.loads(line)
    assert data["path"] == "/v1/chat/completions" and data["method"] == "POST"
    assert data["stream"] is True and data["session"] == "header"
    assert (data["prompt_tokens"], data["cached_tokens"], data["completion_tokens"]) == (
        100,
        96,
        8,
    )
    assert data["ttft"] == 0.012346 and data["retries"] == 1 and "ts" in data


def test_nothing_is_formatted_when_the_logger_drops_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=ACCESS_LOGGER):
        AccessLog(True, json_lines=False).write(RECORD)
    assert not [r for r in caplog.records if r.name == ACCESS_LOGGER]


@pytest.mark.parametrize("json_logs", [False, True])
async def test_one_line_per_request_live_and_an_unknown_model_is_logged_as_asked(
    workers: list[WorkerHandle], caplog: pytest.LogCaptureFixture, json_logs: bool
) -> None:
    config = gateway_config(workers, json_logs=json_logs)
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            url = gw.openai_base + "/completions"
            body = {"model": "demo", "prompt": "hi", "max_tokens": 2}
            async with session.post(url, json=body) as ok:
                assert ok.status == 200
            async with session.post(url, json={**body, "model": "no-such-model"}) as missing:
                assert missing.status == 404
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 2
    if json_logs:
        first, second = (json.loads(line) for line in lines)
        assert first["status"] == 200 and first["worker"] and first["prompt_tokens"] > 0
        assert first["path"] == "/v1/completions" and first["stream"] is False
        assert second["model"] == "no-such-model" and second["status"] == 404
        assert second["reason"] == "model_not_found" and second["prompt_tokens"] is None
    else:
        assert lines[0].startswith("POST /v1/completions 200 model=demo ")
        assert lines[1].startswith("POST /v1/completions 404 model=no-such-model ")
        assert " reason=model_not_found " in lines[1]


async def test_access_log_can_be_turned_off(
    workers: list[WorkerHandle], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        async with running_gateway(gateway_config(workers, access_log=False)) as gw:
            await every_worker_up(gw)
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    gw.openai_base + "/completions",
                    json={"model": "demo", "prompt": "hi", "max_tokens": 2},
                ) as resp,
            ):
                assert resp.status == 200
    assert not [r for r in caplog.records if r.name == ACCESS_LOGGER]


async def test_made_up_model_names_never_become_metric_labels(workers: list[WorkerHandle]) -> None:
    async with running_gateway(gateway_config(workers)) as gw, aiohttp.ClientSession() as session:
        for i in range(5):
            body = {"model": f"made-up-{i}", "prompt": "hi", "max_tokens": 2}
            async with session.post(gw.openai_base + "/completions", json=body) as resp:
                assert resp.status == 404
        text = gw.gateway.metrics.render().decode()
    assert "made-up" not in text
    assert 'kvgate_requests_total{code="404",model="",reason="model_not_found"' in text


@pytest.mark.parametrize("json_logs", [False, True])
async def test_the_sink_writes_what_logging_would_in_one_write_per_loop_turn(
    monkeypatch: pytest.MonkeyPatch, json_logs: bool
) -> None:
    """With the process's logging set up (``kvgate serve``), access lines skip the logging
    module: the same text, redacted, batched per event-loop turn."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    via_logging, via_sink = io.StringIO(), io.StringIO()
    secret = with_url = dataclasses.replace(RECORD, worker="http://user:pw@10.0.0.1:9000")
    bare = dataclasses.replace(
        RECORD, model="", path="", ttft=None, prompt_tokens=None, cached_tokens=None,
        completion_tokens=None, stream=False, reason="no such thing", request_id="a=b",
    )  # fmt: skip
    try:
        monkeypatch.setattr(sys, "stderr", via_logging)
        configure_logging(json_logs)
        (process_handler,) = root.handlers
        # A second handler (as a test's log capture adds): the logging module's path.
        root.addHandler(logging.NullHandler())
        AccessLog(True, json_lines=json_logs).write(secret)
        AccessLog(True, json_lines=json_logs).write(bare)
        root.handlers[:] = [process_handler]
        monkeypatch.setattr(sys, "stderr", via_sink)
        configure_logging(json_logs)
        log = AccessLog(True, json_lines=json_logs)
        log.write(with_url)
        log.write(bare)
        assert via_sink.getvalue() == ""  # held until the loop's turn ends
        await asyncio.sleep(0)
        lines = via_sink.getvalue().splitlines()
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert len(lines) == 2 and "pw" not in lines[0] and "user:pw" in with_url.worker
    expected = via_logging.getvalue().splitlines()
    assert len(expected) == 2
    for got, want_line in zip(lines, expected, strict=True):
        if json_logs:
            first, want = json.loads(got), json.loads(want_line)
            assert first.pop("ts") and want.pop("ts")
            assert first == want
        else:
            stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
            assert re.fullmatch(stamp + r"INFO kvgate\.access: .*", got)
            assert got[24:] == want_line[24:]  # everything after the time stamp


def test_the_sink_flushes_on_whichever_loop_runs_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink remembers the running loop (asking asyncio makes a system call): a line
    written in a later loop, or outside any, is still flushed, never left on a dead one."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    out = io.StringIO()

    async def one_line() -> str:
        log.write(RECORD)
        await asyncio.sleep(0)
        return out.getvalue()

    try:
        monkeypatch.setattr(sys, "stderr", out)
        configure_logging(False)
        log = AccessLog(True)
        first = asyncio.run(one_line())
        second = asyncio.run(one_line())  # a new loop: the remembered one is not running
        log.write(RECORD)  # no loop at all: written at once
        third = out.getvalue()
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    assert [text.count("\n") for text in (first, second, third)] == [1, 2, 3]


@pytest.mark.parametrize("json_logs", [False, True])
async def test_a_named_keys_requests_are_logged_by_its_name_never_its_key(
    workers: list[WorkerHandle], caplog: pytest.LogCaptureFixture, json_logs: bool
) -> None:
    """Operators tell tenants apart by the name they gave a key (``api_keys[].name``), on
    both servers' paths (chat, completions); a plain key, or none, has no name."""
    plain, batch = "sk-plain-0123456789", "sk-batch-0123456789"
    keys = [plain, {"key": batch, "name": "nightly batch", "priority": "sheddable"}]
    config = gateway_config(workers, json_logs=json_logs, api_keys=keys)
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            await every_worker_up(gw)
            for path, body in (
                ("/completions", {"model": "demo", "prompt": "hi", "max_tokens": 2}),
                (
                    "/chat/completions",
                    {"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
                ),
            ):
                for headers in (
                    {"Authorization": f"Bearer {batch}"},
                    {"x-api-key": batch},
                    {"Authorization": f"Bearer {plain}"},
                ):
                    async with session.post(gw.openai_base + path, json=body, headers=headers) as r:
                        assert r.status == 200, await r.text()
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 6
    assert all(plain not in line and batch not in line for line in lines)
    if json_logs:
        named = [json.loads(line)["key"] for line in lines]
    else:
        named = [re.search(r' key=("[^"]*"|\S+) ', line).group(1) for line in lines]  # type: ignore[union-attr]
    unnamed = None if json_logs else "-"
    shown = "nightly batch" if json_logs else '"nightly batch"'
    assert named == [shown, shown, unnamed] * 2
