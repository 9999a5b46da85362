"""SessionTable against a plain-dict model, over random operation sequences."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgate.core.decision import Affinity
from kvgate.store.table import SessionTable

WORKERS = ["w0", "w1", "w2"]
KEYS = [f"k{i}" for i in range(8)]
CAPACITY = 5


@dataclass
class Row:
    worker: str
    version: str
    last_active: float
    deadline: float
    recency: int


class Model:
    """The obvious, slow implementation the table must agree with."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows: dict[str, Row] = {}
        self.tick = 0

    def _expire(self, t: float) -> None:
        self.rows = {k: r for k, r in self.rows.items() if r.deadline > t}

    def _write(self, a: Affinity, deadline: float, t: float) -> None:
        self._expire(t)
        if a.session_key not in self.rows and len(self.rows) >= self.capacity:
            del self.rows[min(self.rows, key=lambda k: self.rows[k].recency)]
        self.tick += 1
        self.rows[a.session_key] = Row(a.worker, a.version, a.last_active, deadline, self.tick)

    def get(self, key: str, t: float) -> Affinity | None:
        self._expire(t)
        row = self.rows.get(key)
        return None if row is None else Affinity(key, row.worker, row.version, row.last_active)

    def put(self, a: Affinity, deadline: float, t: float) -> None:
        self._write(a, deadline, t)

    def cas(
        self, key: str, expected: str | None, a: Affinity, deadline: float, t: float
    ) -> Affinity:
        current = self.get(key, t)
        if current is not None and current.worker != expected:
            return current
        self._write(a, deadline, t)
        return a

    def touch(self, key: str, last_active: float, deadline: float, t: float) -> bool:
        self._expire(t)
        row = self.rows.get(key)
        if row is None:
            return False
        self.tick += 1
        row.last_active, row.deadline, row.recency = last_active, deadline, self.tick
        return True

    def delete(self, key: str, t: float) -> bool:
        self._expire(t)
        return self.rows.pop(key, None) is not None

    def counts(self, t: float) -> dict[str, int]:
        self._expire(t)
        out: dict[str, int] = {}
        for row in self.rows.values():
            out[row.worker] = out.get(row.worker, 0) + 1
        return out

    def sessions_of(self, worker: str, t: float, limit: int | None) -> list[Affinity]:
        self._expire(t)
        keys = sorted(
            (k for k, r in self.rows.items() if r.worker == worker),
            key=lambda k: (self.rows[k].last_active, self.rows[k].recency),
        )
        found = [self.get(k, t) for k in keys[:limit]]
        return [a for a in found if a is not None]


key_st = st.sampled_from(KEYS)
worker_st = st.sampled_from(WORKERS)
# Integer clock times and half-integer deadlines: a deadline never equals a read
# time, so "expired" is never a tie, whatever the bucket width.
ttl_st = st.integers(min_value=0, max_value=6).map(lambda n: n + 0.5)
op_st = st.one_of(
    st.tuples(st.just("put"), key_st, worker_st, st.integers(0, 3), ttl_st),
    st.tuples(st.just("cas"), key_st, st.none() | worker_st, worker_st, ttl_st),
    st.tuples(st.just("touch"), key_st, st.integers(0, 3), ttl_st),
    st.tuples(st.just("delete"), key_st),
    st.tuples(st.just("advance"), st.integers(1, 3)),
    st.tuples(st.just("sessions_of"), worker_st, st.none() | st.integers(1, 4)),
)


@pytest.mark.parametrize("granularity", [0.25, 1.0, 4.0])
@settings(max_examples=60, deadline=None)
@given(ops=st.lists(op_st, max_size=60))
def test_table_agrees_with_model(granularity: float, ops: list[tuple[object, ...]]) -> None:
    table = SessionTable(CAPACITY, granularity)
    model = Model(CAPACITY)
    t = 0.0
    for op in ops:
        name = op[0]
        if name == "put":
            _, key, worker, activity, ttl = op
            a = Affinity(str(key), str(worker), f"v{activity}", float(activity))
            table.put(a, t + float(ttl), t)
            model.put(a, t + float(ttl), t)
        elif name == "cas":
            _, key, expected, worker, ttl = op
            a = Affinity(str(key), str(worker), "v", t)
            got = table.compare_and_set(str(key), expected, a, t + ttl, t)
            assert got == model.cas(str(key), expected, a, t + ttl, t)
        elif name == "touch":
            _, key, activity, ttl = op
            got_touch = table.touch(str(key), float(activity), t + ttl, t)
            assert got_touch == model.touch(str(key), float(activity), t + ttl, t)
        elif name == "delete":
            assert table.delete(str(op[1]), t) == model.delete(str(op[1]), t)
        elif name == "advance":
            t += float(op[1])
        else:
            _, worker, limit = op
            assert table.sessions_of(str(worker), t, limit) == model.sessions_of(
                str(worker), t, limit
            )
        assert len(table) <= CAPACITY
        assert table.counts(t) == model.counts(t)
        for key in KEYS:
            assert table.get(key, t) == model.get(key, t)
