import pytest

from kvgate.engine.stats import E2E_BUCKETS, TTFT_BUCKETS, Histogram


def test_buckets_are_sorted() -> None:
    for bounds in (TTFT_BUCKETS, E2E_BUCKETS):
        assert list(bounds) == sorted(bounds)


def test_histogram_counts_sum_and_inf_bucket() -> None:
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 9.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.counts == (2, 1, 1)
    assert snap.sum == pytest.approx(12.0)
    assert snap.count == 4
    assert snap.cumulative() == [(1.0, 2), (2.0, 3), (float("inf"), 4)]


def test_snapshot_is_a_copy() -> None:
    h = Histogram((1.0,))
    snap = h.snapshot()
    h.observe(0.1)
    assert snap.count == 0
