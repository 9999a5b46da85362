"""A small BPE ``tokenizer.json`` shaped like Gemma's, for the token tests."""

from __future__ import annotations

from pathlib import Path


def tiny_tokenizer(folder: Path, extra: str = "") -> Path:
    """A small BPE ``tokenizer.json`` shaped like Gemma's (▁ for spaces, byte fallback;
    ``extra``: one more added token), written into ``folder``."""
    from tokenizers import Tokenizer, normalizers
    from tokenizers.models import BPE

    pieces = ["▁", "a", "b", "c", "▁a", "ab", "▁ab", "abc", "\n"]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    vocab = {p: i for i, p in enumerate(["<unk>", *pieces])}
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("ab", "c")]
    tokenizer = Tokenizer(BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.add_tokens(["\n", *([extra] if extra else [])])
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / "tokenizer.json"
    tokenizer.save(str(file))
    return file
