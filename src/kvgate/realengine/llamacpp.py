"""A real llama.cpp server (through ``xllamacpp``) as a kvgate worker.

``xllamacpp`` ships llama.cpp's own C++ server as a prebuilt wheel: the OpenAI
endpoints, ``/health``, ``/metrics`` (``llamacpp:*`` names), continuous batching
over ``parallel`` slots and prompt caching. It is an optional extra
(``pip install 'kvgate[llamacpp]'``), so it is imported only when a server starts.

What keeps several sessions' prefixes warm on one worker:

- each slot keeps the KV of its last prompt, and a new request goes to the slot
  whose cached prompt shares the longest prefix with it (above
  ``slot_similarity``), else to the least recently used slot;
- when a slot is reused for another prompt, its KV is first saved to a host-RAM
  prompt cache (``cache_ram_mib``, llama.cpp ``--cache-ram``), which acts as extra
  slots: a later request with that prefix is restored from RAM instead of being
  recomputed. So a worker with 2 slots still hits for a third and fourth session.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from kvgate.realengine.model import DEFAULT_MODEL_NAME, default_model_path


class LlamaCppUnavailableError(RuntimeError):
    """``xllamacpp`` (the optional ``llamacpp`` extra) is not installed."""


def llamacpp_available() -> bool:
    """True when ``xllamacpp`` can be imported (without importing it)."""
    return importlib.util.find_spec("xllamacpp") is not None


@dataclass(frozen=True, slots=True)
class LlamaCppOptions:
    """How to run one llama.cpp worker; the defaults suit a small CPU machine.

    ``ctx`` is the whole context, shared by the ``parallel`` slots (each slot gets
    ``ctx // parallel`` tokens). ``cache_ram_mib`` is the host-RAM prompt cache
    (0 disables it, -1 means no limit). ``cache_reuse`` is llama.cpp's
    ``--cache-reuse``: the smallest chunk reused by shifting KV when a prompt
    differs from the cached one in the middle (0 disables it). ``slot_save_path``
    (llama.cpp ``--slot-save-path``) enables the ``/slots/{id}?action=...`` API:
    ``erase`` empties a slot's KV (how a fleet is made cold between runs), ``save`` and
    ``restore`` move it to and from a file there (the gateway's offload and migration,
    ``gateway.control.offload``; workers that share the folder can restore each
    other's slots).
    """

    model: Path | None = None
    alias: str = DEFAULT_MODEL_NAME
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = 2
    parallel: int = 4
    ctx: int = 16_384
    metrics: bool = True
    cache_ram_mib: int = 8_192
    cache_reuse: int = 0
    kv_unified: bool = False
    slot_similarity: float = 0.1
    warmup: bool = True
    slot_save_path: Path | None = None

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {self.parallel}")
        if self.ctx < 64 * self.parallel:
            raise ValueError(f"ctx {self.ctx} leaves under 64 tokens per slot")
        if not 0 <= self.port <= 65_535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.cache_ram_mib < -1 or self.cache_reuse < 0:
            raise ValueError("cache_ram_mib must be >= -1 and cache_reuse >= 0")
        if not 0.0 <= self.slot_similarity <= 1.0:
            raise ValueError(f"slot_similarity must be in 0..1, got {self.slot_similarity}")

    def to_args(self) -> list[str]:
        """These options as arguments of ``kvgate engine llamacpp``."""
        args = [
            "--alias",
            self.alias,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--threads",
            str(self.threads),
            "--parallel",
            str(self.parallel),
            "--ctx",
            str(self.ctx),
            "--cache-ram-mib",
            str(self.cache_ram_mib),
            "--cache-reuse",
            str(self.cache_reuse),
            "--slot-similarity",
            str(self.slot_similarity),
        ]
        if self.model is not None:
            args += ["--model", str(self.model)]
        if self.slot_save_path is not None:
            args += ["--slot-save-path", str(self.slot_save_path)]
        if not self.metrics:
            args.append("--no-metrics")
        if self.kv_unified:
            args.append("--kv-unified")
        if not self.warmup:
            args.append("--no-warmup")
        return args


def _xllamacpp() -> ModuleType:
    try:
        # By name, so the untyped module stays behind one ``ModuleType``.
        return importlib.import_module("xllamacpp")
    except ImportError as exc:
        raise LlamaCppUnavailableError(
            "the llama.cpp engine needs xllamacpp; install it with: pip install 'kvgate[llamacpp]'"
        ) from exc


def build_params(options: LlamaCppOptions, model_path: Path) -> Any:
    """The ``xllamacpp.CommonParams`` for ``options`` (typed ``Any``: the wheel has no stubs)."""
    xllamacpp = _xllamacpp()
    params = xllamacpp.CommonParams()
    params.model.path = str(model_path)
    params.model_alias = {options.alias}
    params.hostnames = [options.host]
    params.port = options.port
    params.n_parallel = options.parallel
    params.n_ctx = options.ctx
    params.cpuparams.n_threads = options.threads
    params.cpuparams_batch.n_threads = options.threads
    params.endpoint_metrics = options.metrics
    params.cache_ram_mib = options.cache_ram_mib
    params.n_cache_reuse = options.cache_reuse
    params.kv_unified = options.kv_unified
    params.slot_prompt_similarity = options.slot_similarity
    params.warmup = options.warmup
    if options.slot_save_path is not None:
        # llama.cpp joins the folder and a file name by plain concatenation: without
        # the trailing separator ``slots`` + ``a.bin`` would be saved as ``slotsa.bin``.
        params.slot_save_path = os.path.join(str(options.slot_save_path), "")
    return params


def serve(
    options: LlamaCppOptions,
    *,
    ready_file: Path | None = None,
    stop: threading.Event | None = None,
    parent_pid: int | None = None,
) -> None:
    """Run a llama.cpp server until ``stop`` is set, SIGTERM/SIGINT, or the parent dies.

    Blocks while the server runs. Once it listens, ``ready_file`` (if given) is
    written with ``{"url": ..., "pid": ...}`` so a launcher that passed port 0
    learns the port. With ``parent_pid`` set, the server exits when its parent
    process is gone, so a crashed test leaves no worker behind.
    """
    xllamacpp = _xllamacpp()
    model_path = options.model if options.model is not None else default_model_path()
    if not model_path.is_file():
        raise FileNotFoundError(f"model file not found: {model_path}")
    stop = stop if stop is not None else threading.Event()
    if threading.current_thread() is threading.main_thread():

        def _on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
    server = xllamacpp.Server(build_params(options, model_path))
    try:
        url = str(server.listening_address)
        if ready_file is not None:
            _write_ready_file(ready_file, {"url": url, "pid": os.getpid()})
        while not stop.wait(0.5):
            if parent_pid is not None and os.getppid() != parent_pid:
                break
    finally:
        # Dropping the last reference stops llama.cpp's HTTP server and frees the model.
        del server


def _write_ready_file(path: Path, content: dict[str, object]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(content))
    partial.replace(path)
