"""The quality evaluator: scores a sample of canary responses, off the request path.

The proxy hands over a sampled response (request and response bodies) with
``submit``, which never waits: past ``max_pending`` waiting samples it drops
them. A few background tasks score each one, by POSTing it to the configured
endpoint (which answers ``{"score": <float>}``) or by calling a Python entry
point ``module:function`` with the same mapping, and report the score; the
rollout's quality gate compares the mean with its floor.

What the evaluator receives::

    {"model": "llama-3-8b", "version": "v3.0",
     "request": {...}, "response": {...},          # the JSON bodies
     "request_text": "...", "response_text": "..."} # prompt and answer as text
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import aiohttp

from kvgate.gateway.control.config import EvaluatorConfig
from kvgate.gateway.observe.metrics import RolloutMetrics
from kvgate.tasks import cancel_and_wait

log = logging.getLogger("kvgate.gateway.control.evaluator")

ScoreFunction = Callable[[Mapping[str, Any]], float | Awaitable[float]]
ScoreListener = Callable[[str, str, float], None]


@dataclass(frozen=True, slots=True)
class Sample:
    """One sampled response waiting to be scored."""

    model: str
    version: str
    request: bytes
    response: bytes

    def payload(self) -> dict[str, Any]:
        """What the evaluator receives (see the module docstring)."""
        request = _json(self.request)
        response = _json(self.response)
        return {
            "model": self.model,
            "version": self.version,
            "request": request,
            "response": response,
            "request_text": request_text(request),
            "response_text": response_text(response),
        }


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def request_text(body: Any) -> str:
    """The prompt of an OpenAI request body as plain text (messages joined by newlines)."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(
                    str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
                )
        return "\n".join(parts)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def response_text(body: Any) -> str:
    """The first choice's text of an OpenAI response body."""
    if not isinstance(body, dict):
        return ""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return str(message["content"])
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def resolve_entry_point(spec: str) -> ScoreFunction:
    """Import ``module:function``; ``ValueError`` naming what is missing."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"evaluator entry point {spec!r}: cannot import {module_name!r}: {exc}"
        ) from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ValueError(f"evaluator entry point {spec!r}: {attr!r} is not a function")
    return cast(ScoreFunction, function)


class QualityEvaluator:
    """Bounded queue of samples and the tasks that score them."""

    def __init__(
        self, config: EvaluatorConfig, on_score: ScoreListener, metrics: RolloutMetrics
    ) -> None:
        self.config = config
        self.on_score = on_score
        self.metrics = metrics
        self._function = (
            resolve_entry_point(config.entry_point) if config.entry_point is not None else None
        )
        self._queue: asyncio.Queue[Sample] = asyncio.Queue(maxsize=config.max_pending)
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    def submit(self, model: str, version: str, request: bytes, response: bytes) -> bool:
        """Queue one response for scoring; False (dropped) when the queue is full."""
        try:
            self._queue.put_nowait(Sample(model, version, request, response))
        except asyncio.QueueFull:
            return False
        return True

    def start(self) -> None:
        """Start the scoring tasks."""
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._run(), name=f"kvgate-evaluator-{i}")
            for i in range(self.config.concurrency)
        ]

    async def stop(self) -> None:
        """Stop scoring; samples still queued are dropped."""
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        while True:
            sample = await self._queue.get()
            try:
                score = await asyncio.wait_for(self.score(sample), self.config.timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.metrics.quality_scores.labels(sample.model, sample.version, "failed").inc()
                log.warning("quality evaluator failed on a %s sample: %s", sample.version, exc)
                continue
            self.metrics.quality_scores.labels(sample.model, sample.version, "scored").inc()
            self.on_score(sample.model, sample.version, score)

    async def score(self, sample: Sample) -> float:
        """One sample's score from the endpoint or the entry point."""
        payload = sample.payload()
        function = self._function
        if function is not None:
            if inspect.iscoroutinefunction(function):
                value = await function(payload)
            else:
                # A plain function may be slow (a model): keep it off the event loop.
                value = await asyncio.to_thread(function, payload)
                if inspect.isawaitable(value):
                    value = await value
        else:
            assert self.config.url is not None
            if self._session is None:
                self._session = aiohttp.ClientSession()
            async with self._session.post(self.config.url, json=payload) as resp:
                if resp.status != 200:
                    raise ValueError(f"evaluator answered HTTP {resp.status}")
                body = await resp.json(content_type=None)
            value = body.get("score") if isinstance(body, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"evaluator returned {value!r}, not a number")
        if not math.isfinite(value):
            raise ValueError(f"evaluator returned {value!r}")
        return float(value)
