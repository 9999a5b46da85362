"""Tokenizing timings, both libraries side by side (benchmarks/kv_events_bench.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvgate.bench.tokenizing import Prose, tokenize_timings, verdict
from kvgate.realengine.tokenizer import CHATML_TEMPLATE

pytest.importorskip("tokenizers")
pytest.importorskip("fastokens")


def test_every_workload_is_timed_by_both_libraries(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, normalizers
    from tokenizers.models import BPE

    pieces = ["<unk>", "▁", "\n", *"abcdefghijklmnopqrstuvwxyz,?:0123456789", "▁r", "ri", "▁ri"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    tokenizer = Tokenizer(BPE(vocab, [("▁", "r"), ("r", "i"), ("▁r", "i")], unk_token="<unk>",
                              byte_fallback=True))  # fmt: skip
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.add_tokens(["\n"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML_TEMPLATE}))
    texts = ["a river, a rich ria: is it", "air or iris? a crab; zebra 42 in a car"]
    rows = tokenize_timings(tmp_path, texts, runs=3)
    for workload in ("cold", "cold_code", "cold_docs", "encode", "shared_system", "next_turn"):
        for library in ("tokenizers", "fastokens"):
            assert rows[f"{workload}_{library}"]["cpu_p50_us"] > 0
    assert rows["cold_fastokens"]["prompt_tokens"] == rows["cold_tokenizers"]["prompt_tokens"]
    assert rows["load_average"]["cpus"] >= 1
    # Loaded in a fresh process: fastokens' reference computed apart, by a child.
    assert rows["load_fastokens"]["library"] == 1 and rows["load_fastokens"]["rss_mb"] > 0
    assert rows["load_fastokens"]["reference_cpu_s"] > 0
    assert rows["load_tokenizers"]["reference_cpu_s"] == 0
    # Restarted with the facts kept: no child.
    assert rows["load_fastokens_kept"]["library"] == 1
    assert rows["load_fastokens_kept"]["reference_cpu_s"] == 0
    auto = "gigatoken" if "cold_gigatoken" in rows else "fastokens"
    assert verdict(rows).startswith(f"target: p50 <= 500 us on cold_{auto} (auto's library")


def test_prose_draws_the_texts_words_at_their_frequency() -> None:
    prose = Prose(["the river the river the stone", "the lantern"])
    chat = prose.chat(3000, seed=5)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    words = " ".join(m["content"] for m in chat).split()
    assert set(words) == {"the", "river", "stone", "lantern"}
    assert 0.45 < words.count("the") / len(words) < 0.55  # 4 of its 8 words
    assert prose.chat(3000, seed=5) == chat and prose.chat(3000, seed=6) != chat
