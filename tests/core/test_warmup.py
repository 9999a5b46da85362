"""A warm-up's body is the opening's own, cut exactly where the shared prefix ends."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvgate.core.prefix import chat_canonical_text
from kvgate.core.warmup import WARM_UP_MAX_TOKENS, warm_up_payload

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}
USER = {"role": "user", "content": "What is paged attention?"}


def test_a_chat_prefix_inside_the_system_prompt_cuts_its_text() -> None:
    payload = {"model": "m", "messages": [SYSTEM, USER], "stream": True, "max_tokens": 300}
    body = warm_up_payload(payload, "chat", 100)
    assert body is not None
    assert body["model"] == "m" and body["max_tokens"] == WARM_UP_MAX_TOKENS
    assert body["stream"] is False
    assert len(body["messages"]) == 1 and body["messages"][0]["role"] == "system"
    text, _ = chat_canonical_text(body["messages"])
    assert text[:100] == chat_canonical_text([SYSTEM, USER])[0][:100]


def test_a_completions_prefix_is_the_prompts_leading_characters() -> None:
    body = warm_up_payload({"model": "m", "prompt": "abcdefgh"}, "completions", 5)
    assert body is not None and body["prompt"] == "abcde"
    assert warm_up_payload({"model": "m", "prompt": ["abcdefgh"]}, "completions", 3) is not None


def test_what_cannot_be_cut_exactly_is_not_warmed() -> None:
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert warm_up_payload({"model": "m", "messages": [image, USER]}, "chat", 50) is None
    assert warm_up_payload({"model": "m", "prompt": [1, 2, 3]}, "completions", 2) is None
    assert warm_up_payload({"model": "m", "prompt": "abc"}, "completions", 10) is None
    assert warm_up_payload({"model": "m", "messages": [SYSTEM]}, "chat", 0) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=60)),
        min_size=1,
        max_size=5,
    ),
    st.integers(min_value=1, max_value=400),
)
def test_the_cut_renders_the_same_leading_canonical_text(
    turns: list[tuple[str, str]], chars: int
) -> None:
    messages = [{"role": role, "content": text} for role, text in turns]
    whole, _ = chat_canonical_text(messages)
    body = warm_up_payload({"model": "m", "messages": messages}, "chat", chars)
    if body is None:
        return  # the cut fell inside the first role: nothing to send
    cut, _ = chat_canonical_text(body["messages"])
    covered = min(chars, len(whole))
    assert whole.startswith(cut[:-1])  # the cut message's text ends where it was cut
    assert len(cut) >= covered - max(len(role) + 1 for role, _ in turns)  # at most a role short
