"""Starting and stopping llama.cpp workers as child processes, for tests and benchmarks.

Each worker is its own process (``python -m kvgate.realengine engine llamacpp``),
so several can run side by side and one can be killed outright, as a real
worker dies. The child binds port 0 by default and reports the port it got
through a ready file, so there is no race for a port picked in advance. It also
watches its parent and exits when the parent is gone.

Usage::

    with running_llamacpp(LlamaCppOptions(port=0, threads=1, parallel=2)) as worker:
        client = OpenAI(base_url=worker.url + "/v1", api_key="unused")
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

from kvgate.realengine.llamacpp import LlamaCppOptions, LlamaCppUnavailableError, llamacpp_available
from kvgate.waiting import wait_until_sync

STARTUP_TIMEOUT_S = 120.0
"""Loading the model, warming up and binding takes 3-10 s on a busy 2-core machine."""


class WorkerStartError(RuntimeError):
    """A worker process exited or stayed unready before its deadline; carries its log tail."""


class LlamaCppProcess:
    """One llama.cpp worker running in a child process."""

    def __init__(
        self,
        options: LlamaCppOptions,
        popen: subprocess.Popen[bytes],
        workdir: Path,
        log: IO[bytes],
    ) -> None:
        self.options = options
        self._popen = popen
        self._workdir = workdir
        self._log = log
        self._url: str | None = None

    @property
    def pid(self) -> int:
        """The worker process's id."""
        return self._popen.pid

    @property
    def log_path(self) -> Path:
        """Where the worker's stdout and stderr (llama.cpp's log) go."""
        return self._workdir / "worker.log"

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:8001``; known once the worker listens."""
        if self._url is None:
            raise RuntimeError("the worker has not reported its address yet (call wait_ready)")
        return self._url

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self._popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the worker's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> str:
        """Block until ``/health`` answers 200; return the URL.

        Raises ``WorkerStartError`` (with the log tail) if the process exits or
        the deadline passes first.
        """
        ready_file = self._workdir / "ready.json"

        def ready() -> bool:
            if not self.running:
                raise WorkerStartError(
                    f"llama.cpp worker exited with code {self._popen.returncode}:\n"
                    + self.log_tail()
                )
            if self._url is None:
                if not ready_file.exists():
                    return False
                self._url = str(json.loads(ready_file.read_text())["url"])
            return _healthy(self._url)

        try:
            wait_until_sync(ready, timeout=timeout, interval=0.1, message="llama.cpp /health")
        except TimeoutError as exc:
            self.kill()
            raise WorkerStartError(f"{exc}; log tail:\n{self.log_tail()}") from None
        return self.url

    async def wait_ready_async(self, startup_timeout: float = STARTUP_TIMEOUT_S) -> str:
        """``wait_ready`` without blocking the event loop."""
        return await asyncio.to_thread(self.wait_ready, startup_timeout)

    def stop(self, timeout: float = 10.0) -> int:
        """Ask the worker to exit (SIGTERM), kill it after ``timeout`` s; return its exit code."""
        if self.running:
            self._popen.send_signal(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._popen.kill()
        return self._finish()

    def kill(self) -> int:
        """Kill the worker at once (SIGKILL), as a crash would; return its exit code."""
        if self.running:
            self._popen.kill()
        return self._finish()

    def _finish(self) -> int:
        code = self._popen.wait()
        self._log.close()
        return code


def start_llamacpp(options: LlamaCppOptions, workdir: Path | None = None) -> LlamaCppProcess:
    """Spawn a worker process and return at once; call ``wait_ready`` before using it.

    ``workdir`` receives the log and ready file (default: a new temporary directory).
    Raises ``LlamaCppUnavailableError`` when ``xllamacpp`` is not installed.
    """
    if not llamacpp_available():
        raise LlamaCppUnavailableError(
            "the llama.cpp engine needs xllamacpp; install it with: pip install 'kvgate[llamacpp]'"
        )
    workdir = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="kvgate-llamacpp-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "ready.json").unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "kvgate.realengine",
        "engine",
        "llamacpp",
        *options.to_args(),
        "--ready-file",
        str(workdir / "ready.json"),
        "--parent-pid",
        str(os.getpid()),
    ]
    log = (workdir / "worker.log").open("wb")
    try:
        popen = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C in the terminal reaches the launcher, which
            # then stops the worker in order.
            start_new_session=True,
        )
    except BaseException:
        log.close()
        raise
    return LlamaCppProcess(options, popen, workdir, log)


@contextlib.contextmanager
def running_llamacpp(
    options: LlamaCppOptions | None = None,
    *,
    timeout: float = STARTUP_TIMEOUT_S,
    workdir: Path | None = None,
) -> Iterator[LlamaCppProcess]:
    """A ready worker for the ``with`` block, stopped after it.

    ``options`` defaults to a small worker on any free port.
    """
    process = start_llamacpp(options if options is not None else small_options(), workdir)
    try:
        process.wait_ready(timeout)
        yield process
    finally:
        process.stop()


@contextlib.asynccontextmanager
async def running_llamacpp_async(
    options: LlamaCppOptions | None = None,
    *,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    workdir: Path | None = None,
) -> AsyncIterator[LlamaCppProcess]:
    """``running_llamacpp`` for async code: waiting and stopping run off the event loop."""
    process = start_llamacpp(options if options is not None else small_options(), workdir)
    try:
        await process.wait_ready_async(startup_timeout)
        yield process
    finally:
        await asyncio.to_thread(process.stop)


def small_options(**changes: object) -> LlamaCppOptions:
    """Options for a test worker: any free port, 2 slots of 4,096 tokens, 1 thread, no warm-up.

    One thread because test machines are small and shared: two spinning threads
    on two busy cores slow prefill down far more than one.
    """
    base = LlamaCppOptions(port=0, threads=1, parallel=2, ctx=8_192, warmup=False)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2.0) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, TimeoutError):
        # 503 while the model loads arrives as HTTPError, a URLError.
        return False
