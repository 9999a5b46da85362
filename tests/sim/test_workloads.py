"""Shapes of the synthetic workloads: sessions, growing context, Zipf popularity, arrivals."""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict

import pytest

from kvgate.workload.arrivals import ArrivalSpec
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import ZipfSampler, build_workload


def take(spec: str, n: int, seed: int = 3, **overrides: object) -> list[SimRequest]:
    return list(itertools.islice(build_workload(spec, seed, overrides=overrides).requests(), n))


@pytest.mark.parametrize("name", ["chat", "system-prompt", "rag", "agent"])
def test_arrivals_are_ordered_and_prompt_lengths_add_up(name: str) -> None:
    requests = take(name, 400)
    arrivals = [r.arrival for r in requests]
    assert arrivals == sorted(arrivals)
    assert all(r.prompt_tokens == sum(t for _, t in r.segments) > 0 for r in requests)
    assert len({r.request_id for r in requests}) == len(requests)


@pytest.mark.parametrize("name", ["chat", "rag", "agent"])
def test_same_seed_same_stream_other_seed_other_stream(name: str) -> None:
    assert take(name, 200, seed=5) == take(name, 200, seed=5)
    assert take(name, 200, seed=5) != take(name, 200, seed=6)


@pytest.mark.parametrize("name", ["chat", "agent"])
def test_session_turns_resend_the_whole_context_and_grow(name: str) -> None:
    by_session: dict[str, list[SimRequest]] = defaultdict(list)
    for request in take(name, 1500):
        assert request.session_id is not None
        by_session[request.session_id].append(request)
    multi = [turns for turns in by_session.values() if len(turns) > 2]
    assert len(multi) > 10
    for turns in multi:
        for before, after in itertools.pairwise(turns):
            assert before.reply is not None
            # The next turn is the previous prompt, its reply, then new input.
            grown = (*before.segments, before.reply)
            assert after.segments[: len(grown)] == grown
            assert after.prompt_tokens > before.prompt_tokens
            assert after.arrival >= before.arrival
        assert all(t.opening == 2 for t in turns)


def test_chat_sessions_can_share_a_few_system_prompts_and_open_with_their_own_document() -> None:
    requests = take("chat", 1500, system_prompts=4, doc_tokens=2000)
    firsts = {r.session_id: r for r in reversed(requests)}  # each session's first turn
    assert {r.segments[0] for r in firsts.values()} == {(i, 512) for i in range(4)}
    documents = [r.segments[1] for r in firsts.values()]
    assert len({seg_id for seg_id, _ in documents}) == len(documents)  # one per session
    assert all(1000 <= tokens <= 3000 for _, tokens in documents)
    # The opening is the system prompt and the first user message (document, question).
    assert all(r.opening == 3 for r in requests)
    # The defaults draw nothing new: the plain chat stream is unchanged.
    assert take("chat", 300) == take("chat", 300, system_prompts=1, doc_tokens=0)


def test_agent_sessions_have_many_turns_on_long_context() -> None:
    requests = take("agent", 3000, rate=50.0)
    turns = Counter(r.session_id for r in requests)
    chat_turns = Counter(r.session_id for r in take("chat", 3000, rate=50.0))
    assert max(turns.values()) > max(chat_turns.values())
    assert sum(r.prompt_tokens for r in requests) / len(requests) > 4000


def test_system_prompt_popularity_is_zipf_ordered() -> None:
    requests = take("system-prompt", 6000, prompts=8, zipf_s=1.2)
    counts = Counter(r.segments[0][0] for r in requests)
    assert set(counts) <= set(range(8))
    ranked = [counts[i] for i in range(8)]
    # Rank 0 is the most popular and popularity falls with rank (allowing noise
    # between neighbours far down the tail).
    assert ranked[0] == max(ranked)
    assert ranked[0] > 2 * ranked[3] > 0
    assert all(len(r.segments) == 2 and r.session_id is None for r in requests)


def test_zipf_sampler_matches_its_distribution() -> None:
    sampler = ZipfSampler(50, 1.0)
    rng = random.Random(11)
    counts = Counter(sampler.sample(rng) for _ in range(40_000))
    # P(0)/P(1) = 2 for s = 1; P(0)/P(9) = 10.
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.1)
    assert counts[0] / counts[9] == pytest.approx(10.0, rel=0.2)
    picked = sampler.distinct(rng, 5)
    assert len(set(picked)) == 5


def test_rag_documents_repeat_with_zipf_popularity() -> None:
    requests = take("rag", 3000, documents=200, docs_per_request=2)
    docs = Counter(seg for r in requests for seg in r.segments[1:-1])
    assert all(len(r.segments) == 4 for r in requests)
    top = docs.most_common(1)[0][1]
    assert top > 10 * (sum(docs.values()) / len(docs)) / 3
    assert all(r.segments[0] == requests[0].segments[0] for r in requests)  # shared system


def test_rate_sets_the_long_run_request_rate() -> None:
    requests = take("system-prompt", 4000, rate=40.0)
    assert len(requests) / requests[-1].arrival == pytest.approx(40.0, rel=0.08)


def test_bursty_arrivals_are_burstier_than_poisson() -> None:
    def dispersion(spec: ArrivalSpec) -> float:
        times = list(itertools.islice(spec.times(random.Random(2)), 20_000))
        counts = Counter(int(t) for t in times)
        windows = [counts[i] for i in range(int(times[-1]))]
        mean = sum(windows) / len(windows)
        return sum((c - mean) ** 2 for c in windows) / len(windows) / mean

    poisson = dispersion(ArrivalSpec("poisson", 20.0))
    bursty = dispersion(ArrivalSpec("bursty", 20.0, on_s=5.0, off_s=15.0))
    assert poisson == pytest.approx(1.0, abs=0.2)
    assert bursty > 5 * poisson


def test_unknown_workload_and_option_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("nope")
    with pytest.raises(ValueError, match="no option"):
        build_workload("chat:bogus=1")
    with pytest.raises(ValueError, match="arrival"):
        build_workload("chat:arrival=sometimes")
    assert build_workload("chat:turns_mean=3,session_ids=false").config.session_ids is False
