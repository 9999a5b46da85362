import pytest

from kvgate.engine.offload import OffloadStore

BYTES = 1_000_000


def store(cpu: int, disk: int) -> OffloadStore:
    return OffloadStore(cpu, disk, 10e9, 1e9, BYTES)


def test_put_and_take_cost_the_tier_transfer_time() -> None:
    s = store(2, 2)
    assert s.put(1) == pytest.approx(BYTES / 10e9)
    assert s.locate(1) == "cpu"
    assert s.take(1) == pytest.approx(BYTES / 10e9)
    assert 1 not in s


def test_full_cpu_tier_demotes_its_oldest_block_to_disk() -> None:
    s = store(2, 2)
    for block in (1, 2, 3):
        s.put(block)
    assert s.locate(1) == "disk"
    assert [s.locate(b) for b in (2, 3)] == ["cpu", "cpu"]
    assert s.take(1) == pytest.approx(BYTES / 1e9)


def test_full_disk_tier_drops_its_oldest_block() -> None:
    s = store(1, 1)
    for block in (1, 2, 3):
        s.put(block)
    assert 1 not in s
    assert (s.locate(2), s.locate(3), s.dropped) == ("disk", "cpu", 1)


def test_reput_refreshes_recency() -> None:
    s = store(2, 0)
    s.put(1)
    s.put(2)
    s.put(1)
    s.put(3)
    assert 1 in s
    assert 2 not in s


def test_disk_only_and_no_capacity() -> None:
    s = store(0, 1)
    s.put(1)
    assert s.locate(1) == "disk"
    none = store(0, 0)
    assert not none.enabled
    assert none.put(1) is None
    assert none.dropped == 1
    with pytest.raises(KeyError):
        none.take(1)
