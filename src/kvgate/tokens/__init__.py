"""A request's prompt as the engine's tokens (``tokenizers:`` per model).

- ``hf``: a Hugging Face ``tokenizer.json`` and the chat template of its
  ``tokenizer_config.json``, applied as the engines apply them (``tokens.hf``; the
  ``tokenizer`` extra);
- ``worker``: ask a worker of the model (``/tokenize``, and llama.cpp's
  ``/apply-template`` for chat), remembering answers (``tokens.remote``);
- ``none`` (the default): no tokens; caches are matched by characters.

The tokens feed the exact index (``core.exact_index``): a request's blocks are
looked up by the same token chains the engines publish in their KV events.
"""

from __future__ import annotations

from kvgate.tokens.config import TokenizerConfig

__all__ = ["TokenizerConfig"]
