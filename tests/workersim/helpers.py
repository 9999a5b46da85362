"""Raw HTTP helpers for tests that look below the OpenAI client."""

from __future__ import annotations

from typing import Any

import aiohttp
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families


async def post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    """POST ``body`` as JSON (or ``raw`` bytes); the status and the decoded JSON answer."""
    async with aiohttp.ClientSession() as session:
        data = raw if raw is not None else None
        kwargs: dict[str, Any] = {"data": data} if raw is not None else {"json": body}
        if raw is not None:
            kwargs["headers"] = {"Content-Type": "application/json"}
        async with session.post(url, **kwargs) as response:
            return response.status, await response.json(content_type=None)


async def get_json(url: str) -> tuple[int, Any]:
    """GET ``url``; the status and the decoded JSON answer."""
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json(content_type=None)


async def scrape(url: str) -> dict[str, Metric]:
    """``GET /metrics`` parsed into families by name (counters lose ``_total``)."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(family: Metric, suffix: str = "", **labels: str) -> float:
    """The value of the family's one sample named ``name + suffix`` matching ``labels``."""
    values = [
        s.value
        for s in family.samples
        if s.name == family.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, (family.name, suffix, labels, family.samples)
    return values[0]


def assert_openai_error(body: Any, type_: str | None = None) -> dict[str, Any]:
    """``body`` has OpenAI's error shape; returns the inner error."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "code", "param"}, error
    assert isinstance(error["message"], str) and error["message"]
    if type_ is not None:
        assert error["type"] == type_
    return dict(error)
