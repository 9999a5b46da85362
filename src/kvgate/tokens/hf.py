"""A Hugging Face tokenizer and its chat template, applied as vLLM and transformers do.

Chat requests are rendered through the model's template (``tokenizer_config.json``'s
``chat_template``, or the one configured) in a sandboxed Jinja environment with
``trim_blocks`` and ``lstrip_blocks``, ``add_generation_prompt`` true and the special
tokens (``bos_token``, ``eos_token``, ...) as variables, as
``transformers.apply_chat_template`` renders it; the text is then tokenized without
adding special tokens (the template writes them), as vLLM does, or with them as
llama.cpp's server does (``chat_special_tokens``). A completion's prompt is tokenized
with them (a BOS where the tokenizer's post-processor adds one), as vLLM's
``/v1/completions`` does. A prompt given as token ids is used as it is. The text is
tokenized by ``fastokens`` where it agrees with ``tokenizers`` (``tokens.encoders``).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from kvgate.tokens.config import TokenizerConfig
from kvgate.tokens.encoders import EncoderLoadError, encoder
from kvgate.tokens.factcache import FactCache, cache_folder
from kvgate.tokens.spans import Spans, written_by

_SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
            "mask_token")  # fmt: skip


class TokenizerLoadError(ValueError):
    """The configured tokenizer cannot be loaded (missing file, package, template)."""


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _raise(message: str) -> None:
    raise TokenizerLoadError(message)


class HFTokenizer:
    """``tokenizer.json`` plus its chat template (see the module docs)."""

    def __init__(self, config: TokenizerConfig) -> None:
        # tokenizers is the reference, loaded in a child process when fastokens encodes.
        found = importlib.util.find_spec("jinja2") and importlib.util.find_spec("tokenizers")
        if not found:
            raise TokenizerLoadError(
                "tokenizer kind 'hf' needs the tokenizers and jinja2 packages: "
                "pip install 'kvgate[tokenizer]'"
            )
        import jinja2.sandbox

        if not config.path:
            raise TokenizerLoadError("tokenizer kind 'hf' needs a path")
        path = Path(config.path)
        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerLoadError(f"no tokenizer.json at {file}")
        settings: dict[str, Any] = {}
        settings_file = folder / "tokenizer_config.json"
        if settings_file.is_file():
            settings = json.loads(settings_file.read_text(encoding="utf-8"))
        template = config.chat_template or self._template(settings)
        self._variables = {name: _token_text(settings.get(name)) for name in _SPECIAL}
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self._chat_special = config.chat_special_tokens
        self._chat = env.from_string(template) if template else None
        written = written_by(self.render) if self._chat is not None else set()
        try:
            kept = cache_folder(config.reference_cache)
            cache = FactCache(kept) if kept is not None else None
            encode, self.library, reference = encoder(file, config.library, cache)
        except EncoderLoadError as exc:
            raise TokenizerLoadError(str(exc)) from exc
        self.text_encoder = encode
        """The library's ids of a text (no cutting at added tokens, nothing remembered)."""
        self.spans = Spans(reference.added, written, encode, plain=reference.plain)
        self._before, self._after = reference.wrap()  # what the post-processor adds

    @staticmethod
    def _template(settings: Mapping[str, Any]) -> str | None:
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None

    def render(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        """The chat prompt's text, as the engine renders it before tokenizing."""
        if self._chat is None:
            raise TokenizerLoadError("the tokenizer has no chat template")
        return str(
            self._chat.render(
                messages=list(messages),
                add_generation_prompt=True,
                **self._variables,
                **extra,
            )
        )

    def chat(self, messages: Sequence[Mapping[str, Any]], **extra: Any) -> list[int]:
        """A chat request's prompt tokens."""
        return self.encode(self.render(messages, **extra), special=self._chat_special)

    def completion(self, prompt: str | list[int]) -> list[int]:
        """A completion request's prompt tokens."""
        if isinstance(prompt, list):
            return prompt
        return self.encode(prompt, special=True)

    def encode(self, text: str, *, special: bool) -> list[int]:
        """``text``'s ids; ``special``: with the post-processor's special tokens."""
        ids = self.spans.encode(text)
        return [*self._before, *ids, *self._after] if special else ids


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    """transformers' ``tojson``: no HTML escaping, non-ASCII kept."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
