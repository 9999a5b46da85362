"""Request features from an OpenAI request body: session key, priority, prefix blocks.

The prompt's canonical text (chat: each message's role and text in order, with
fixed separators; completions: the prompt) is cut into fixed-size blocks and
hashed as a chain, as paged-attention engines do: block ``i``'s hash is xxh3-64
of block ``i`` seeded with block ``i-1``'s hash, so it covers blocks ``0..i``.
Two requests share a cached prefix exactly as far as their chains agree. The
trailing partial block is hashed too, so short prompts still have a key. A block
is hashed as its bytes: an ASCII block as they are, any other as UTF-16-LE (4 to 6
times faster to encode than UTF-8 for Latin or CJK text) under a seed of its own
(``WIDE_SEED``), so no block's bytes can pass for another kind's.

The whole prompt is hashed, at a bounded cost: the first ``max_blocks`` blocks are
``block_chars`` wide (where prompts that share an opening part ways, fine grain
matters), every block after them is ``coarse_factor`` times wider. A 200 KiB
long-context prompt is then 64 + 46 blocks, not 800, and two prompts that part
after 40 KiB still have different chains (see ``benchmarks/decision_bench.py``
for the cost). ``max_chars`` only guards against absurd bodies.

No key is derived from the prompt's text: a request without a client session id
is followed by its own chain (a conversation's later turns extend it), never by a
hash of an opening that unrelated requests may share.

Blocks are measured in characters by default. ``block_mode: tokens`` is the seam
for tokenizer-based blocks: the caller passes a ``tokenize`` function and the
chain is computed over token ids, ``block_tokens`` per block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import xxhash
from pydantic import BaseModel, ConfigDict, Field

from kvgate.core.chain import pieces_chain_hashes, token_chain_hashes
from kvgate.core.features import RequestFeatures, request_features
from kvgate.core.hints import HintTrust, KeyedHints, hint, in_force
from kvgate.core.holders import checkpoint_indices
from kvgate.core.messages import MessagesShapeError, as_chat, canonical_json, user_id
from kvgate.core.session import (
    AGENT_SESSION_HEADERS,
    PARENT_SESSION_HEADERS,
    SessionScope,
    parent_key_from,
    scope_of,
    session_key_from,
    tenant_of,
    tenant_tag,
)
from kvgate.types import BlockHash, Priority, SessionKey

Endpoint = Literal["chat", "completions", "messages"]
Tokenizer = Callable[[str], Sequence[int]]

ROLE_SEP = "\x1f"  # between a message's role and its text
MESSAGE_SEP = "\x1e"  # after each message
PART_SEP = "\n"  # between text parts, as chat templates join them
OBJECT_MARK = "\x1d"  # before a non-text part or a tool call
TOKEN_SEP = "\x1c"  # between token ids of a pre-tokenized prompt (chars mode)

_MASK64 = (1 << 64) - 1

SEGMENT_CHARS = 1 << 15
"""Texts shorter than this are joined before hashing (``chat_canonical_pieces``): a
copy this small is cheap, and hashing few pieces is faster than many."""


class InvalidRequestError(ValueError):
    """The request body has the wrong shape; the gateway answers 400.

    ``param`` names the offending field as OpenAI does (``"messages"``,
    ``"messages[2].content"``), or is ``None`` for the body as a whole.
    """

    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


InvalidRequest = InvalidRequestError
"""Short alias of ``InvalidRequestError``."""


class FeatureConfig(BaseModel):
    """How request features are extracted (the ``features:`` section of the config).

    A session id (header, agent header, ``user``, parent) is the client's to choose, so
    a request with a credential (``Authorization: Bearer``, else ``x-api-key``) has its
    session scoped by it: the key is a one-way digest of (credential, id), the same on
    every replica, and two clients sending one id never share a worker binding or slot
    (``core.session.scoped``). Without a credential (an upstream gateway that strips
    it) ids are shared by whoever sends them: behind an auth proxy, scope them by the
    identity it sets instead (``session_scope: {header: x-user-id, trusted_peers:
    [...]}``), which also keeps a session's worker when its client's short-lived token
    is rotated (a credential-scoped session starts over with each new token).

    Example::

        features:
          session_header: X-Session-ID
          use_user_field: true
          block_chars: 256
          max_blocks: 64        # fine blocks; later ones are coarse_factor × wider
          coarse_factor: 16
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_header: str = "X-Session-ID"
    session_scope: SessionScope = "credential"
    """What session ids are scoped by: ``credential`` (the client's ``Authorization:
    Bearer`` or ``x-api-key``; without one: ids as sent); ``{header, trusted_peers}``, the
    identity header a trusted hop sets (an auth proxy's ``x-user-id``, Envoy ext_authz's),
    read only from those peers and only once per request, else the request's session ids
    are ignored (``core.session.HeaderScope``); ``none``: ids as sent, shared by whoever
    sends them: unsafe with several tenants (one takes another's worker and saved slot).
    A stored response (``previous_response_id``) is continued only in the scope that
    created it, while the gateway remembers it (``core.session.owned``; not under
    ``none``). Each scope is a tenant of the store's bounds: a credential is a checked one
    only with ``api_keys`` (without, on an address others reach, a warning at start: anyone
    may present new tokens, each a tenant)."""
    agent_session_headers: tuple[str, ...] = AGENT_SESSION_HEADERS
    """Identity headers agent CLIs send, read as the session id when ``session_header`` is
    absent (case-insensitive; first found wins; empty: none read)."""
    parent_session_headers: tuple[str, ...] = PARENT_SESSION_HEADERS
    """Headers naming a subagent's parent session (case-insensitive; empty: none read)."""
    use_user_field: bool = True
    priority_header: str = "X-Priority"
    version_header: str = "X-Model-Version"
    allow_version_pin: bool = True
    client_hints: HintTrust = "auto"
    """Whose ``priority_header`` and ``version_header`` are believed: ``all``, ``none``,
    ``{trusted_peers: [...]}`` (as a trusted hop sets them, sent once), or ``auto``: all
    clients' when the gateway has one tenant (no ``api_keys``, ``session_scope`` not an
    identity header), else none: any client could mark all its traffic critical and be
    shed last, or pin itself onto a canary (``core.hints``)."""
    default_priority: Literal["sheddable", "standard", "critical"] = "standard"
    """The priority of a request whose ``priority_header`` is absent, unknown or not
    believed (``client_hints``)."""
    max_session_key_chars: int = Field(default=256, ge=8)
    block_mode: Literal["chars", "tokens"] = "chars"
    block_chars: int = Field(default=256, ge=1)
    block_tokens: int = Field(default=16, ge=1)
    max_blocks: int = Field(default=64, ge=1)
    """Fine-grained blocks at the start of the chain; the rest are coarse."""
    coarse_factor: int = Field(default=16, ge=1)
    """A coarse block is this many fine blocks wide."""
    max_chars: int = Field(default=1 << 22, ge=1)
    """Characters (or token ids) hashed at most: a guard, far above any context length."""
    hash_seed: int = Field(default=0, ge=0, le=_MASK64)
    checkpoint_stride: int = Field(default=4, ge=1)
    """Every this many fine blocks, a block whose worker binding replicas share."""


def _digest(value: object) -> str:
    return format(xxhash.xxh3_64_intdigest(repr(value).encode()), "016x")


def _content_text(content: object, param: str) -> str:
    """A message's content as text; non-text parts become short stable markers."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError("content must be a string or a list of parts", param)
    pieces: list[str] = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequestError("each content part must be an object", f"{param}[{j}]")
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError("a text part needs a string 'text'", f"{param}[{j}].text")
            pieces.append(text)
        else:
            # An image (or audio) changes the KV the engine computes, so two prompts
            # differing only there must not share blocks past it.
            pieces.append(f"{OBJECT_MARK}{kind}:{_digest(part.get(str(kind), part))}")
    return PART_SEP.join(pieces)


def _tool_calls_text(calls: object) -> str:
    if not isinstance(calls, list):
        return ""
    pieces: list[str] = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            # Canonical JSON: a Messages ``tool_use`` input (an object) hashes alike.
            arguments = canonical_json(fn.get("arguments", ""))
            pieces.append(f"{OBJECT_MARK}{fn.get('name', '')}{ROLE_SEP}{arguments}")
    return "".join(pieces)


def tools_text(tools: object) -> str:
    """The canonical text of chat ``tools``: each function's name, then its description and
    parameters as canonical JSON ("" for none). The engine's template puts them in the
    prompt, ahead of the conversation, so they are the start of its chain."""
    if not isinstance(tools, list) or not tools:
        return ""
    pieces = ["tools", ROLE_SEP]
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            continue
        spec = {"description": fn.get("description"), "parameters": fn.get("parameters")}
        pieces += (OBJECT_MARK, str(fn.get("name", "")), ROLE_SEP, canonical_json(spec))
    pieces.append(MESSAGE_SEP)
    return "".join(pieces)


def chat_canonical_text(messages: object, tools: object = None) -> tuple[str, int]:
    """The canonical text of chat ``messages`` and where the conversation's opening ends.

    The opening is every message up to and including the first one that is not a
    system (or developer) message: it names the conversation, and it does not
    change as later turns are appended.
    """
    parts, opening_end = chat_canonical_pieces(messages, tools)
    return "".join(parts), opening_end


def chat_canonical_pieces(messages: object, tools: object = None) -> tuple[list[str], int]:
    """``chat_canonical_text`` in pieces: runs of short texts joined, each long one apart.

    Routing hashes the pieces as they are (``pieces_chain_hashes``), so a long
    message is not copied into a joined text first. A run of short pieces is cut
    once it reaches ``SEGMENT_CHARS``, so no joined piece is long either. ``tools``
    (chat's, ``tools_text``) come first, as Anthropic's prompt caching orders them.
    """
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("'messages' must be a non-empty list", "messages")
    pieces: list[str] = []
    opening_end = -1
    tools_part = tools_text(tools) if tools else ""
    run: list[str] = [tools_part] if tools_part else []
    run_chars = length = len(tools_part)
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequestError("each message must be an object", param)
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError("each message needs a string 'role'", f"{param}.role")
        text = _content_text(message.get("content"), f"{param}.content")
        calls = _tool_calls_text(message.get("tool_calls"))
        size = len(role) + len(text) + len(calls) + 2
        length += size
        if len(text) >= SEGMENT_CHARS:
            run += (role, ROLE_SEP)
            pieces += ("".join(run), text)
            run, run_chars = [calls, MESSAGE_SEP], len(calls) + 1
        else:
            run += (role, ROLE_SEP, text, calls, MESSAGE_SEP)
            run_chars += size
            if run_chars >= SEGMENT_CHARS:
                pieces.append("".join(run))
                run, run_chars = [], 0
        if opening_end < 0 and role not in ("system", "developer"):
            opening_end = length
    if run:
        pieces.append("".join(run))
    return pieces, (opening_end if opening_end >= 0 else length)


def completion_prompt(prompt: object) -> str | list[int]:
    """The completions ``prompt`` as text, or as token ids when it was pre-tokenized.

    A list of strings is a batch to OpenAI; for routing its texts are joined, since
    the batch goes to one worker and shares its cache there.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return PART_SEP.join(prompt)
        if all(_is_token_id(p) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) for p in prompt):
            flat = [t for p in prompt for t in p]
            if all(_is_token_id(t) for t in flat):
                return flat
    raise InvalidRequestError(
        "'prompt' must be a string, a non-empty list of strings, or token ids "
        f"(integers from 0 to {MAX_TOKEN_ID})",
        "prompt",
    )


MAX_TOKEN_ID = 2**31 - 1
"""The largest token id an engine can take (vocabularies index with 32-bit integers)."""


def check_embedding_input(value: object) -> None:
    """Refuse an embeddings ``input`` OpenAI would refuse, before a worker sees it.

    A string, a non-empty list of strings, of token ids or of non-empty lists of
    token ids (integers 0..``MAX_TOKEN_ID``). An engine given a token id past its
    integers answers 500, and every worker then looks broken for a client's input.
    """
    if isinstance(value, str):
        _require_unicode(value, "input")
        return
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            for v in value:
                _require_unicode(v, "input")
            return
        if all(_is_token_id(v) for v in value):
            return
        if all(isinstance(v, list) and v and all(_is_token_id(t) for t in v) for v in value):
            return
    raise InvalidRequestError(
        "'input' must be a string, a non-empty list of strings, token ids or lists of "
        f"token ids (integers from 0 to {MAX_TOKEN_ID})",
        "input",
    )


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_ID


def _require_unicode(value: str | None, param: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate, as JSON's ``\\ud800``)."""
    if value is None:
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequestError(
            f"'{param}' holds a lone surrogate: not valid Unicode text", param
        ) from None


def _infer_endpoint(body: Mapping[str, Any]) -> Endpoint:
    if "messages" in body:
        return "chat"
    if "prompt" in body:
        return "completions"
    raise InvalidRequestError("missing 'messages' (chat) or 'prompt' (completions)", "messages")


def build_features(
    body: object,
    headers: Mapping[str, str],
    config: FeatureConfig | None = None,
    *,
    request_id: str,
    endpoint: Endpoint | None = None,
    tokenize: Tokenizer | None = None,
    peer: str | None = None,
) -> RequestFeatures:
    """``RequestFeatures`` for one OpenAI request; raises ``InvalidRequestError`` on a bad body.

    ``endpoint`` is inferred from the body (``messages`` or ``prompt``) when not
    given. ``tokenize`` is required only with ``block_mode: tokens``. ``peer``: the
    address the request came from (``session_scope``'s trusted peers).
    """
    cfg = config if config is not None else _DEFAULT_CONFIG
    # ``dict`` first: a decoded JSON body is one, and the ABC's check costs a microsecond.
    if not isinstance(body, dict) and not isinstance(body, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequestError("'stream' must be a boolean", "stream")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequestError("'user' must be a string", "user")
    _require_unicode(model, "model")
    _require_unicode(user, "user")

    kind = endpoint if endpoint is not None else _infer_endpoint(body)
    pieces: Sequence[str]
    token_ids: list[int] | None = None
    user_field: Mapping[str, Any] = body
    if kind == "chat":
        pieces, _ = chat_canonical_pieces(body.get("messages"), body.get("tools"))
    elif kind == "messages":
        # The same canonical text as the conversation sent as chat (``core.messages``).
        try:
            chat, tools = as_chat(body)
        except MessagesShapeError as exc:
            raise InvalidRequestError(exc.message, exc.param) from None
        pieces, _ = chat_canonical_pieces(chat, tools)
        user = user_id(body)
        user_field = {"user": user} if user is not None else {}
    else:
        if "prompt" not in body:
            raise InvalidRequestError("'prompt' is required", "prompt")
        prompt = completion_prompt(body["prompt"])
        if isinstance(prompt, str):
            pieces = (prompt,)
        else:
            token_ids = prompt
            pieces = (TOKEN_SEP.join(map(str, prompt)),)
    hashes = _prefix_hashes(pieces, token_ids, cfg, tokenize)
    prompt_chars = sum(map(len, pieces))

    session_key, source = session_key_from(
        headers,
        user_field,
        header=cfg.session_header,
        use_user_field=cfg.use_user_field,
        max_chars=cfg.max_session_key_chars,
        agent_headers=cfg.agent_session_headers,
        scope=cfg.session_scope,
        peer=peer,
    )
    _require_unicode(session_key, "session key")
    keyed: HintTrust | KeyedHints = cfg.client_hints  # as the gateway runs it
    default: str = cfg.default_priority
    if isinstance(keyed, KeyedHints):  # client keys of their own settings
        trust, default = keyed.of(headers)
    else:
        trust = keyed
    pinned = hint(trust, headers, cfg.version_header, peer) if cfg.allow_version_pin else None
    if pinned is not None:
        pinned = pinned.strip() or None
    asked = hint(trust, headers, cfg.priority_header, peer)
    priority = Priority.parse(asked, default)
    return request_features(
        request_id=request_id,
        model=model,
        session_key=session_key,
        session_source=source,
        prefix_hashes=hashes,
        prompt_pieces=tuple(pieces) if cfg.block_mode == "chars" else (),
        prompt_chars=prompt_chars,
        priority=priority,
        pinned_version=pinned,
        stream=stream,
        max_tokens=_max_tokens(body),
        checkpoints=checkpoint_indices(len(hashes), cfg.max_blocks, cfg.checkpoint_stride),
        parent_key=parent_key_from(
            headers,
            cfg.parent_session_headers,
            cfg.max_session_key_chars,
            cfg.session_scope,
            peer,
        ),
        tenant=request_tenant(session_key, headers, cfg, peer),
    )


def request_tenant(
    session_key: SessionKey | None,
    headers: Mapping[str, str],
    cfg: FeatureConfig,
    peer: str | None = None,
) -> str:
    """A request's tenant (``RequestFeatures.tenant``): its scope's one-way tag, against
    which its shared prefix blocks, its places in the admission queue and its retries
    count. Named by its session key when it has one (``tenant_of``: no second digest),
    else made from its headers; ``""`` without a scope."""
    if session_key is not None:
        return tenant_of(session_key)
    return tenant_tag(scope_of(cfg.session_scope, headers, peer)) if headers else ""


def request_priority(
    headers: Mapping[str, str], cfg: FeatureConfig, peer: str | None = None
) -> Priority:
    """The priority of a request that is not a generation (``build_features`` reads it
    alike): the client's ``priority_header`` where ``client_hints`` believes it, else
    ``default_priority``; so no endpoint is a way around the operator's setting."""
    trust, default = in_force(cfg.client_hints, headers, cfg.default_priority)
    return Priority.parse(hint(trust, headers, cfg.priority_header, peer), default)


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    """The request's output limit, if it names a positive integer one (never an error here)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _prefix_hashes(
    pieces: Sequence[str],
    token_ids: list[int] | None,
    cfg: FeatureConfig,
    tokenize: Tokenizer | None,
) -> tuple[BlockHash, ...]:
    if cfg.block_mode == "chars":
        return pieces_chain_hashes(
            pieces,
            cfg.block_chars,
            cfg.max_blocks,
            cfg.hash_seed,
            coarse_factor=cfg.coarse_factor,
            max_chars=cfg.max_chars,
        )
    if token_ids is not None:
        tokens: Sequence[int] = token_ids
    elif tokenize is None:
        raise ValueError("block_mode 'tokens' needs a tokenize function")
    else:
        tokens = tokenize("".join(pieces))
    return token_chain_hashes(
        tokens,
        cfg.block_tokens,
        cfg.max_blocks,
        cfg.hash_seed,
        coarse_factor=cfg.coarse_factor,
        max_tokens=cfg.max_chars,
    )


_DEFAULT_CONFIG = FeatureConfig()
