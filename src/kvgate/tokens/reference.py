"""What ``tokenizers``, the reference, says of a ``tokenizer.json``.

Its added tokens (what ``tokens.spans`` cuts at), what its post-processor adds around
a sequence (a BOS), and its ids of the ``PROBE`` texts, on which ``fastokens`` must
give the same ids before it is used (``tokens.encoders``). Knowing them takes
``tokenizers``' own load of the vocabulary: for Gemma 3's 262,144 pieces 1.5 s of CPU
and ~290 MB touched, beside fastokens' 3.9 s and ~310 MB. When fastokens is to
encode, the reference is computed in a child process (``python -m
kvgate.tokens.reference FILE``: the facts as JSON on stdout) while fastokens loads,
so the gateway never holds the second vocabulary and, given a second core, the two
loads overlap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROBE = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "  leading and trailing  \n\n\n\ttab\r\nCRLF   ",
    "日本語のテキスト、中文文本 and 한국어 🙂🚀 mixed; ÆØÅ ß ç ñ Ω ∑ √ — “q” …",
    "Numbers 3.14159, -42, 1e10, 0xFF 12345678901234567890",
    "<start_of_turn>user\nhi<end_of_turn>\n<bos><eos><table><td>x</td></table>",
    "def f(x):\n    return x ** 2  # square\n\n\n\n\n",
    "\x00\x01\x7f\u200b\ufeff\U0001f9ea\U000e0041 rare code points",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa b",
    "▁already▁marked▁ >▁</ > </",
)
"""Texts a candidate library must tokenize as ``tokenizers`` does before it is used:
where BPE implementations part (byte fallback, whitespace runs, added tokens, scripts
without spaces)."""

TIMEOUT_S = 300.0
"""How long the child may take (a loaded 2-core machine: tens of seconds)."""


class ReferenceLoadError(RuntimeError):
    """The reference could not be computed apart (the child failed or timed out)."""


@dataclass(frozen=True)
class Reference:
    """``tokenizers``' view of one ``tokenizer.json`` (see the module docs)."""

    added: dict[str, int]
    """The added tokens' ids by their text."""
    plain: bool
    """Whether every added token is matched as plain text (no ``lstrip``, ``rstrip``,
    ``single_word``, not normalized): only then is cutting at them exact."""
    probe: tuple[tuple[int, ...], ...]
    """The ids of each ``PROBE`` text, without special tokens."""
    special: tuple[int, ...]
    """The ids of ``PROBE[0]`` with the post-processor's special tokens."""

    @staticmethod
    def parse(data: object) -> Reference:
        """The facts of their JSON form (``asdict``), checked field by field: a
        ``ValueError`` for anything else (a child's answer or a cache file)."""
        if not isinstance(data, dict) or set(data) != {"added", "plain", "probe", "special"}:
            raise ValueError("not the four fields of the facts")
        added, plain, probe = data["added"], data["plain"], data["probe"]
        if not isinstance(added, dict) or not all(isinstance(k, str) for k in added):
            raise ValueError("added: not ids by text")
        if not isinstance(plain, bool):
            raise ValueError("plain: not a boolean")
        if not isinstance(probe, list) or len(probe) != len(PROBE):
            raise ValueError(f"probe: not {len(PROBE)} lists of ids")
        return Reference(
            added=dict(zip(added, _ids(list(added.values())), strict=True)),
            plain=plain,
            probe=tuple(_ids(ids) for ids in probe),
            special=_ids(data["special"]),
        )

    def wrap(self) -> tuple[list[int], list[int]]:
        """What the post-processor adds before and after a sequence's ids."""
        plain, full = list(self.probe[0]), list(self.special)
        at = next((i for i in range(len(full)) if full[i : i + len(plain)] == plain), 0)
        return full[:at], full[at + len(plain) :]


def _ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(i) is int and 0 <= i < 1 << 32 for i in value):
        raise ValueError("not a list of token ids")
    return tuple(value)


def load(file: Path) -> Any:
    """``tokenizers``' tokenizer of ``file``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(file))


def facts(tokenizer: Any) -> Reference:
    """The reference facts of a loaded ``tokenizers.Tokenizer``."""
    decoder = tokenizer.get_added_tokens_decoder()
    return Reference(
        added={token.content: i for i, token in decoder.items()},
        plain=all(
            not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in decoder.values()
        ),
        probe=tuple(tuple(tokenizer.encode(t, add_special_tokens=False).ids) for t in PROBE),
        special=tuple(tokenizer.encode(PROBE[0], add_special_tokens=True).ids),
    )


def child_command(file: Path) -> list[str]:
    """The command computing ``file``'s facts in a child process."""
    return [sys.executable, "-m", "kvgate.tokens.reference", str(file)]


class Apart:
    """``file``'s facts being computed in a child process, started at construction
    (``start``: false, when they are known already: nothing started)."""

    def __init__(self, file: Path, *, start: bool = True) -> None:
        env = dict(os.environ)
        # The child imports this package from where the parent did.
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        self._failed = ""
        self._child: subprocess.Popen[bytes] | None = None
        if not start:
            self._failed = "not started"
            return
        try:
            self._child = subprocess.Popen(
                child_command(file),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as exc:  # no interpreter to start: said by result()
            self._failed = f"cannot start the child: {exc}"

    def result(self, timeout_s: float = TIMEOUT_S) -> Reference:
        """The facts, once the child has computed them."""
        if self._child is None:
            raise ReferenceLoadError(self._failed)
        try:
            out, err = self._child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.cancel()
            raise ReferenceLoadError(f"no answer within {timeout_s:g} s") from None
        if self._child.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise ReferenceLoadError(lines[-1] if lines else f"exit {self._child.returncode}")
        try:
            return Reference.parse(json.loads(out))
        except (ValueError, RecursionError) as exc:
            raise ReferenceLoadError(f"an answer that is not the facts: {exc!r}") from None

    def cancel(self) -> None:
        """Stop the child if it still runs (its answer is no longer wanted)."""
        if self._child is None or self._child.poll() is not None:
            return
        self._child.kill()
        self._child.communicate()

    def __enter__(self) -> Apart:
        return self

    def __exit__(self, *_: object) -> None:
        self.cancel()  # every way out, an interrupt during the parent's own load included


def main(argv: list[str]) -> int:
    """``python -m kvgate.tokens.reference FILE``: the facts of FILE as JSON."""
    if len(argv) != 1:
        print("usage: python -m kvgate.tokens.reference TOKENIZER_JSON", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(asdict(facts(load(Path(argv[0]))))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
