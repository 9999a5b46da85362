"""The follower's verdicts on sequence numbers, and the exact index fed by events."""

from __future__ import annotations

import random

import pytest

from kvgate.core.exact_index import ExactIndex, ExactIndexConfig
from kvgate.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Follower, Offer
from kvgate.core.policy import Resident
from kvgate.engine.blocks import chain_hashes


def test_follower_applies_in_order_and_asks_for_gaps() -> None:
    f = Follower()
    assert f.offer(0) is Offer.APPLY
    f.applied(0)
    assert f.offer(1) is Offer.APPLY
    f.applied(1)
    assert f.offer(4) is Offer.GAP
    assert f.replay_from() == 2


def test_a_late_follower_replays_from_zero() -> None:
    f = Follower()
    assert f.offer(7) is Offer.GAP
    assert f.replay_from() == 0


def test_duplicates_of_a_replay_are_stale_and_a_sequence_back_below_is_a_restart() -> None:
    f = Follower()
    for seq in range(10):
        f.applied(seq)
    f.replayed(5)  # a replay brought 5..9; live 6..9 may still be queued
    assert f.offer(6) is Offer.STALE
    assert f.offer(3) is Offer.RESTART  # below what any replay brought: a new process
    f.reset()
    assert f.offer(0) is Offer.APPLY


def test_a_sequence_back_with_no_replay_is_a_restart_even_if_zero_was_missed() -> None:
    f = Follower()
    for seq in range(100):
        f.applied(seq)
    assert f.offer(3) is Offer.RESTART
    assert f.restarts == 1


def _stored(tokens: list[int], size: int, parent: int | None, names: list[int]) -> BlockStored:
    return BlockStored(tuple(names), parent, tuple(tokens), size, None, "GPU")


def test_blocks_are_keyed_by_their_tokens_whatever_the_engine_calls_them() -> None:
    index = ExactIndex()
    tokens = list(range(64))
    # The engine names its blocks 101, 102, ... (opaque); the index keys them by tokens.
    index.apply("w1", [_stored(tokens[:32], 16, None, [101, 102])])
    index.apply("w1", [_stored(tokens[32:48], 16, 102, [103])])
    index.apply("w2", [_stored(tokens[:16], 16, None, [b"\x01"])])
    assert index.held_tokens(tokens) == {"w1": 48, "w2": 16}
    assert index.match(chain_hashes(tokens, 16)) == {"w1": 3, "w2": 1}
    index.apply("w1", [BlockRemoved((102,), "GPU")])
    assert index.held_tokens(tokens) == {"w1": 16, "w2": 16}
    index.apply("w2", [AllBlocksCleared()])
    assert index.held_tokens(tokens) == {"w1": 16}
    assert index.tracks("w2") and index.blocks("w2") == 0


def test_unknown_parents_lora_and_offloaded_blocks_are_not_counted() -> None:
    index = ExactIndex()
    tokens = list(range(32))
    index.apply("w", [_stored(tokens[16:], 16, 999, [2])])  # parent never seen
    index.apply("w", [BlockStored((3,), None, tuple(tokens[:16]), 16, 7, "GPU")])
    index.apply("w", [BlockStored((4,), None, tuple(tokens[:16]), 16, None, "CPU")])
    assert index.held_tokens(tokens) == {}
    assert index.orphans == 1 and index.ignored == 2


def test_a_worker_is_bounded_and_drops_its_oldest_blocks_first() -> None:
    index = ExactIndex(ExactIndexConfig(max_worker_blocks=4))
    tokens = list(range(16 * 6))
    keys = chain_hashes(tokens, 16)
    index.store("w", list(range(6)), keys, 16)
    assert index.blocks("w") == 4 and index.trimmed == 2
    assert index.depth("w", keys) == 0  # the chain's head went first, as stored first
    assert index.depth("w", keys[2:]) == 4


def test_the_same_engine_hash_stored_again_replaces_its_key() -> None:
    index = ExactIndex()
    a, b = chain_hashes(list(range(16)), 16), chain_hashes(list(range(1, 17)), 16)
    index.store("w", [5], a, 16)
    index.store("w", [5], b, 16)  # a restarted engine reusing a name
    assert index.depth("w", a) == 0 and index.depth("w", b) == 1
    index.remove("w", [5])
    assert len(index) == 0


@pytest.mark.parametrize("workers", [1, 3, 70])
def test_match_finds_each_workers_depth(workers: int) -> None:
    index = ExactIndex()
    keys = chain_hashes(list(range(16 * 8)), 16)
    for w in range(workers):
        depth = w % 9
        index.store(f"w{w}", keys[:depth], keys[:depth], 16)
    found = index.match(keys)
    assert found == {f"w{w}": w % 9 for w in range(workers) if w % 9}
    index.remove_worker("w1")
    assert "w1" not in index.match(keys)


@pytest.mark.parametrize("seed", range(30))
def test_match_agrees_with_each_workers_own_walk(seed: int) -> None:
    rng = random.Random(seed)
    index = ExactIndex()
    blocks = rng.choice([1, 2, 3, 17, 64, 256])
    keys = chain_hashes(list(range(16 * blocks)), 16)
    for w in range(rng.randrange(1, 70)):
        depth = rng.choice([0, blocks, rng.randrange(blocks + 1)])
        other = chain_hashes([w + 10_000 + t for t in range(16 * 3)], 16)
        index.store(f"w{w}", keys[:depth] + other, keys[:depth] + other, 16)
    expected = {w: index.depth(w, keys) for w in index.workers() if index.depth(w, keys)}
    assert index.match(keys) == expected


def test_the_kv_gate_counts_a_tokenized_prompt_by_its_tokens() -> None:
    from kvgate.core.features import request_features
    from kvgate.core.pressure import PressureConfig, kv_demand_tokens

    config = PressureConfig(default_output_tokens=10)
    plain = request_features("a", "m", prompt_chars=4000, max_tokens=10)
    counted = request_features("b", "m", prompt_chars=4000, max_tokens=10, token_ids=(1,) * 500)
    assert kv_demand_tokens(plain, config) == 4000 // int(config.chars_per_token) + 10
    assert kv_demand_tokens(counted, config) == 500 + 10
    assert kv_demand_tokens(counted, config, shared_chars=2000) == 250 + 10


@pytest.mark.parametrize("seed", range(10))
def test_match_groups_name_each_holder_once_at_its_depth(seed: int) -> None:
    rng = random.Random(seed)
    index = ExactIndex()
    keys = chain_hashes(list(range(16 * 64)), 16)
    for w in range(rng.randrange(1, 70)):
        depth = rng.choice([0, 64, 32, rng.randrange(65)])
        index.store(f"w{w}", keys[:depth], keys[:depth], 16)
    for _ in range(2):  # the second time from the remembered holder sets
        groups = index.match_groups(keys)
        named = [w for _, workers in groups for w in workers]
        assert len(named) == len(set(named))
        assert {w: d for d, workers in groups for w in workers} == index.match(keys)
    index.remove_worker("w0")
    index.track("new")  # takes w0's bit: the remembered sets must not name w0
    index.store("new", keys[:5], keys[:5], 16)
    held = {w for _, workers in index.match_groups(keys) for w in workers}
    assert "w0" not in held
    assert index.match(keys)["new"] == 5


def test_held_token_groups_hash_once_per_block_size() -> None:
    index = ExactIndex()
    tokens = list(range(256))
    index.store("a", *[chain_hashes(tokens[:64], 16)] * 2, 16)
    index.store("b", *[chain_hashes(tokens[:128], 32)] * 2, 32)
    index.store("c", *[chain_hashes(tokens[:64], 16)] * 2, 16)
    groups = index.held_token_groups(tokens)
    assert sorted((n, sorted(ws)) for n, ws in groups) == [(64, ["a", "c"]), (128, ["b"])]
    assert index.held_tokens(tokens) == {"a": 64, "b": 128, "c": 64}
    resident = Resident.of_tokens(groups, 256, 1000, {"a", "b", "c"})
    assert resident.chars == {"a": 250, "b": 500, "c": 250}  # int(held * 1000 / 256)
    assert resident.groups is not None
    assert sorted(resident.groups) == [(250, ("a", "c")), (500, ("b",))]
