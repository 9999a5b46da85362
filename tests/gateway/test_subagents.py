"""Subagents through the gateway, with the official clients (issue 49): a subagent names its
parent (its CLI's header) and lands where the parent's prefix is cached."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from kvgate.gateway.dataplane.relay import REASON_HEADER, WORKER_HEADER
from kvgate.gateway.testing import GatewayHandle, running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until

from .conftest import every_worker_up, gateway_config, worker_fleet

pytestmark = pytest.mark.usefixtures("both_servers")

PREAMBLE = "You are a coding agent. Tools: read, write, run, search, test, lint. " * 40
TASK = "Refactor the billing module so invoices round per line item, then fix tests. " * 12
SUBTASK = "Subtask: fix the tax tests only."
SUBAGENT = {"x-claude-code-session-id": "sub-1", "x-claude-code-parent-agent-id": "lead-1"}


async def _agents_and_parent(gw: GatewayHandle) -> tuple[set[str], str, int]:
    """Four agents behind the preamble at once (it is cached on several workers), then the
    parent agent with its task, over OpenAI's API: their workers, the parent's and its prompt."""
    async with AsyncOpenAI(base_url=gw.openai_base, api_key="k", max_retries=0) as oai:

        async def agent(n: int) -> str:
            reply = await oai.chat.completions.with_raw_response.create(
                model="demo",
                max_tokens=200,
                messages=[
                    {"role": "system", "content": PREAMBLE},
                    {"role": "user", "content": f"agent {n}: update the changelog " * 20},
                ],
                extra_headers={"session_id": f"other-{n}"},
            )
            return reply.headers[WORKER_HEADER]

        homes = set(await asyncio.gather(*(agent(n) for n in range(4))))
        lead = await oai.chat.completions.with_raw_response.create(
            model="demo",
            max_tokens=4,
            messages=[{"role": "system", "content": PREAMBLE}, {"role": "user", "content": TASK}],
            extra_headers={"session_id": "lead-1"},
        )
    usage = lead.parse().usage
    assert usage is not None
    return homes, lead.headers[WORKER_HEADER], usage.prompt_tokens


async def _seen_idle(gw: GatewayHandle) -> None:
    """Wait until ``gw`` scraped every worker idle after now: a scrape taken while an agent
    still ran makes its worker look like the slower choice, rightly."""
    since = time.time()

    def idle() -> bool:
        signals = [w.routed.signals for w in gw.gateway.pool]
        return all(s is not None and s.scraped_at > since and not s.running for s in signals)

    await wait_until(idle, message="every worker scraped idle")


async def _subagent(gw: GatewayHandle, *turns: str) -> list[tuple[str, str, Any]]:
    """The subagent's turns over the Messages API (Claude Code's headers): its own session,
    its parent named, the parent's preamble and task, then its subtask; each turn's worker,
    route reason and usage."""
    out = []
    async with AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0) as claude:
        messages: list[dict[str, str]] = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            raw = await claude.messages.with_raw_response.create(
                model="demo", max_tokens=4, system=PREAMBLE, messages=messages,  # type: ignore[arg-type]
                extra_headers=SUBAGENT,
            )  # fmt: skip
            answer = await raw.parse()
            out.append((raw.headers[WORKER_HEADER], raw.headers[REASON_HEADER], answer.usage))
            messages.append({"role": "assistant", "content": answer.content[0].text})  # type: ignore[union-attr]
    return out


def _check(turns: list[tuple[str, str, Any]], parent: str, parent_prompt: int) -> None:
    (first, _, usage), (then, reason, _) = turns
    assert first == parent
    # What it shares with its parent is read from the parent's cache, not recomputed.
    assert (usage.cache_read_input_tokens or 0) >= parent_prompt - 64
    assert (then, reason) == (parent, "affinity_hit")  # then its own binding, made there


async def test_a_subagent_lands_where_its_parents_prefix_is_cached() -> None:
    async with worker_fleet(3) as fleet, running_gateway(gateway_config(fleet)) as gw:
        await every_worker_up(gw)
        homes, parent, prompt = await _agents_and_parent(gw)
        assert len(homes) > 1  # the preamble alone does not say where to go
        await _seen_idle(gw)
        turns = await _subagent(gw, TASK + SUBTASK, "Done: 3 tests fixed.")
    _check(turns, parent, prompt)


@pytest.mark.parametrize("policy", ["default", "ttft"])
async def test_a_subagent_through_another_replica_lands_where_its_parent_is(policy: str) -> None:
    """The subagent's replica has routed nothing yet (its policy learned nothing): the
    parent's binding in the shared store, not what the replica learned, takes it there,
    whichever policy routes (``core.route.under_parent``)."""
    store, chosen = MemoryStore(), {"name": policy}
    async with (
        worker_fleet(3) as fleet,
        running_gateway(gateway_config(fleet, policy=chosen), store=store) as first,
        running_gateway(gateway_config(fleet, policy=chosen), store=store) as second,
    ):
        await every_worker_up(first)
        await every_worker_up(second)
        homes, parent, prompt = await _agents_and_parent(first)
        assert len(homes) > 1
        await _seen_idle(second)
        turns = await _subagent(second, TASK + SUBTASK, "Done: 3 tests fixed.")
    _check(turns, parent, prompt)
