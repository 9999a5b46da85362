"""Timings of the KV-event path: tokenizing a prompt, and a decision on the exact index.

``benchmarks/kv_events_bench.py`` prints them. Tokenizing is what a request costs
before routing with ``tokenizers: {kind: hf}``, and hashing its tokens into the
engine's block chain happens once with it; the decision is the exact index's match
(every worker's depth along that chain) plus the default policy's ``pick`` with
that residency, on a fleet whose workers each hold many chains, by a policy that has
routed as many chats before (the request's own among them: its approximate index holds
a deep match, which a fleet that all publishes events need not look up).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from kvgate.core.chain import pieces_chain_hashes
from kvgate.core.exact_index import ExactIndex
from kvgate.core.features import RequestFeatures, request_features
from kvgate.core.fleet import FleetSnapshot, WorkerState
from kvgate.core.policies.default import DefaultPolicy
from kvgate.core.policy import Resident, RouteContext
from kvgate.core.prefix import FeatureConfig, chat_canonical_pieces
from kvgate.engine.blocks import chain_hashes


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50, p99 and max of timings, in microseconds."""
    ordered = sorted(samples_ns)
    n = len(ordered)
    return {
        "p50_us": ordered[n // 2] / 1000,
        "p99_us": ordered[min(n - 1, int(n * 0.99))] / 1000,
        "max_us": ordered[-1] / 1000,
    }


def timed(call: Callable[[], object], runs: int) -> dict[str, float]:
    """``call``'s wall time over ``runs`` calls (after one warm-up), and its CPU time
    (the thread's): on a shared machine the wall time's tail is other processes' turns
    at the CPU, the CPU time is the call's own. ``all_cpu_p50_us``: the process's, every
    thread's (a library's own worker threads: fastokens splits an input of 16 segments
    or more across its pool)."""
    call()
    wall, cpu, every = [], [], []
    clock, thread, process = time.perf_counter_ns, time.thread_time_ns, time.process_time_ns
    for _ in range(runs):
        start, used, all_used = clock(), thread(), process()
        call()
        cpu.append(thread() - used)
        every.append(process() - all_used)
        wall.append(clock() - start)
    every.sort()
    return (
        percentiles(wall)
        | {f"cpu_{k}": v for k, v in percentiles(cpu).items()}
        | {"all_cpu_p50_us": every[len(every) // 2] / 1000}
    )


_WORDS = """river stone lantern orchard copper meadow harbor violet thunder cedar glacier compass
velvet ember falcon quarry saddle beacon willow prism, the of and to is in that it was for on"""


def chat_shaped(text: Callable[[int], str], count_words: int) -> list[dict[str, str]]:
    """A system prompt, a question, an answer and a question of ``count_words`` words in
    all, each ``text(n)`` words long."""
    third = count_words // 3
    return [
        {"role": "system", "content": text(third)},
        {"role": "user", "content": text(third // 2)},
        {"role": "assistant", "content": text(third // 2)},
        {"role": "user", "content": text(third)},
    ]


def chat_of_tokens(count_words: int, seed: int = 0) -> list[dict[str, str]]:
    """A chat of about ``count_words`` words: a system prompt, turns, a question."""
    rng = random.Random(seed)
    words = _WORDS.split()
    return chat_shaped(lambda n: " ".join(rng.choice(words) for _ in range(n)), count_words)


def exact_decision(
    *,
    workers: int = 64,
    chains_per_worker: int = 200,
    prompt_tokens: int = 4096,
    block_size: int = 16,
    runs: int = 2000,
    seed: int = 1,
) -> dict[str, dict[str, float]]:
    """Lookup and ``pick`` timings on an exact index of ``workers`` workers."""
    rng = random.Random(seed)
    index = ExactIndex()
    ids = [f"http://10.0.{i // 16}.{i % 16}:8000" for i in range(workers)]
    shared = [[rng.randrange(262_144) for _ in range(2048)] for _ in range(16)]
    prompts = []
    for _ in range(chains_per_worker * workers // 8):
        base = rng.choice(shared)
        prompts.append(base + [rng.randrange(262_144) for _ in range(prompt_tokens - len(base))])
    for i, worker in enumerate(ids):
        for tokens in prompts[i :: max(1, workers // 8)][:chains_per_worker]:
            keys = chain_hashes(tokens, block_size)
            index.store(worker, keys, keys, block_size)
    fleet = FleetSnapshot(
        0.0,
        tuple(
            WorkerState(id=w, model="m", in_flight=rng.randrange(0, 24), waiting=0,
                        kv_usage=rng.uniform(0.2, 0.8), kv_capacity_tokens=500_000)
            for w in ids
        ),
    )  # fmt: skip
    policy, approximate = DefaultPolicy(), DefaultPolicy()
    config = FeatureConfig()
    # Both policies have routed (and heard back from) as many chats as the fleet
    # holds chains: their approximate indexes are as full as a running gateway's.
    for n in range(chains_per_worker * workers // 8):
        done, _ = chat_canonical_pieces(chat_of_tokens(3000, seed + n % 500))
        routed = request_features(
            f"w{n}", "m", prompt_chars=sum(map(len, done)),
            prefix_hashes=pieces_chain_hashes(done, config.block_chars, config.max_blocks,
                                              coarse_factor=config.coarse_factor),
        )  # fmt: skip
        for warmed in (policy, approximate):
            warmed.on_routed(routed, ids[n % workers], float(n))
            warmed.on_usage(routed, ids[n % workers], 3000, 0, float(n) + 0.5)
    messages = chat_of_tokens(3000, seed)
    pieces, _ = chat_canonical_pieces(messages)
    hashes = pieces_chain_hashes(
        pieces, config.block_chars, config.max_blocks, coarse_factor=config.coarse_factor
    )
    chars = sum(map(len, pieces))
    picks = [rng.choice(prompts) for _ in range(64)]
    exact = frozenset(ids)
    chains = {id(p): chain_hashes(p, block_size) for p in picks}  # hashed with the tokens
    # Each request's features come with its tokens, before the decision (not timed).
    tokens_of = [tuple(p) for p in picks]
    requests = [
        (request_features(f"r{n}", "m", prefix_hashes=hashes, prompt_chars=chars,
                          token_ids=tokens_of[n % len(picks)]), picks[n % len(picks)])
        for n in range(2 * runs + 2)
    ]  # fmt: skip
    state = {"n": 0}

    def request() -> tuple[RequestFeatures, list[int]]:
        state["n"] += 1
        return requests[state["n"] % len(requests)]

    def resident(features: RequestFeatures, chain: list[int]) -> Resident:
        held = [(depth * block_size, w) for depth, w in index.match_groups(chain)]
        return Resident.of_tokens(held, len(features.token_ids), features.prompt_chars, exact)

    def hashing() -> None:
        chain_hashes(picks[0], block_size)

    def lookup() -> None:
        features, tokens = request()
        resident(features, chains[id(tokens)])

    def decide() -> None:
        features, tokens = request()
        ctx = RouteContext(fleet, None, rng, {}, resident(features, chains[id(tokens)]))
        policy.pick(features, ctx)

    def decide_approximate() -> None:
        features, _ = request()
        approximate.pick(features, RouteContext(fleet, None, rng, {}))

    return {
        "hash_tokens": timed(hashing, runs),
        "decision_approximate": timed(decide_approximate, runs),
        "lookup": timed(lookup, runs),
        "decision": timed(decide, runs),
        "index": {"blocks": float(len(index)), "workers": float(workers)},
    }


async def store_lookup(url: str, blocks: int = 256, runs: int = 500) -> dict[str, float]:
    """The other way replicas could share an exact index: in Redis, one key per block
    (its holders' bitmask). A lookup is one pipelined ``MGET`` of a prompt's blocks;
    timed here against ``url`` (a local Redis: the round trip's floor)."""
    import redis.asyncio as redis

    client = redis.from_url(url)
    keys = [f"kvx:{i}" for i in range(blocks)]
    await client.mset({k: str(1 << (i % 64)) for i, k in enumerate(keys)})
    await client.mget(keys)
    samples = []
    clock = time.perf_counter_ns
    for _ in range(runs):
        start = clock()
        await client.mget(keys)
        samples.append(clock() - start)
    await client.aclose()
    return percentiles(samples)
