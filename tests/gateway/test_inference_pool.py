"""Workers found from an InferencePool's pods: list, then watch; joins, leaves, relists."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import cast

import pytest

from kvgate.gateway.control.config import InferencePoolTarget
from kvgate.gateway.control.kube import PoolWatch, pod_url
from kvgate.gateway.control.membership import Membership
from kvgate.gateway.testing import running_gateway
from kvgate.testing import free_port, wait_until
from kvgate.workersim import WorkerOptions, running_worker

from .kube_api import TOKEN, FakeKube, pod

FAST = {"profile": "fast", "time_scale": 50.0}


def test_only_a_running_ready_pod_with_an_ip_is_a_worker() -> None:
    assert pod_url(pod("a", "10.0.0.1"), 8000) == "http://10.0.0.1:8000"
    assert pod_url(pod("a", "fd00::1"), 8000) == "http://[fd00::1]:8000"
    assert pod_url(pod("a", "10.0.0.1", ready=False), 8000) is None
    assert pod_url(pod("a", ""), 8000) is None
    gone = pod("a", "10.0.0.1")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_url(gone, 8000) is None
    pending = pod("a", "10.0.0.1")
    pending["status"]["phase"] = "Pending"
    assert pod_url(pending, 8000) is None


def test_a_pools_pods_are_followed_on_their_kv_event_ports() -> None:
    target = InferencePoolTarget(
        name="vllm", namespace="inference", ca_path=None, kv_events_port=5557,
        kv_events_replay_port=5558,
    )  # fmt: skip
    watch = PoolWatch(target, cast(Membership, None))
    worker = watch._worker("http://10.0.0.1:8000")
    assert (worker.kv_events, worker.kv_events_replay) == (
        "tcp://10.0.0.1:5557",
        "tcp://10.0.0.1:5558",
    )
    worker = watch._worker("http://[fd00::1]:8000")
    assert worker.kv_events == "tcp://[fd00::1]:5557"
    plain = PoolWatch(InferencePoolTarget(name="vllm", namespace="inference", ca_path=None),
                      cast(Membership, None))  # fmt: skip
    assert plain._worker("http://10.0.0.1:8000").kv_events is None


@pytest.mark.asyncio
async def test_the_pools_pods_join_and_leave_through_a_list_and_watch(tmp_path: Path) -> None:
    port = free_port("127.0.0.2")
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    async with contextlib.AsyncExitStack() as stack:
        for host in ("127.0.0.2", "127.0.0.3"):
            opts = WorkerOptions(host=host, port=port, **FAST)
            await stack.enter_async_context(running_worker(opts))
        kube = await stack.enter_async_context(FakeKube(port).serving())
        kube.pods["a"] = pod("a", "127.0.0.2")
        kube.pods["b"] = pod("b", "127.0.0.3", ready=False)
        kube.pods["other"] = pod("other", "127.0.0.4", labels={"app": "other"})
        kube.gone_once = True  # the first watch is too old: list again
        target = {
            "name": "vllm",
            "namespace": "inference",
            "api_server": kube.url,
            "token_path": str(token),
            "ca_path": None,
            "retry_s": 0.05,
            "version": "v1",
        }
        config = {"discovery": {"inference_pools": [target]}, "health": {"interval_s": 0.1}}
        gw = await stack.enter_async_context(running_gateway(config))
        pool = gw.gateway.pool
        a, b = f"http://127.0.0.2:{port}", f"http://127.0.0.3:{port}"

        def ids() -> set[str]:
            return {w.id for w in pool}

        await wait_until(lambda: ids() == {a}, message="the ready pod joined")
        watch = gw.gateway.control.discovery.pools[0]
        await wait_until(lambda: watch.lists >= 2, message="relisted after 410 Gone")
        await wait_until(lambda: any("watch=1" in c for c in kube.calls[-1:]), message="watching")
        kube.push("MODIFIED", pod("b", "127.0.0.3"))  # b becomes ready
        await wait_until(lambda: ids() == {a, b}, message="b joined")
        worker = pool.get(b)
        assert worker is not None and worker.version == "v1"
        assert worker.config.labels["inference_pool"] == "vllm"
        await wait_until(lambda: all(w.probe_ok for w in pool), message="probed")
        kube.push("DELETED", pod("a", "127.0.0.2"))
        await wait_until(lambda: ids() == {b}, message="a left")
        kube.end_watch()  # the server ends the watch: list again, nothing changes
        lists = watch.lists
        await wait_until(lambda: watch.lists > lists, message="listed again")
        assert ids() == {b}
        assert watch.failures == 0
