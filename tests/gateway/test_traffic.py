"""The dashboard's ring of recent traffic: fixed buckets, bounded in time and in keys."""

from __future__ import annotations

import pytest

from kvgate.gateway.observe.traffic import TrafficWindow


def test_requests_land_in_the_bucket_of_their_end_time() -> None:
    window = TrafficWindow(bucket_s=10, buckets=6)
    window.record(
        100.0, status=200, worker="a", reason="affinity_hit", prompt_tokens=100, cached_tokens=80
    )
    window.record(105.0, status=200, worker="b", reason="least_loaded", prompt_tokens=100)
    window.record(112.0, status=429, shed_reason="saturated")
    window.record(113.0, status=502, worker="a", reason="affinity_hit", retries=2)
    buckets = window.buckets(115.0)
    assert [b.start for b in buckets] == [60, 70, 80, 90, 100, 110]
    first, second = buckets[-2], buckets[-1]
    assert first.requests == 2 and dict(first.workers) == {"a": 1, "b": 1}
    assert first.hit_rate == pytest.approx(0.4)
    assert second.requests == 2 and second.errors == 1 and second.retries == 2
    assert dict(second.sheds) == {"saturated": 1} and second.hit_rate is None
    total = window.total(115.0, 60)
    assert total.requests == 4
    assert dict(total.reasons) == {"affinity_hit": 2, "least_loaded": 1}


def test_old_buckets_fall_out_and_memory_stays_bounded() -> None:
    window = TrafficWindow(bucket_s=10, buckets=3)
    for t in range(0, 1000, 5):
        window.record(float(t), status=200, worker="a", reason="r")
    assert len(window._ring) == 3
    assert sum(b.requests for b in window.buckets(999.0)) == 6
    # Nothing in the last minute once traffic stopped long ago.
    assert window.total(5000.0, 60).requests == 0


def test_the_last_minute_is_whole_buckets_up_to_now() -> None:
    window = TrafficWindow(bucket_s=10, buckets=30)
    window.record(0.0, status=200, reason="old")
    window.record(55.0, status=200, reason="new")
    assert dict(window.total(59.0, 60).reasons) == {"old": 1, "new": 1}
    assert dict(window.total(60.0, 60).reasons) == {"new": 1}


def test_unexpected_label_values_are_folded_past_the_key_limit() -> None:
    window = TrafficWindow(max_keys=2)
    for worker in ("a", "b", "c", "d", "a"):
        window.record(1.0, status=200, worker=worker)
    assert dict(window.buckets(1.0)[-1].workers) == {"a": 2, "b": 1, "(other)": 2}


def test_a_clock_that_steps_back_counts_in_the_newest_bucket() -> None:
    window = TrafficWindow(bucket_s=10, buckets=3)
    window.record(25.0, status=200)
    window.record(12.0, status=200)
    assert [b.requests for b in window.buckets(25.0)] == [0, 0, 2]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        TrafficWindow(bucket_s=0)
    with pytest.raises(ValueError):
        TrafficWindow(buckets=0)
