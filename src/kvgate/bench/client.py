"""The benchmark's one boundary to the network: a streamed OpenAI request, measured.

``BenchClient.send`` posts one ``Payload`` and reads the server-sent events to
the end, noting when the first content arrived, the final ``usage``, the text
answered and the gateway's ``X-Kvgate-*`` headers. Every failure (refused
connection, non-200 answer, broken stream, timeout) becomes an ``Answer`` with
an error, never an exception: one bad request must not end a benchmark.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvgate.bench.payloads import Payload

WORKER_HEADER = "X-Kvgate-Worker"
REASON_HEADER = "X-Kvgate-Route-Reason"
TIER_HEADER = "X-Kvgate-KV-Tier"
GATEWAY_ID_HEADER = "X-Kvgate-Request-ID"

_ERROR_BODY_CHARS = 300


@dataclass(slots=True)
class Answer:
    """What one request got back; times are ``loop.time()`` instants."""

    sent: float
    finished: float = 0.0
    first_token: float | None = None
    status: int = 0
    """HTTP status; 0 when no answer came (connection refused, reset, timeout)."""
    error: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    worker: str | None = None
    reason: str | None = None
    kv_tier: str | None = None
    """Where a pinned llama.cpp slot's KV came from (``X-Kvgate-KV-Tier``: slot, disk,
    migrated, shared, recompute, fallback); ``None`` where the gateway pins no slots."""
    gateway_id: str | None = None
    """The gateway's own id of the request (``X-Kvgate-Request-ID``): the key of what it
    predicted and observed of it (``FleetSpeed.log``)."""
    worker_ttft: float | None = None
    """The worker's own TTFT (model seconds), when it reports ``kvgate_timing``."""
    served_by: str | None = None
    """Who served it by the worker's own report (``kvgate_timing.worker``), whatever the
    router in front says (``worker`` is the gateway's ``X-Kvgate-Worker`` header)."""
    text: str = ""

    @property
    def ok(self) -> bool:
        """True when the whole answer streamed without error."""
        return self.error is None and self.status == 200


def _content(chunk: dict[str, Any], chat: bool) -> str:
    """The generated text in one stream chunk (chat ``delta.content`` or completion ``text``)."""
    choices = chunk.get("choices") or ()
    if not choices:
        return ""
    choice = choices[0]
    if chat:
        delta = choice.get("delta") or {}
        return str(delta.get("content") or "")
    return str(choice.get("text") or "")


def _read_usage(answer: Answer, usage: dict[str, Any]) -> None:
    answer.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    answer.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    answer.cached_tokens = int(cached) if cached is not None else None
    timing = usage.get("kvgate_timing")
    if isinstance(timing, dict) and "ttft_s" in timing:
        answer.worker_ttft = float(timing["ttft_s"])
        served_by = timing.get("worker")
        answer.served_by = str(served_by) if served_by is not None else None


class BenchClient:
    """One aiohttp session to the target, at most ``concurrency`` connections."""

    def __init__(
        self,
        base_url: str,
        *,
        concurrency: int = 64,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.base_url = normalize_target(base_url)
        self.concurrency = concurrency
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clock = clock or asyncio.get_running_loop().time
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> BenchClient:
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers=self._headers
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (only inside ``async with``)."""
        if self._session is None:
            raise RuntimeError("BenchClient is not open; use 'async with'")
        return self._session

    async def first_model(self) -> str:
        """The first model ``GET /v1/models`` lists (what to ask for when none is given)."""
        async with self.session.get(self.base_url + "/v1/models") as resp:
            if resp.status != 200:
                raise RuntimeError(f"GET /v1/models answered {resp.status}")
            data = await resp.json()
        models = data.get("data") or []
        if not models:
            raise RuntimeError("the target lists no models")
        return str(models[0]["id"])

    async def send(self, payload: Payload) -> Answer:
        """Post ``payload`` and stream the answer to its end."""
        answer = Answer(sent=self._clock())
        try:
            async with self.session.post(
                self.base_url + payload.path, json=payload.body, headers=payload.headers
            ) as resp:
                answer.status = resp.status
                answer.worker = resp.headers.get(WORKER_HEADER)
                answer.reason = resp.headers.get(REASON_HEADER)
                answer.kv_tier = resp.headers.get(TIER_HEADER)
                answer.gateway_id = resp.headers.get(GATEWAY_ID_HEADER)
                if resp.status != 200:
                    body = await resp.text(errors="replace")
                    answer.error = f"HTTP {resp.status}: {_error_message(body)}"
                else:
                    await self._read_stream(resp, answer, payload.chat)
        except TimeoutError:
            answer.error = "timeout"
        except aiohttp.ClientError as exc:
            answer.error = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # aiohttp's reader refuses an over-long line
            answer.error = f"unreadable stream: {exc}"
        answer.finished = self._clock()
        return answer

    async def _read_stream(self, resp: aiohttp.ClientResponse, answer: Answer, chat: bool) -> None:
        parts: list[str] = []
        done = False
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                answer.error = "malformed stream event"
                return
            if "error" in chunk:
                answer.error = f"stream error: {_error_message(json.dumps(chunk))}"
                return
            text = _content(chunk, chat)
            if text:
                if answer.first_token is None:
                    answer.first_token = self._clock()
                parts.append(text)
            usage = chunk.get("usage")
            if usage:
                _read_usage(answer, usage)
        answer.text = "".join(parts)
        if not done:
            answer.error = "stream ended before [DONE]"


def _error_message(body: str) -> str:
    """The OpenAI error message in ``body``, or the body's start."""
    try:
        data = json.loads(body)
        message = data["error"]["message"]
        return str(message)[:_ERROR_BODY_CHARS]
    except (ValueError, KeyError, TypeError):
        return body[:_ERROR_BODY_CHARS]


def normalize_target(url: str) -> str:
    """The target's base URL without a trailing ``/`` or ``/v1``."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"target must be an http(s) URL, got {url!r}")
    return url.removesuffix("/v1")
