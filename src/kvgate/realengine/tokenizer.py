"""A Hugging Face ``tokenizer.json`` built from a GGUF model's own vocabulary.

A GGUF file carries its tokenizer (``tokenizer.ggml.*``): the pieces, their scores
and types. For a SentencePiece-style vocabulary (``tokenizer.ggml.model`` =
``llama``: Llama 2, Gemma), llama.cpp tokenizes by merging, again and again, the
adjacent pair of pieces whose union is the highest-scored piece of the vocabulary
(leftmost first on ties), after spaces became ``▁``; characters no piece holds
fall back to byte pieces (``<0xNN>``); user-defined pieces (runs of newlines and
spaces, tags) are cut out first, control pieces (``<start_of_turn>``) when special
tokens are parsed. That is a BPE whose merge ranks are the union's score order, so
this writes one: every pair of pieces whose union is a piece, ranked by that
union's score. ``kvgate.tokens.hf`` then tokenizes as llama.cpp does (checked against
its ``/tokenize`` in ``tests/realengine/test_tokens.py``).

No GGUF of this project's has a chat template (the bundled Gemma 3 270M has none:
llama.cpp then renders chats with ChatML), so the template is given separately.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
"""``tokenizer.ggml.token_type`` values."""

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""llama.cpp's ChatML, what it renders a chat with when the model has no template."""


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
"""GGUF value types of fixed size and their ``struct`` formats (8: string, 9: array)."""


def gguf_metadata(path: Path, prefix: str = "tokenizer.") -> dict[str, Any]:
    """The key-value metadata of a GGUF file whose keys start with ``prefix``.

    Reads the header only (GGUF v2/v3: magic, version, tensor and key counts, then
    the keys), not the tensors, in a second or so where a general reader takes a
    minute over a 262,144-piece vocabulary.
    """
    with path.open("rb") as f:
        data = f.read(64 << 20)  # the metadata sits at the start; a vocabulary is < 16 MB
    if data[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    (version,) = struct.unpack_from("<I", data, 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    _, count = struct.unpack_from("<QQ", data, 8)
    at = 24
    found: dict[str, Any] = {}

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", data, at)
        return data[at + 8 : at + 8 + n].decode("utf-8", errors="replace"), at + 8 + n

    def value(kind: int, at: int) -> tuple[Any, int]:
        if kind == 8:
            return string(at)
        if kind == 9:
            item, n = struct.unpack_from("<IQ", data, at)
            at += 12
            fmt = _SCALARS.get(item)
            if fmt is not None:
                size = struct.calcsize(fmt)
                items = list(struct.unpack_from(f"<{n}{fmt[1]}", data, at))
                return items, at + n * size
            out = []
            for _ in range(n):
                v, at = value(item, at)
                out.append(v)
            return out, at
        fmt = _SCALARS[kind]
        return struct.unpack_from(fmt, data, at)[0], at + struct.calcsize(fmt)

    for _ in range(count):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", data, at)
        v, at = value(kind, at + 4)
        if key.startswith(prefix):
            found[key] = v
    return found


def tokenizer_json(gguf_path: Path) -> dict[str, Any]:
    """The ``tokenizer.json`` of a SentencePiece-style GGUF vocabulary (module docs)."""
    meta = gguf_metadata(gguf_path)
    if meta.get("tokenizer.ggml.model") != "llama":
        raise ValueError("only SentencePiece-style (tokenizer.ggml.model = llama) vocabularies")
    pieces: list[str] = meta["tokenizer.ggml.tokens"]
    scores: list[float] = meta["tokenizer.ggml.scores"]
    types: list[int] = meta["tokenizer.ggml.token_type"]
    bos = meta.get("tokenizer.ggml.bos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token"))
    space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix"))
    vocab = {piece: i for i, piece in enumerate(pieces)}
    mergeable = {i for i, t in enumerate(types) if t == NORMAL}
    merges: list[tuple[float, int, str, str]] = []
    for i in mergeable:
        piece = pieces[i]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            a, b = vocab.get(left), vocab.get(right)
            if a is not None and b is not None and a in mergeable and b in mergeable:
                merges.append((-scores[i], i, left, right))
    merges.sort()
    added = [
        {
            "id": i,
            "content": pieces[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": t == CONTROL,
        }
        for i, t in enumerate(types)
        if t in (CONTROL, USER_DEFINED)
    ]
    normalizers: list[dict[str, Any]] = []
    if space_prefix:
        normalizers.append({"type": "Prepend", "prepend": "▁"})
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})
    post: dict[str, Any] | None = None
    if add_bos and bos is not None:
        token = pieces[bos]
        post = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": token, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": token, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {token: {"id": token, "ids": [bos], "tokens": [token]}},
        }  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,  # one word: pieces merge across spaces, as in llama.cpp
        "post_processor": post,
        "decoder": None,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": pieces[meta.get("tokenizer.ggml.unknown_token_id") or 0],
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [[left, right] for _, _, left, right in merges],
        },
    }


def write_tokenizer(gguf_path: Path, folder: Path, chat_template: str | None = None) -> Path:
    """Write ``tokenizer.json`` (and ``tokenizer_config.json`` with the chat template and
    the special tokens) into ``folder``; returns the folder (``tokenizers: {kind: hf}``)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = tokenizer_json(gguf_path)
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    post = data["post_processor"]
    settings = {"chat_template": chat_template or CHATML_TEMPLATE,
                "bos_token": next(iter(post["special_tokens"])) if post else None}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder
