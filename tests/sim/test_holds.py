"""The simulator's KV hold: a held request asks again when its wait runs out; a pick worth
nothing is not waited for."""

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
    """Picks ``w0`` when shown it, else the first worker shown; says waiting is worth ``worth``."""

    name = "first_shown"

    def __init__(self, worth: float) -> None:
        self.worth = worth

    def pick(self, request: RequestFeatures, ctx: RouteContext) -> Decision:
        ids = [w.id for w in ctx.fleet.workers]
        return Decision("w0" if "w0" in ids else ids[0], "its_cache")

    def hold_worth(
        self, request: RequestFeatures, worker: WorkerId, ctx: RouteContext
    ) -> Seconds | None:
        return self.worth


def held_on_a_full_worker(worth: float) -> tuple[SimGateway, list[Seconds], list[str]]:
    """w0's KV is committed, w1 has room; one request arrives at 0 and picks w0."""
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
    # 1,500 started (256 is output still to grow): no prompt fits under w0's hard mark.
    workers[0].load(1, 1_756)
    timers: list[Seconds] = []
    sent: list[str] = []

    def submit(worker: SimWorker, request: EngineRequest, now: Seconds) -> None:
        sent.append(worker.id)

    gateway = SimGateway(
        workers,
        FirstShown(worth),
        PromptCodec(16, model=config.model),
        RunRecorder([w.id for w in workers]),
        submit,
        config=RouteConfig(AdmissionConfig(), PressureConfig(), kv_gate_max_wait_s=10.0),
        affinity_ttl=60.0,
        rng=random.Random(0),
        timer=timers.append,
    )
    gateway.arrive(SimRequest.of(0.0, "r1", ((1, 200),), 10), 0.0)
    return gateway, timers, sent


def test_a_held_request_asks_again_when_its_hold_runs_out() -> None:
    """Held for w0 (worth waiting for), with a timer set for the end of its longest wait;
    when it fires, the request is placed where it waited (as a live hold that runs out)."""
    gateway, timers, sent = held_on_a_full_worker(0.5)
    assert (timers, sent, gateway.kv_holds, gateway.queue_depth) == ([10.0], [], 1, 1)
    gateway.timer_fired(10.0)
    assert (sent, gateway.queue_depth) == (["w0"], 0)


def test_a_pick_worth_nothing_is_not_waited_for() -> None:
    gateway, timers, sent = held_on_a_full_worker(0.0)
    assert (timers, sent, gateway.kv_holds) == ([], ["w1"], 0)
    assert gateway.recorder.reasons["kv_hold_moved"] == 1
