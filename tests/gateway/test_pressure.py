"""Memory pressure live: emulated workers driven past each watermark behind a gateway."""

from __future__ import annotations

import aiohttp

from kvgate.core.decision import Affinity
from kvgate.core.fleet import Pressure
from kvgate.gateway.testing import running_gateway
from kvgate.store import MemoryStore
from kvgate.testing import wait_until

from .pressure_fleet import chat, holding, metric, pressure_config, pressure_fleet, wait_pressure


async def test_new_sessions_avoid_a_soft_worker_and_affine_ones_stay() -> None:
    store = MemoryStore()
    async with (
        pressure_fleet(2) as (a, b),
        running_gateway(pressure_config([a, b]), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        await store.set(Affinity("kept", a.url, "v1"), 60.0)
        async with holding(session, a, 0.88):
            await wait_pressure(gw, a, Pressure.SOFT)
            placed = [await chat(session, gw, f"new-{i}") for i in range(4)]
            assert [(s, w) for s, w, _ in placed] == [(200, b.url)] * 4
            assert await chat(session, gw, "kept") == (200, a.url, "affinity_hit")
            assert metric(gw, f'kvgate_worker_pressure_level{{worker="{a.url}"}}') == 1.0
        # The holder is gone: usage falls below soft minus the margin, and new sessions return.
        await wait_pressure(gw, a, Pressure.NORMAL)
        assert metric(gw, f'kvgate_worker_pressure_seconds_total{{level="soft",worker="{a.url}"}}')
        assert gw.gateway.pool.get(b.url).pressure is Pressure.NORMAL  # type: ignore[union-attr]


async def test_a_hard_worker_sheds_sessions_offloads_their_kv_and_falls_back() -> None:
    store = MemoryStore()
    async with (
        pressure_fleet(2) as (a, b),
        running_gateway(pressure_config([a, b]), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        keys = [f"s{i}" for i in range(4)]
        for key in keys:
            await store.set(Affinity(key, a.url, "v1"), 60.0)
            # Each turn leaves the session's blocks cached on A and its size known.
            assert (await chat(session, gw, key, text=f"{key} " * 40))[1] == a.url
        before = a.engine.stats(0.0).offloaded_blocks
        async with holding(session, a, 0.96, max_tokens=100):
            await wait_pressure(gw, a, Pressure.HARD)
            await wait_until(lambda: len(gw.gateway.pressure.moves) > 0, message="a migration")
            await gw.gateway.pressure.idle()
        moves = list(gw.gateway.pressure.moves)
        for move in moves:
            assert (move.from_worker, move.to_worker) == (a.url, b.url)
            assert move.reason == "pressure_hard" and move.offloaded
            bound = await store.get(move.session_key)
            assert bound is not None and bound.worker == b.url
        # The offload endpoint was called: the worker's own counter rose.
        assert a.engine.stats(0.0).offloaded_blocks > before
        # A moved session's next turn goes to its new worker, on its binding.
        assert await chat(session, gw, moves[0].session_key) == (200, b.url, "affinity_hit")
        # Unmoved sessions stay bound to A, and A falls back once the load is gone.
        await wait_pressure(gw, a, Pressure.NORMAL)
        moved = {m.session_key for m in moves}
        for key in set(keys) - moved:
            bound = await store.get(key)
            assert bound is not None and bound.worker == a.url
        worker = f'worker="{a.url}"'
        assert metric(gw, f'kvgate_sessions_moved_total{{reason="pressure_hard",{worker}}}') == len(
            moves
        )
        assert metric(gw, f'kvgate_offloads_total{{reason="pressure_hard",result="ok",{worker}}}')
        assert metric(gw, f'kvgate_worker_pressure_seconds_total{{level="hard",{worker}}}') > 0


async def test_every_worker_pressured_sheds_sheddable_new_work_and_places_the_rest() -> None:
    """Every worker SOFT: pressure tells no worker from another, so new sheddable work
    is refused and the rest is placed as on an unpressured fleet (the engines queue it)."""
    store = MemoryStore()
    async with (
        pressure_fleet(2) as (a, b),
        running_gateway(pressure_config([a, b]), store=store) as gw,
        aiohttp.ClientSession() as session,
    ):
        await store.set(Affinity("kept", a.url, "v1"), 60.0)
        async with holding(session, a, 0.88), holding(session, b, 0.88):
            await wait_pressure(gw, a, Pressure.SOFT)
            await wait_pressure(gw, b, Pressure.SOFT)
            sheddable = await chat(session, gw, "new-1", priority="sheddable")
            standard = await chat(session, gw, "new-2")
            affine = await chat(session, gw, "kept", priority="sheddable")
            critical = await chat(session, gw, "new-3", priority="critical")
        assert sheddable[0] == 429
        assert standard[0] == 200 and standard[2] == "pressure_overflow"
        assert affine == (200, a.url, "pressure_overflow")  # it stays home
        assert critical[0] == 200 and critical[2] == "pressure_overflow"
        assert metric(gw, 'kvgate_shed_total{priority="sheddable",reason="pressure_soft"}') == 1
        assert metric(gw, 'kvgate_shed_total{priority="standard",reason="pressure_soft"}') == 0


async def test_pressure_handling_can_be_turned_off() -> None:
    async with (
        pressure_fleet(2) as (a, b),
        running_gateway(pressure_config([a, b], pressure={"enabled": False})) as gw,
        aiohttp.ClientSession() as session,
    ):
        scraped = gw.gateway.pool.get(a.url)
        assert scraped is not None
        async with holding(session, a, 0.97, max_tokens=60):
            # Scrapes go on (the listener runs right after each) ...
            await wait_until(
                lambda: scraped.signals is not None and (scraped.signals.kv_usage or 0) >= 0.95,
                message="a scrape past the hard mark",
            )
            # ... but the worker is never marked pressured and nothing moves.
            assert scraped.pressure is Pressure.NORMAL
            assert (await chat(session, gw, "new"))[0] == 200
        assert not gw.gateway.pressure.moves
        assert metric(gw, "kvgate_worker_pressure_level") == 0
