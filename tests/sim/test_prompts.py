"""Prompt structure to hashes: the gateway's text chain and the engine's block chain."""

from __future__ import annotations

import random

from kvgate.core.prefix import build_features
from kvgate.workersim.options import WorkerOptions
from kvgate.workersim.protocol import Prompt
from kvgate.workersim.worker import Worker
from kvgate.workload.payloads import PayloadBuilder
from kvgate.workload.prompts import PromptCodec, segment_text
from kvgate.workload.request import Segment, SimRequest


def random_prompt(rng: random.Random) -> list[Segment]:
    return [(rng.randrange(6), rng.randint(1, 300)) for _ in range(rng.randint(1, 8))]


def full_text(segments: list[Segment]) -> str:
    return "".join(segment_text(i, t * 4) for i, t in segments)


def test_features_are_what_the_gateway_builds_from_the_replayed_body() -> None:
    """One function for both: the codec hands the live body to ``build_features``."""
    codec = PromptCodec(16)
    rng = random.Random(4)
    for n in range(100):
        segments = tuple(random_prompt(rng))
        request = SimRequest.of(0.0, f"r{n}", segments, 8)
        body = {"model": "sim", "prompt": full_text(list(segments))}
        live = build_features(body, {}, request_id=f"r{n}")
        simulated = codec.features_of(request)
        assert simulated.prefix_hashes == live.prefix_hashes
        assert simulated.prompt_chars == live.prompt_chars
        assert simulated.affinity_key is None


def test_chat_requests_are_hashed_as_the_chat_body_live_replay_sends() -> None:
    codec = PromptCodec(16)
    request = SimRequest.of(0.0, "c", ((1, 300), (2, 40), (3, 20), (4, 30)), 8, opening=2)
    payload = PayloadBuilder("sim").payload(request)
    live = build_features(payload.body, payload.headers, request_id="c")
    assert codec.features_of(request).prefix_hashes == live.prefix_hashes


def test_session_ids_become_header_session_keys() -> None:
    codec = PromptCodec(16)
    request = SimRequest.of(0.0, "r1", ((3, 70),), 8, session_id="s-42", opening=1)
    features = codec.features_of(request)
    assert features.session_key == "s-42"
    assert features.affinity_key == "s-42"


def test_engine_chains_agree_exactly_as_far_as_the_content() -> None:
    codec = PromptCodec(16)
    a = codec.engine_blocks([(1, 40), (2, 100)])
    b = codec.engine_blocks([(1, 40), (3, 100)])
    # Tokens 0..39 are shared: two full blocks; the third block mixes in segment 2 or 3.
    assert len(a) == len(b) == 140 // 16
    assert a[:2] == b[:2]
    assert all(x != y for x, y in zip(a[2:], b[2:], strict=True))
    # Cutting the same content into different segments changes nothing.
    assert codec.engine_blocks([(1, 40), (2, 100)]) == a


def test_reply_blocks_continue_the_chain_into_the_next_turn() -> None:
    codec = PromptCodec(16)
    prompt: list[Segment] = [(0, 50), (1, 30)]
    reply: Segment = (2, 70)
    chain, more = codec.engine_blocks_with_reply(prompt, reply)
    next_turn = codec.engine_blocks([*prompt, reply, (3, 20)])
    assert next_turn[: len(chain) + len(more)] == chain + more
    assert len(chain) == 80 // 16 and len(chain) + len(more) == 150 // 16


def test_memo_limit_does_not_change_results() -> None:
    rng = random.Random(9)
    prompts = [random_prompt(rng) for _ in range(200)]
    roomy = PromptCodec(8)
    tight = PromptCodec(8, memo_limit=3)
    for segments in prompts:
        assert tight.engine_blocks(segments) == roomy.engine_blocks(segments)


def test_a_reply_less_output_takes_the_blocks_the_emulated_worker_caches() -> None:
    """The simulator's engine caches a trace's answers as the emulated worker does.

    The worker hashes its own output past the prompt (vLLM caches generated blocks);
    nothing re-sends it, but it takes room, so the simulator must count it: without
    it the simulated caches evicted less than the live ones on the trace.
    """
    block = 16
    codec = PromptCodec(block)
    worker = Worker(WorkerOptions(block_size=block))
    rng = random.Random(4)
    for i in range(20):
        segments = random_prompt(rng)
        max_tokens = rng.randint(1, 200)
        request = SimRequest.of(0.0, f"r{i}", tuple(segments), max_tokens)
        body = PayloadBuilder("demo").payload(request).body
        live = worker.engine_request(f"r{i}", Prompt.of_text(body["prompt"]), max_tokens, None)
        assert live.prompt_tokens == request.prompt_tokens
        output = codec.engine_blocks_with_output(segments, None, max_tokens)[2]
        assert len(output) == len(live.output_block_hashes)
        assert len(output) == (request.prompt_tokens % block + max_tokens) // block
    # The output is the prompt's own: the same prompt, the same blocks; another, others.
    a = codec.engine_blocks_with_output([(1, 40)], None, 100)[2]
    assert codec.engine_blocks_with_output([(1, 40)], None, 100)[2] == a
    assert not set(a) & set(codec.engine_blocks_with_output([(2, 40)], None, 100)[2])
    # With a reply, the engine's output is the reply a next turn re-sends.
    assert (
        codec.engine_blocks_with_output([(1, 40)], (5, 70), 100)[2]
        == codec.engine_blocks_with_reply([(1, 40)], (5, 70))[1]
    )
