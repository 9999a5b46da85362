"""``core.peers``: a replica's in-flight counts as published, read back and summed."""

from __future__ import annotations

import pytest

from kvgate.core.peers import counts_of, decode, encode, others
from kvgate.core.routed import Routed, Scraped, worker_state
from kvgate.types import WorkerId

A, B = WorkerId("http://a:8000"), WorkerId("http://b:8000")


def test_counts_round_trip_and_idle_workers_are_left_out() -> None:
    counts = counts_of([(A, 2, 300), (B, 0, 0)])
    assert counts == {A: (2, 300)}
    assert decode(encode(counts)) == counts


@pytest.mark.parametrize("data", [b"", b"{", b'{"a": 1}', b"[[1, 2, 3]]", b'[["a", -1, 0]]'])
def test_a_publication_that_is_not_one_counts_nothing(data: bytes) -> None:
    assert decode(data) == {}


def test_the_others_are_summed_and_our_own_left_out() -> None:
    published = {
        "me": encode({A: (5, 500)}),
        "r1": encode({A: (1, 100), B: (2, 50)}),
        "r2": encode({A: (3, 10)}),
        "broken": b"not json",
    }
    assert others(published, "me") == {A: (4, 110), B: (2, 50)}
    assert others({"me": encode({A: (1, 1)})}, "me") == {}


def test_a_snapshot_counts_the_others_with_ours_and_their_freed_kv() -> None:
    signals = Scraped(running=0, waiting=0, kv_usage=0.1, kv_capacity_tokens=1_000)
    routed = Routed(id=A, model="m", probe_ok=True, signals=signals, signals_at=0.0)
    routed = routed.loaded(1, 100).peered(2, 40)
    state = worker_state(routed, 0.0, 3.0)
    assert (state.in_flight, state.kv_in_flight_tokens) == (3, 140)
    assert routed.peered(2, 40) is routed  # unchanged: the same value
    fell = routed.peered(1, 10)
    assert fell.kv_freed_tokens == 30  # the scraped use still counts what they freed
    assert (fell.in_flight, fell.kv_in_flight_tokens) == (1, 100)  # ours alone
