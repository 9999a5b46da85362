"""The simulator's KV hold: a held request asks again when its hold's wait runs out."""

from __future__ import annotations

import random

from kvgate.core.admission import AdmissionConfig
from kvgate.core.decision import Decision
from kvgate.core.features import RequestFeatures
from kvgate.core.policy import PolicyBase, RouteContext
from kvgate.core.pressure import PressureConfig
from kvgate.core.route import RouteConfig
from kvgate.engine import EngineRequest
from kvgate.sim.gateway import SimGateway
from kvgate.sim.simulation import SimConfig
from kvgate.sim.worker import SimWorker
from kvgate.types import Seconds, WorkerId
from kvgate.workload.prompts import PromptCodec
from kvgate.workload.recorder import RunRecorder
from kvgate.workload.request import SimRequest


class FirstShown(PolicyBase):
    """Picks ``w0`` when shown it, else the first worker shown; waiting is worth 0.5 s."""

    name = "first_shown"

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        ids = [w.id for w in ctx.fleet.workers]
        return Decision("w0" if "w0" in ids else ids[0], "its_cache")

    def hold_worth(
        self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext
    ) -> Seconds | None:
        return 0.5


def test_a_held_request_asks_again_when_its_hold_runs_out() -> None:
    """w0's KV is committed, w1 has room: the request is held for w0 as long as waiting is
    worth (0.5 s), a timer is set for then, and when it fires the request goes to w1."""
    config = SimConfig(workers=2, kv_blocks=(100,), block_size=16)  # 1,600 tokens each
    workers = [
        SimWorker(
            i,
            config.engine_config(i),
            worker_id=f"w{i}",
            model=config.model,
            max_in_flight=8,
            stale_after=10.0,
            pressure=PressureConfig(),
        )
        for i in range(2)
    ]
    for worker in workers:
        worker.scrape(0.0)  # the KV capacity is known from the first scrape
    workers[0].load(1, 1_500)  # nothing more fits under w0's hard mark
    timers: list[Seconds] = []
    sent: list[str] = []

    def submit(worker: SimWorker, request: EngineRequest, now: Seconds) -> None:
        sent.append(worker.id)

    gateway = SimGateway(
        workers,
        FirstShown(),
        PromptCodec(16, model=config.model),
        RunRecorder([w.id for w in workers]),
        submit,
        config=RouteConfig(AdmissionConfig(), PressureConfig(), kv_gate_max_wait_s=10.0),
        affinity_ttl=60.0,
        rng=random.Random(0),
        timer=timers.append,
    )
    gateway.arrive(SimRequest.of(0.0, "r1", ((1, 200),), 10), 0.0)
    assert (timers, sent, gateway.kv_holds, gateway.queue_depth) == ([0.5], [], 1, 1)
    gateway.timer_fired(0.5)
    assert (sent, gateway.queue_depth) == (["w1"], 0)
    assert gateway.recorder.reasons["kv_hold_moved"] == 1
