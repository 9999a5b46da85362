"""Offload, restore and migration through the real gateway on emulated llama.cpp workers.

The same story as ``tests/realengine/test_offload.py`` with ``kvgate worker-sim``
workers emulating llama.cpp's slot API (``--slots 1``, one shared save folder)
instead of real ones: fast, no model. Three sessions on two one-slot workers:
a slot is reused by another session, its holder saved first, and that session's
next turn is served from the restored KV; then the worker holding a session is
drained and the session's next turn moves to the other worker with its KV. The
workers' model clock (``usage.kvgate_timing``, ``cpu-small``: llama.cpp's speed)
shows the restored turn's prefill is a fraction of the first turn's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.testing import wait_until
from kvgate.workersim import WorkerHandle, WorkerOptions, running_worker

SESSIONS = ("a", "b", "c")


@dataclass(frozen=True, slots=True)
class Turn:
    session: str
    worker: str
    tier: str
    prompt_tokens: int
    cached_tokens: int
    model_ttft_s: float


@contextlib.asynccontextmanager
async def emulated_fleet(
    folder: Path, count: int, slots: int = 1
) -> AsyncIterator[list[WorkerHandle]]:
    """``count`` emulated llama.cpp workers of ``slots`` slots, saving into ``folder``."""
    options = WorkerOptions(
        port=0,
        profile="cpu-small",
        time_scale=200.0,
        seed=3,
        slots=slots,
        slot_save_path=str(folder),
    )
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(running_worker(options.model_copy(update={"seed": i})))
            for i in range(count)
        ]


class Conversation:
    def __init__(self, http: aiohttp.ClientSession, url: str, session: str, seed: int) -> None:
        self.http, self.url, self.session = http, url, session
        words = " ".join(f"s{seed}w{i}" for i in range(400))
        self.messages: list[dict[str, str]] = [{"role": "user", "content": words}]

    async def turn(self, question: str | None = None) -> Turn:
        if question is not None:
            self.messages.append({"role": "user", "content": question})
        body = {"model": "demo", "messages": self.messages, "max_tokens": 2}
        async with self.http.post(
            self.url + "/v1/chat/completions", json=body, headers={"X-Session-ID": self.session}
        ) as response:
            assert response.status == 200, await response.text()
            answer: dict[str, Any] = await response.json()
            headers = response.headers
        self.messages.append(
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
        )
        usage = answer["usage"]
        return Turn(
            self.session,
            headers["X-Kvgate-Worker"],
            headers["X-Kvgate-KV-Tier"],
            usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"],
            usage["kvgate_timing"]["ttft_s"],
        )


def _metric(gateway: GatewayHandle, name: str, **labels: str) -> float:
    return sum(
        s.value
        for family in gateway.gateway.metrics.registry.collect()
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


async def test_offload_restore_and_migration_on_emulated_llamacpp_workers(tmp_path: Path) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    async with emulated_fleet(folder, 2) as workers:
        config = {
            "workers": [{"url": w.url, "engine": "llamacpp"} for w in workers],
            "policy": {"name": "default"},
            "health": {"interval_s": 0.2, "timeout_s": 2.0},
            "slots": {"dir": str(folder), "max_saved": 4},
            "expose_worker_urls": True,
        }
        async with running_gateway(config) as gateway, aiohttp.ClientSession() as http:
            await wait_until(gateway.gateway.ready, timeout=30, message="gateway ready")
            talks = {s: Conversation(http, gateway.url, s, i) for i, s in enumerate(SESSIONS)}
            first = {s: await talks[s].turn() for s in SESSIONS}
            second = {s: await talks[s].turn("Which word came first?") for s in SESSIONS}

            for turn in first.values():
                assert turn.tier == "recompute" and turn.cached_tokens == 0, turn
            restored = [t for t in second.values() if t.tier == "disk"]
            assert restored, second
            assert _metric(gateway, "kvgate_slot_saves_total", result="ok") >= 1
            assert _metric(gateway, "kvgate_slot_restores_total", result="ok") >= len(restored)
            for turn in second.values():
                opened = first[turn.session]
                assert turn.tier in ("slot", "disk"), turn
                assert turn.cached_tokens >= 0.9 * opened.prompt_tokens, (opened, turn)
            for turn in restored:
                # Only the new question is computed: a fraction of the first turn's prefill.
                assert turn.model_ttft_s < 0.25 * first[turn.session].model_ttft_s, turn

            last = second[SESSIONS[-1]]
            source = gateway.gateway.pool.get(last.worker)
            assert source is not None
            assert gateway.gateway.pressure.set_admin_drain(source, True)
            moved = await talks[last.session].turn("And which came last?")
            assert moved.worker != last.worker
            assert moved.tier == "migrated", moved
            assert moved.cached_tokens >= 0.9 * last.prompt_tokens, (last, moved)
            migrations = _metric(
                gateway,
                "kvgate_slot_migrations_total",
                from_worker=last.worker,
                to_worker=moved.worker,
                result="ok",
            )
            assert migrations == 1
            assert _metric(gateway, "kvgate_slot_recompute_fallbacks_total") == 0
            assert _metric(gateway, "kvgate_slot_saved_bytes") > 0
        files = sorted(folder.glob("kvgate-*.bin"))
        assert 1 <= len(files) <= 4, files
