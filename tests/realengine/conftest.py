"""Fixtures: one real llama.cpp worker (Gemma 3 270M) shared by a test module.

Starting a worker loads the model (3-10 s here), so one worker serves every test
of a module; tests that need a fresh cache use prompts no other test sends.
Modules using these fixtures skip themselves when the ``llamacpp`` extra is missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from openai import OpenAI

from kvgate.realengine import LlamaCppProcess, running_llamacpp, small_options


@pytest.fixture(scope="module")
def llamacpp_worker() -> Iterator[LlamaCppProcess]:
    """A real worker on a free port: 2 slots of 4,096 tokens, 1 thread, metrics on."""
    with running_llamacpp(small_options()) as worker:
        yield worker


@pytest.fixture
def client(llamacpp_worker: LlamaCppProcess) -> Iterator[OpenAI]:
    """The official client, without retries so failures show as they are."""
    with OpenAI(base_url=llamacpp_worker.url + "/v1", api_key="unused", max_retries=0) as oai:
        yield oai
