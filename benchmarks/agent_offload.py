"""An agent back from a long tool call on two real llama.cpp workers: restore vs recompute.

Two workers of one slot each (Gemma 3 270M), behind the gateway with slot offload on.
An agent session (``x-claude-code-session-id``) sends its first turn: a shared tool
preamble and its task, ``--words`` words in all. Its tool then runs "for a long time":
meanwhile four other agents' turns, sent at once, take both workers' slots, so the
gateway saves the first agent's slot to disk before its slot is reused. The agent comes
back with the tool's result appended (``restore``): its KV is restored from the saved
slot and only the result is computed. The same prompt under a session that shares nothing
(``recompute``: its first word differs) is what the return costs without the saved
slot. Interleaved, ``--repeats`` times; TTFT is the wall time of a one-token answer
through the gateway (save and restore calls included).

    .venv/bin/python benchmarks/agent_offload.py [--words 2500] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from kvgate.gateway.testing import running_gateway
from kvgate.realengine import DEFAULT_MODEL_NAME, running_llamacpp_fleet
from kvgate.realengine.process import small_options
from kvgate.testing import wait_until

WORDS = (
    "river", "stone", "lantern", "orchard", "copper", "meadow", "harbor", "violet",
    "thunder", "cedar", "glacier", "compass", "velvet", "ember", "falcon", "quarry",
)  # fmt: skip


def text(seed: int, words: int) -> str:
    """``words`` seeded words (about one Gemma token each)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def turn(
    client: AsyncOpenAI, session: str, messages: list[Any]
) -> tuple[float, str, int, int]:
    """One one-token answer: (TTFT seconds, KV tier, prompt tokens, cached tokens)."""
    started = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=1,
        temperature=0,
        extra_headers={"x-claude-code-session-id": session},
    )
    ttft = time.perf_counter() - started
    usage = raw.parse().usage
    assert usage is not None
    details = usage.prompt_tokens_details
    cached = (details.cached_tokens or 0) if details is not None else 0
    return ttft, raw.headers.get("X-Kvgate-KV-Tier", "-"), usage.prompt_tokens, cached


async def run(args: argparse.Namespace, root: Path) -> dict[str, list[tuple[float, str, int, int]]]:
    """Every repeat: the agent's first turn, two others taking the slots, restore, recompute."""
    slot_dir = root / "slots"
    options = small_options(parallel=1, ctx=args.words + 1_024, cache_ram_mib=0)
    config = {
        "workers": [],
        "policy": {"name": "default"},
        "health": {"interval_s": 0.5, "timeout_s": 5.0},
        "timeouts": {"first_byte_s": 600, "total_s": 900},
        "slots": {"enabled": True, "dir": str(slot_dir), "max_saved": 32},
    }
    out: dict[str, list[tuple[float, str, int, int]]] = {"restore": [], "recompute": []}
    async with running_llamacpp_fleet(2, options, workdir=root / "w", slot_dir=slot_dir) as fleet:
        config["workers"] = [{"url": url, "engine": "llamacpp"} for url in fleet.urls]
        async with running_gateway(config) as gateway:
            await wait_until(gateway.gateway.ready, timeout=60, message="gateway ready")
            async with AsyncOpenAI(base_url=gateway.url + "/v1", api_key="k") as client:
                preamble = "Tools: " + text(1, args.words - 100)
                for rep in range(args.repeats):
                    agent = f"agent-{rep}"
                    messages: list[Any] = [
                        {"role": "system", "content": preamble},
                        {"role": "user", "content": "Task: " + text(100 + rep, 60)},
                    ]
                    await turn(client, agent, messages)
                    messages.append({"role": "assistant", "content": "run ls"})
                    # The tool runs; four other agents' turns, at once, take both workers'
                    # slots (so the first agent's is taken whatever the placement).
                    await asyncio.gather(
                        *(
                            turn(
                                client,
                                f"other-{rep}-{other}",
                                [{"role": "user", "content": text(1_000 + 10 * rep + other, 40)}],
                            )
                            for other in range(4)
                        )
                    )
                    messages.append({"role": "user", "content": "Result: " + text(7 + rep, 40)})
                    out["restore"].append(await turn(client, agent, messages))
                    fresh = [{"role": "system", "content": f"Z{rep} {preamble}"}, *messages[1:]]
                    out["recompute"].append(await turn(client, f"fresh-{rep}", fresh))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=2_500, help="the agent's context size")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(run(args, Path(tmp)))
    for case, turns in out.items():
        for ttft, tier, prompt, cached in turns:
            ms = ttft * 1000
            print(f"{case:9s} ttft {ms:8.0f} ms  tier {tier:9s} prompt {prompt} cached {cached}")
    restore = statistics.median(t[0] for t in out["restore"])
    recompute = statistics.median(t[0] for t in out["recompute"])
    print(f"median restore {restore * 1000:.0f} ms, recompute {recompute * 1000:.0f} ms, "
          f"ratio {restore / recompute:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
