"""How a wholly pressured fleet is shown to the policy (``core.pressure.unpressured``)."""

from __future__ import annotations

from kvgate.core.fleet import FleetSnapshot, Health, Pressure, WorkerState
from kvgate.core.pressure import unpressured

N, S, H = Pressure.NORMAL, Pressure.SOFT, Pressure.HARD


def test_every_worker_is_shown_unpressured_and_nothing_else_changes() -> None:
    workers = (
        WorkerState(id="a", model="m", pressure=H, in_flight=3, kv_usage=0.99),
        WorkerState(id="b", model="m", pressure=S, in_flight=4, max_in_flight=4),
        WorkerState(id="c", model="m", pressure=S, health=Health.EJECTED),
        WorkerState(id="d", model="m", pressure=N, in_flight=1),
    )
    view = unpressured(FleetSnapshot(2.0, workers))
    assert view.now == 2.0
    assert tuple(w.id for w in view.workers) == ("a", "b", "c", "d")
    assert {w.pressure for w in view.workers} == {N}
    # Full and unroutable workers stay so: the candidate rule still leaves them out.
    for before, after in zip(workers, view.workers, strict=True):
        assert after == before.__class__(**{**before.__dict__, "pressure": N})
    assert view.workers[3] is workers[3]  # an unpressured worker is not copied
    assert view.get("a") is view.workers[0]
