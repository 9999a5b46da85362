"""The live side of warm-ups: the gateway cuts the prefix out of the opening's own
body, sends it to the worker the policy names, owns it until it ends, and the next
request there finds the prefix cached."""

from __future__ import annotations

import json

import aiohttp

from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.policy import RouteContext
from kvgate.core.warmup import WarmUp
from kvgate.gateway.testing import running_gateway
from kvgate.testing import wait_until
from kvgate.types import Seconds, WorkerId
from kvgate.workersim.runner import WorkerHandle

from .conftest import gateway_config
from .test_routing_wiring import chat

SYSTEM = {"role": "system", "content": "You answer in the house style, briefly. " * 60}


class WarmsTheOther(DefaultPolicy):
    """The default policy placing every request on a chosen worker, and asking, after
    the first, to warm that request's system prompt on the other one."""

    def __init__(self, first: str, other: str) -> None:
        super().__init__()
        self.first, self.other = WorkerId(first), WorkerId(other)
        self.target = self.first
        self.done: list[tuple[str, int, int]] = []
        self._opening: RequestFeatures | None = None

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        if self._opening is None:
            self._opening = request
        return Decision(self.target, "fixed")

    def openers(self) -> list[str]:
        return [self._opening.request_id] if self._opening is not None else []

    def warm_up(self, worker: WorkerId, ctx: RouteContext) -> WarmUp | None:
        if self._opening is None or self.done or worker != self.first:
            return None
        chars = len("system") + 1 + len(SYSTEM["content"])  # the system message's text
        prefix = RequestFeatures(request_id="w1", model="demo", prompt_chars=chars)
        return WarmUp(self.other, prefix, self._opening.request_id)

    def on_warm_done(
        self, request: RequestFeatures, worker: WorkerId, prompt: int, cached: int, now: Seconds
    ) -> None:
        self.done.append((worker, prompt, cached))
        super().on_warm_done(request, worker, prompt, cached, now)


async def test_a_warm_up_is_sent_owned_and_makes_the_next_request_hit(
    workers: list[WorkerHandle],
) -> None:
    first, other = workers[0].url, workers[1].url
    policy = WarmsTheOther(first, other)
    async with (
        running_gateway(gateway_config(workers), policy=policy) as gw,
        aiohttp.ClientSession() as session,
    ):
        question = {"role": "user", "content": "What is a KV cache?"}
        headers, _ = await chat(session, gw.openai_base, [SYSTEM, question], request_id="o1")
        assert headers["X-Kvgate-Worker"] == first
        await wait_until(lambda: bool(policy.done), message="the warm-up to end")
        worker, prompt, cached = policy.done[0]
        assert worker == other and prompt > 0 and cached == 0  # computed there, cold
        pool = gw.gateway.pool
        assert all(w.in_flight == 0 for w in pool)  # its lease was given back
        assert gw.gateway.warm_ups.in_flight == 0
        # The next opening behind the same system prompt, sent there, hits it.
        policy.target = policy.other
        another = {"role": "user", "content": "And paged attention?"}
        _, raw = await chat(session, gw.openai_base, [SYSTEM, another], request_id="o2")
        usage = json.loads(raw)["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= prompt // 2
        metrics = await (await session.get(gw.url + "/metrics")).text()
    assert 'kvgate_warm_ups_total{outcome="sent"} 1.0' in metrics
    assert "kvgate_warm_up_prefill_tokens_total" in metrics
