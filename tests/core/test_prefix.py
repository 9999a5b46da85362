"""Request features from OpenAI bodies: validation, canonical text, chained block hashes."""

from __future__ import annotations

from typing import Any

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from kvgate.core.chain import (
    WIDE_SEED,
    block_widths,
    chain_chars,
    pieces_chain_hashes,
    text_chain_hashes,
    token_chain_hashes,
)
from kvgate.core.prefix import (
    SEGMENT_CHARS,
    FeatureConfig,
    InvalidRequestError,
    build_features,
    chat_canonical_pieces,
    chat_canonical_text,
)
from kvgate.types import Priority

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}


def chat(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


# -- validation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({"messages": [user("hi")]}, "model"),
        ({"model": 3, "messages": [user("hi")]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        ({"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {
                "model": "m",
                "messages": [user("a"), {"role": "user", "content": [{"type": "text"}]}],
            },
            "messages[1].content[0].text",
        ),
        ({"model": "m", "messages": [user("a")], "stream": "yes"}, "stream"),
        ({"model": "m", "messages": [user("a")], "user": 7}, "user"),
        ({"model": "m", "prompt": 5}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
    ],
)
def test_malformed_bodies_raise_invalid_request_naming_the_param(
    body: Any, param: str | None
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        build_features(body, {}, request_id="r")
    assert info.value.param == param
    assert info.value.message


def test_completions_endpoint_requires_prompt() -> None:
    with pytest.raises(InvalidRequestError) as info:
        build_features({"model": "m"}, {}, request_id="r", endpoint="completions")
    assert info.value.param == "prompt"


# -- session key, priority, version ----------------------------------------


@pytest.mark.parametrize(
    ("headers", "body_user", "config", "key", "source"),
    [
        ({"X-Session-ID": "h1"}, "u1", FeatureConfig(), "h1", "header"),
        ({"x-session-id": "h1"}, "u1", FeatureConfig(), "h1", "header"),
        ({"X-Session-ID": "   "}, "u1", FeatureConfig(), "u1", "user"),
        ({}, "u1", FeatureConfig(), "u1", "user"),
        ({}, "u1", FeatureConfig(use_user_field=False), None, "none"),
        ({}, None, FeatureConfig(), None, "none"),
        (
            {"X-Conv": "c9", "X-Session-ID": "h1"},
            "u1",
            FeatureConfig(session_header="X-Conv"),
            "c9",
            "header",
        ),
    ],
)
def test_session_key_header_then_user_then_none(
    headers: dict[str, str],
    body_user: str | None,
    config: FeatureConfig,
    key: str | None,
    source: str,
) -> None:
    body = chat(SYSTEM, user("hello"))
    if body_user is not None:
        body["user"] = body_user
    features = build_features(body, headers, config, request_id="r")
    assert features.session_key == key
    assert features.session_source == source
    assert features.has_session is (key is not None)


def test_over_long_session_key_is_hashed_to_a_bounded_key() -> None:
    raw = "k" * 10_000
    features = build_features(chat(user("hi")), {"X-Session-ID": raw}, request_id="r")
    assert features.session_key is not None
    assert len(features.session_key) < 64
    again = build_features(chat(user("hi")), {"X-Session-ID": raw}, request_id="r2")
    assert again.session_key == features.session_key


@pytest.mark.parametrize(
    ("value", "priority"),
    [
        ("critical", Priority.CRITICAL),
        ("Sheddable", Priority.SHEDDABLE),
        ("standard", Priority.STANDARD),
        ("urgent!!", Priority.STANDARD),
        (None, Priority.STANDARD),
    ],
)
def test_priority_from_header(value: str | None, priority: Priority) -> None:
    headers = {"X-Priority": value} if value is not None else {}
    assert build_features(chat(user("hi")), headers, request_id="r").priority is priority


def test_version_pin_from_header_and_can_be_disabled() -> None:
    headers = {"X-Model-Version": " v3 "}
    assert build_features(chat(user("hi")), headers, request_id="r").pinned_version == "v3"
    off = FeatureConfig(allow_version_pin=False)
    assert build_features(chat(user("hi")), headers, off, request_id="r").pinned_version is None


def test_stream_model_and_request_id_are_carried() -> None:
    features = build_features(chat(user("hi"), stream=True), {}, request_id="abc")
    assert (features.request_id, features.model, features.stream) == ("abc", "m", True)


# -- canonical text and chains ----------------------------------------------


def test_text_parts_and_string_content_canonicalise_alike() -> None:
    as_string = chat_canonical_text([user("look at this")])[0]
    as_parts = chat_canonical_text(
        [{"role": "user", "content": [{"type": "text", "text": "look at this"}]}]
    )[0]
    assert as_parts == as_string


def test_role_is_part_of_the_canonical_text() -> None:
    as_user = chat_canonical_text([user("same words")])[0]
    as_system = chat_canonical_text([{"role": "system", "content": "same words"}])[0]
    assert as_user != as_system


def test_images_change_the_chain_after_the_text_before_them() -> None:
    def with_image(url: str) -> tuple[int, ...]:
        part = {"type": "image_url", "image_url": {"url": url}}
        message = {"role": "user", "content": [{"type": "text", "text": "x" * 600}, part]}
        return build_features(chat(message), {}, request_id="r").prefix_hashes

    a, b = with_image("http://a/cat.png"), with_image("http://a/dog.png")
    assert a[:2] == b[:2]  # the 600 leading characters fill two whole blocks
    assert a[-1] != b[-1]


def test_tool_calls_enter_the_canonical_text() -> None:
    def call(args: str) -> str:
        fn = {"name": "search", "arguments": args}
        message = {"role": "assistant", "content": None, "tool_calls": [{"function": fn}]}
        return chat_canonical_text([user("q"), message])[0]

    assert call('{"q": 1}') != call('{"q": 2}')


def test_chain_hashes_follow_the_definition() -> None:
    text = "abcdefghij"
    first = xxhash.xxh3_64_intdigest(b"abcd", 0)
    second = xxhash.xxh3_64_intdigest(b"efgh", first)
    third = xxhash.xxh3_64_intdigest(b"ij", second)
    assert text_chain_hashes(text, 4, 10) == (first, second, third)
    assert text_chain_hashes(text, 4, 2) == (first, second)


def test_blocks_are_characters_not_bytes() -> None:
    """A block of other text than ASCII is hashed as UTF-16-LE, under a seed of its own."""
    text = "héllo wörld"
    first = xxhash.xxh3_64_intdigest("héll".encode("utf-16-le"), 0 ^ WIDE_SEED)
    second = xxhash.xxh3_64_intdigest("o wö".encode("utf-16-le"), first ^ WIDE_SEED)
    third = xxhash.xxh3_64_intdigest(b"rld", second)
    assert text_chain_hashes(text, 4, 3) == (first, second, third)


def test_ascii_text_and_its_utf16_bytes_do_not_collide() -> None:
    # "数" is U+6570: in UTF-16-LE the same two bytes as the ASCII text "pe".
    assert "数".encode("utf-16-le") == b"pe"
    assert text_chain_hashes("数", 4, 1) != text_chain_hashes("pe", 4, 1)


def test_a_lone_surrogate_is_refused_as_text_is() -> None:
    with pytest.raises(UnicodeEncodeError):
        text_chain_hashes("ab\ud800cd", 4, 2)
    with pytest.raises(UnicodeEncodeError):
        pieces_chain_hashes(["a" * 40_000, "b\ud800"], 256, 64, coarse_factor=16)


@given(
    common=st.text(min_size=0, max_size=700),
    tail_a=st.text(min_size=1, max_size=300),
    tail_b=st.text(min_size=1, max_size=300),
    block=st.sampled_from([1, 7, 64, 256]),
)
def test_chains_agree_exactly_as_far_as_the_prompts_agree(
    common: str, tail_a: str, tail_b: str, block: int
) -> None:
    a, b = common + tail_a, common + tail_b
    agree = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    ha, hb = text_chain_hashes(a, block, 10_000), text_chain_hashes(b, block, 10_000)
    whole = agree // block
    assert ha[:whole] == hb[:whole]
    if a != b and whole < min(len(ha), len(hb)):
        assert ha[whole] != hb[whole]


def reference_chain(
    text: str, block: int, fine: int, coarse_factor: int, max_chars: int
) -> tuple[int, ...]:
    """The chain by its definition: each block of the text encoded and hashed in turn."""
    end = min(len(text), max_chars)
    hashes: list[int] = []
    h, start = 0, 0
    for width in block_widths(block, fine, coarse_factor, end):
        chars = text[start : min(start + width, end)]
        if chars.isascii():
            h = xxhash.xxh3_64_intdigest(chars.encode("ascii"), h)
        else:
            h = xxhash.xxh3_64_intdigest(chars.encode("utf-16-le"), h ^ WIDE_SEED)
        hashes.append(h)
        start += width
    return tuple(hashes)


@given(
    pieces=st.lists(
        st.one_of(st.text(alphabet="ab\x1f", max_size=90), st.text(max_size=40)), max_size=12
    ),
    block=st.sampled_from([1, 3, 8, 32]),
    fine=st.integers(1, 6),
    coarse_factor=st.integers(1, 5),
    max_chars=st.integers(1, 600),
)
def test_hashing_pieces_is_hashing_their_join(
    pieces: list[str], block: int, fine: int, coarse_factor: int, max_chars: int
) -> None:
    """Blocks that span pieces, ASCII next to other text, empty pieces, the max_chars cut."""
    text = "".join(pieces)
    expected = reference_chain(text, block, fine, coarse_factor, max_chars)
    got = pieces_chain_hashes(pieces, block, fine, coarse_factor=coarse_factor, max_chars=max_chars)
    assert got == expected
    alone = text_chain_hashes(text, block, fine, coarse_factor=coarse_factor, max_chars=max_chars)
    assert alone == expected


def test_long_messages_are_pieces_of_their_own_and_short_runs_are_joined() -> None:
    long_text = "L" * (SEGMENT_CHARS + 5)
    messages = [SYSTEM, user("short " * 10), user(long_text)] + [
        user(f"turn {i} " * 300) for i in range(40)
    ]
    pieces, _ = chat_canonical_pieces(messages)
    assert "".join(pieces) == chat_canonical_text(messages)[0]
    assert long_text in pieces  # not copied into a joined run
    assert all(p is long_text or len(p) < 2 * SEGMENT_CHARS for p in pieces)
    config = FeatureConfig()
    features = build_features(chat(*messages), {}, config, request_id="r")
    text = chat_canonical_text(messages)[0]
    assert features.prefix_hashes == reference_chain(text, 256, 64, 16, config.max_chars)
    assert features.prompt_chars == len(text)


def test_long_chats_agree_as_far_as_they_agree_and_part_after_it() -> None:
    """Equal prefixes give equal leading hashes, even past 16 KiB and across messages."""
    document = {"role": "system", "content": "shared document. " * 4000}  # 68 KiB
    a = build_features(chat(document, user("alpha " * 2000)), {}, request_id="a")
    b = build_features(chat(document, user("omega " * 2000)), {}, request_id="b")
    pairs = zip(a.prefix_hashes, b.prefix_hashes, strict=True)
    agree = next(i for i, (x, y) in enumerate(pairs) if x != y)
    shared_chars = len("system\x1f") + len(document["content"]) + len("\x1euser\x1f")
    assert chain_chars(agree, 256, 64, 16) <= shared_chars < chain_chars(agree + 1, 256, 64, 16)
    assert chain_chars(agree, 256, 64, 16) > 16 * 1024
    assert a.prefix_hashes[agree:] != b.prefix_hashes[agree:]


def test_the_block_count_stays_bounded_on_a_huge_prompt() -> None:
    config = FeatureConfig()
    huge = build_features(chat(user("h" * (8 << 20))), {}, config, request_id="r")
    fine_chars = config.block_chars * config.max_blocks
    coarse_chars = config.block_chars * config.coarse_factor
    assert len(huge.prefix_hashes) == config.max_blocks + -(
        -(config.max_chars - fine_chars) // coarse_chars
    )


def test_the_chain_covers_the_whole_prompt_fine_then_coarse() -> None:
    body = chat(user("z" * 5000))
    config = FeatureConfig(block_chars=100, max_blocks=7, coarse_factor=16)
    features = build_features(body, {}, config, request_id="r")
    # 7 fine blocks cover 700 characters; the other 4,306 take three 1,600-wide blocks.
    assert features.prompt_chars == 5006
    assert len(features.prefix_hashes) == 7 + 3
    assert block_widths(100, 7, 16, 5006) == [100] * 7 + [1600] * 3
    assert chain_chars(9, 100, 7, 16) == 700 + 2 * 1600


def test_long_prompts_that_part_after_the_fine_blocks_have_different_chains() -> None:
    shared = "d" * 40_000
    a = build_features(chat(user(shared + "alpha" * 100)), {}, request_id="a").prefix_hashes
    b = build_features(chat(user(shared + "omega" * 100)), {}, request_id="b").prefix_hashes
    assert len(a) == len(b) > 64
    agree = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    # They agree on every block lying wholly inside the shared text, and no further.
    shared_chars = len("user\x1f") + 40_000
    assert chain_chars(agree, 256, 64, 16) <= shared_chars < chain_chars(agree + 1, 256, 64, 16)


def test_max_chars_guards_the_hashing_cost() -> None:
    config = FeatureConfig(max_chars=10_000)
    features = build_features(chat(user("q" * 100_000)), {}, config, request_id="r")
    assert len(features.prefix_hashes) == -(-10_000 // 256)


def test_a_longer_conversation_extends_the_chain_of_the_shorter() -> None:
    turn1 = chat(SYSTEM, user("first question " * 30))
    turn2 = chat(
        SYSTEM,
        user("first question " * 30),
        {"role": "assistant", "content": "an answer " * 40},
        user("second"),
    )
    h1 = build_features(turn1, {}, request_id="1").prefix_hashes
    h2 = build_features(turn2, {}, request_id="2").prefix_hashes
    full_blocks = build_features(turn1, {}, request_id="1").prompt_chars // 256
    assert h2[:full_blocks] == h1[:full_blocks]
    assert len(h2) > len(h1)


def test_completions_prompt_string_list_and_tokens() -> None:
    as_text = build_features({"model": "m", "prompt": "a\nb"}, {}, request_id="r")
    as_list = build_features({"model": "m", "prompt": ["a", "b"]}, {}, request_id="r")
    assert as_text.prefix_hashes == as_list.prefix_hashes
    tokens = build_features({"model": "m", "prompt": [1, 2, 3]}, {}, request_id="r")
    assert len(tokens.prefix_hashes) == 1


def test_token_block_mode_uses_the_given_tokenizer() -> None:
    config = FeatureConfig(block_mode="tokens", block_tokens=2)
    features = build_features(
        chat(user("abcde")),
        {},
        config,
        request_id="r",
        tokenize=lambda text: [ord(c) for c in text],
    )
    text = chat_canonical_text([user("abcde")])[0]
    assert features.prefix_hashes == token_chain_hashes([ord(c) for c in text], 2, 64)
    with pytest.raises(ValueError, match="tokenize"):
        build_features(chat(user("abcde")), {}, config, request_id="r")
    ids = build_features({"model": "m", "prompt": [5, 6, 7]}, {}, config, request_id="r")
    assert ids.prefix_hashes == token_chain_hashes([5, 6, 7], 2, 64)


# -- no key from shared text ---------------------------------------------------


def test_without_a_client_key_no_key_is_derived_from_the_text() -> None:
    """Two strangers behind one system prompt must not share a key (issue 11)."""
    one = build_features(chat(SYSTEM, user("plan a trip")), {}, request_id="1")
    two = build_features(chat(SYSTEM, user("write a poem")), {}, request_id="2")
    assert one.affinity_key is None and two.affinity_key is None
    assert one.session_source == "none"
    # What follows a headerless conversation is its own chain: it shares the
    # system prompt's blocks with the stranger and parts ways after them.
    assert one.prefix_hashes[0] == two.prefix_hashes[0]
    assert one.prefix_hashes != two.prefix_hashes
    with_header = build_features(chat(user("hi")), {"X-Session-ID": "s"}, request_id="r")
    assert with_header.affinity_key == "s"
