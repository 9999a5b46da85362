"""The client's ``X-Request-ID`` is the client's: echoed, forwarded and logged, never
the key of the gateway's own books (the policy's queue estimates per worker)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from tests.gateway.conftest import every_worker_up, gateway_config, worker_fleet

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.base import candidates, route
from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.policy import RouteContext
from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until


class _Alternating(DefaultPolicy):
    """The default policy's books, each request on the next worker in turn (so two
    requests in flight at once are on two workers, whatever their estimates say)."""

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0
        self.ids: list[str] = []

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        cands = candidates(request, ctx)
        worker = cands[self.turn % len(cands)]
        self.turn += 1
        self.ids.append(request.request_id)
        return route(worker, "turn")


def _chat(tag: str) -> dict[str, Any]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": f"a question from {tag} " * 20}],
        "max_tokens": 4,
    }


def _books(policy: DefaultPolicy) -> dict[str, int]:
    """Requests each worker's book holds (in flight, or left behind)."""
    return {worker: len(book.sent) for worker, book in policy.speed.books.items()}


async def test_a_reused_request_id_leaves_no_phantom_work() -> None:
    policy = _Alternating()
    # Each answer takes a while: the two requests are in flight at once.
    async with (
        worker_fleet(2, extra_latency_ms=400.0) as fleet,
        running_gateway(gateway_config(fleet), policy=policy) as gw,
    ):
        await every_worker_up(gw)

        async def post(tag: str) -> tuple[int, str | None, str | None]:
            headers = {"X-Request-ID": "same-id"}
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    gw.openai_base + "/chat/completions", json=_chat(tag), headers=headers
                ) as resp,
            ):
                await resp.read()
                worker = resp.headers.get("X-Kvgate-Worker")
                return resp.status, resp.headers.get("X-Request-ID"), worker

        for _ in range(3):
            answers = await asyncio.gather(post("alice"), post("bob"))
            assert [status for status, _, _ in answers] == [200, 200]
            # The client's id comes back to it; the two went to two workers.
            assert [rid for _, rid, _ in answers] == ["same-id", "same-id"]
            assert len({worker for _, _, worker in answers}) == 2
            await wait_until(lambda: gw.gateway.proxy.in_flight == 0, message="both requests ended")
            # Both ended: no worker's book keeps queued work for either.
            assert sum(_books(policy).values()) == 0, _books(policy)
        # The gateway's own ids: one per request, none the client's.
        assert len(set(policy.ids)) == len(policy.ids) == 6
        assert "same-id" not in policy.ids
