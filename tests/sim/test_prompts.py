"""Prompt structure to hashes: the gateway's text chain and the engine's block chain."""

from __future__ import annotations

import random

import pytest

from kvgate.core.prefix import FeatureConfig, build_features, text_chain_hashes
from kvgate.workload.prompts import PromptCodec, segment_text
from kvgate.workload.request import Segment, SimRequest


def random_prompt(rng: random.Random) -> list[Segment]:
    return [(rng.randrange(6), rng.randint(1, 300)) for _ in range(rng.randint(1, 8))]


def full_text(segments: list[Segment]) -> str:
    return "".join(segment_text(i, t * 4) for i, t in segments)


@pytest.mark.parametrize("max_blocks", [3, 64])
def test_text_hashes_equal_core_prefix_over_the_whole_text(max_blocks: int) -> None:
    cfg = FeatureConfig.model_validate({"max_blocks": max_blocks, "hash_seed": 7})
    codec = PromptCodec(16, cfg)
    rng = random.Random(4)
    for _ in range(300):
        segments = random_prompt(rng)
        expected = text_chain_hashes(full_text(segments), 256, max_blocks, 7)
        assert codec.text_hashes(segments) == expected


def test_features_match_what_the_gateway_builds_from_a_completions_body() -> None:
    codec = PromptCodec(16)
    request = SimRequest.of(0.0, "r1", ((3, 700), (9, 40)), 8)
    body = {"model": "sim", "prompt": full_text(list(request.segments))}
    live = build_features(body, {}, request_id="r1")
    simulated = codec.features_of(request)
    assert simulated.prefix_hashes == live.prefix_hashes
    assert simulated.prefix_key == live.prefix_key
    assert simulated.prompt_chars == live.prompt_chars


def test_session_ids_become_header_session_keys() -> None:
    codec = PromptCodec(16)
    request = SimRequest.of(0.0, "r1", ((3, 70),), 8, session_id="s-42", opening=1)
    features = codec.features_of(request)
    assert features.session_key == "s-42"
    assert features.affinity_key == "s-42"
    assert features.prefix_key is None


def test_prefix_key_depends_only_on_the_opening() -> None:
    codec = PromptCodec(16)
    first = SimRequest.of(0.0, "a", ((0, 500), (7, 30)), 8, opening=2)
    later = SimRequest.of(9.0, "b", ((0, 500), (7, 30), (8, 90), (9, 20)), 8, opening=2)
    other = SimRequest.of(9.0, "c", ((0, 500), (6, 30)), 8, opening=2)
    assert codec.features_of(first).prefix_key == codec.features_of(later).prefix_key
    assert codec.features_of(first).prefix_key != codec.features_of(other).prefix_key


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
        assert tight.text_hashes(segments) == roomy.text_hashes(segments)
