"""The issue-11 shapes: text shared by strangers, sessions found only by their own chains."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import asdict

import pytest

from kvgate.bench.payloads import PayloadBuilder
from kvgate.workload.request import SimRequest
from kvgate.workload.synthetic import WORKLOADS, build_workload, workload_options

SHAPES = (
    "shared-opening-trace",
    "shared-prefix-groups",
    "headerless-chat",
    "agent-preamble",
    "session-docs",
    "uniform",
    "shared-prefix-groups-24x10",
)
HEADERLESS = (
    "shared-opening-trace",
    "shared-prefix-groups",
    "headerless-chat",
    "agent-preamble",
    "uniform",
    "shared-prefix-groups-24x10",
)


def take(spec: str, n: int, seed: int = 3, **overrides: object) -> list[SimRequest]:
    return list(itertools.islice(build_workload(spec, seed, overrides=overrides).requests(), n))


@pytest.mark.parametrize("name", SHAPES)
def test_shapes_are_ordered_deterministic_and_seeded(name: str) -> None:
    requests = take(name, 400)
    assert [r.arrival for r in requests] == sorted(r.arrival for r in requests)
    assert all(r.prompt_tokens == sum(t for _, t in r.segments) > 0 for r in requests)
    assert len({r.request_id for r in requests}) == len(requests)
    assert requests == take(name, 400)
    assert requests != take(name, 400, seed=4)


@pytest.mark.parametrize("name", HEADERLESS)
def test_headerless_shapes_send_no_session_header_and_no_user(name: str) -> None:
    builder = PayloadBuilder("m")
    for request in take(name, 200):
        assert request.session_id is None
        payload = builder.payload(request)
        assert payload.headers == {}
        assert "user" not in payload.body


def test_shared_opening_trace_opens_alike_and_extends_its_own_chains() -> None:
    requests = take("shared-opening-trace", 1500)
    builder = PayloadBuilder("m")
    # Completion prompts, as a trace replay sends them, all opening with block 0.
    assert all(r.opening == 0 and r.reply is None for r in requests)
    assert all(r.segments[0] == (0, 512) for r in requests)
    assert builder.payload(requests[0]).path == "/v1/completions"
    # Without a session id, a conversation is named by its first own block.
    by_conversation: dict[tuple[int, int], list[SimRequest]] = defaultdict(list)
    for request in requests:
        by_conversation[request.segments[1]].append(request)
    multi = [turns for turns in by_conversation.values() if len(turns) > 1]
    assert len(multi) > 50
    for turns in multi:
        for before, after in itertools.pairwise(turns):
            # The next turn re-sends every full block; only the private tail changes.
            assert after.segments[: len(before.segments) - 1] == before.segments[:-1]
            assert len(after.segments) > len(before.segments)
    # Full 512-token blocks, each prompt ending in a partial block of its own.
    assert all(t == 512 for r in requests for _, t in r.segments[:-1])
    assert all(0 < r.segments[-1][1] < 512 for r in requests)
    assert len({r.segments[-1][0] for r in requests}) == len(requests)
    assert sum(r.prompt_tokens for r in requests) / len(requests) > 8000  # long context


def test_shared_opening_trace_can_have_several_openings() -> None:
    requests = take("shared-opening-trace", 600, openings=3)
    assert {r.segments[0] for r in requests} == {(0, 512), (1, 512), (2, 512)}


def test_shared_prefix_groups_is_every_group_times_its_prompts_once() -> None:
    requests = take("shared-prefix-groups", 10_000)
    assert len(requests) == 16 * 8  # the stream ends
    assert Counter(r.segments[0] for r in requests) == {(g, 2048): 8 for g in range(16)}
    assert all(r.opening == 2 and len(r.segments) == 2 for r in requests)
    assert all(64 <= r.segments[1][1] <= 192 for r in requests)  # questions of about 128
    assert PayloadBuilder("m").payload(requests[0]).path == "/v1/chat/completions"
    other = take("shared-prefix-groups", 10_000, seed=4)
    assert [r.segments[0] for r in requests] != [r.segments[0] for r in other]  # shuffled
    small = take("shared-prefix-groups", 10_000, groups=3, prompts=5, system_tokens=100)
    assert Counter(r.segments[0] for r in small) == {(g, 100): 5 for g in range(3)}


def test_headerless_chat_turns_extend_the_conversation_behind_shared_system_prompts() -> None:
    requests = take("headerless-chat", 1500)
    assert {r.segments[0] for r in requests} == {(i, 1024) for i in range(4)}
    by_conversation: dict[tuple[int, int], list[SimRequest]] = defaultdict(list)
    for request in requests:
        by_conversation[request.segments[1]].append(request)  # the first user message
    multi = [turns for turns in by_conversation.values() if len(turns) > 2]
    assert len(multi) > 10
    for turns in multi:
        for before, after in itertools.pairwise(turns):
            assert before.reply is not None
            assert after.segments[: len(before.segments) + 1] == (*before.segments, before.reply)


def test_agent_preamble_shares_one_tool_preamble_and_can_burst() -> None:
    requests = take("agent-preamble", 1000)
    assert all(r.segments[0] == (0, 4096) for r in requests)
    assert len({r.segments[1] for r in requests}) > 20  # each agent's own task

    def start_gaps(stream: list[SimRequest]) -> list[float]:
        starts = [r.arrival for r in stream if len(r.segments) == 2]  # an agent's first turn
        return [b - a for a, b in itertools.pairwise(starts)]

    bursty = take("agent-preamble", 1000, arrival="bursty", burst_on_s=2.0, burst_off_s=20.0)
    # Agents start in bursts: the silences between them dwarf a Poisson stream's gaps.
    assert max(start_gaps(bursty)) > 3 * max(start_gaps(requests))


def test_session_docs_keep_32_sessions_open_with_their_own_documents() -> None:
    requests = take("session-docs", 3000)
    assert all(r.session_id is not None and r.opening == 3 for r in requests)
    first: dict[str, SimRequest] = {}
    last: dict[str, SimRequest] = {}
    for request in requests:
        assert request.session_id is not None
        first.setdefault(request.session_id, request)
        last[request.session_id] = request
    documents = [r.segments[1] for r in first.values()]
    assert len({seg for seg, _ in documents}) == len(documents)
    assert all(2000 <= tokens <= 6000 for _, tokens in documents)
    # A closed population: never more than 32 sessions between first and last turn, and
    # nearly always close to 32 (a finished session's slot waits one think time).
    span = requests[-1].arrival
    open_counts = [
        sum(1 for s in first if first[s].arrival <= t < last[s].arrival)
        for t in (span * k / 50 for k in range(1, 50))
    ]
    assert max(open_counts) <= 32
    assert sum(open_counts) / len(open_counts) > 20
    assert PayloadBuilder("m").payload(requests[0]).headers == {
        "X-Session-ID": requests[0].session_id
    }


def test_every_registered_workload_lists_vary_and_builds() -> None:
    for name in WORKLOADS:
        assert "vary" in workload_options(name)
        assert take(name, 5)


def test_vary_draws_unset_options_from_a_seeded_band_and_keeps_explicit_ones() -> None:
    base = asdict(WORKLOADS["shared-opening-trace"])
    a = build_workload("shared-opening-trace:vary=0.5,openings=2", seed=1).config
    b = build_workload("shared-opening-trace:vary=0.5,openings=2", seed=2).config
    again = build_workload("shared-opening-trace:vary=0.5,openings=2", seed=1).config
    assert a == again and a != b
    for config in (a, b):
        values = asdict(config)
        assert values["openings"] == 2  # given explicitly: kept
        assert values["arrival"] == "poisson"
        for key, default in base.items():
            if isinstance(default, float):
                assert default / 1.5 - 1e-9 <= values[key] <= default * 1.5 + 1e-9, key
    changed = [k for k in base if k != "openings" and asdict(a)[k] != base[k]]
    assert len(changed) >= 5
    # An option that is 0 ("off") stays off under vary.
    assert asdict(build_workload("chat:vary=1", seed=5).config)["doc_tokens"] == 0
    with pytest.raises(ValueError, match="vary"):
        build_workload("chat:vary=-1")


def test_uniform_shares_nothing_not_even_a_first_block() -> None:
    requests = take("uniform", 2000)
    segments = [s for r in requests for s in r.segments]
    assert all(len(r.segments) == 1 for r in requests)
    assert len({sid for sid, _ in segments}) == len(requests)  # every prompt its own text
    sizes = [r.prompt_tokens for r in requests]
    assert min(sizes) >= 512 and max(sizes) <= 1536  # about 1,024 tokens
    assert 950 < sum(sizes) / len(sizes) < 1100
    assert all(64 <= r.max_tokens <= 192 for r in requests)
    # Nothing for a cache to find: no prefix block repeats.
    builder = PayloadBuilder("m")
    firsts = [builder.payload(r).body["messages"][0]["content"][:64] for r in requests[:200]]
    assert len(set(firsts)) == len(firsts)


def test_shared_prefix_groups_at_sglangs_second_size() -> None:
    requests = take("shared-prefix-groups-24x10", 10_000)
    assert len(requests) == 240
    groups = Counter(r.segments[0] for r in requests)
    assert len(groups) == 24 and set(groups.values()) == {10}
    assert {tokens for _, tokens in groups} == {2048}
    assert all(50 <= r.segments[1][1] <= 200 for r in requests)  # short questions
