"""The shared prefix state (``kvgate.core.holders``) in every store backend."""

from __future__ import annotations

import pytest

from kvgate.store.holders import HolderTable
from kvgate.testing import wait_until

from .harness import StoreUnderTest

A = "http://10.0.0.1:8000"
B = "http://10.0.0.2:8000"
BIG = (1 << 64) - 5  # block hashes are unsigned 64-bit


async def test_holders_roundtrip_in_order_with_gaps(sut: StoreUnderTest) -> None:
    store = sut.store
    assert await store.get_holders([1, 2, BIG]) == [None, None, None]
    await store.set_holders([(1, A), (BIG, B)], 60.0)
    assert await store.get_holders([1, 2, BIG]) == [A, None, B]
    await store.set_holders([(1, B)], 60.0)  # the last writer wins
    assert await store.get_holders([BIG, 1]) == [B, B]
    assert await store.get_holders([]) == []


async def test_holders_are_not_sessions(sut: StoreUnderTest) -> None:
    """Evidence of cached blocks must not show up as sessions to drain or count."""
    store = sut.store
    await store.set_holders([(7, A), (8, A)], 60.0)
    assert await store.counts() == {}
    assert await store.sessions_of(A) == []


async def test_holders_expire(sut: StoreUnderTest) -> None:
    store = sut.store
    await store.set_holders([(3, A)], 0.3)
    sut.elapse(1.0)

    async def gone() -> bool:
        return await store.get_holders([3]) == [None]

    await wait_until(gone, timeout=5.0)


def test_holder_table_is_bounded_and_expires_in_virtual_time() -> None:
    table = HolderTable(max_entries=3)
    table.set_many([(1, A), (2, A), (3, B)], now=0.0, ttl=10.0)
    table.set_many([(4, B)], now=1.0, ttl=10.0)
    assert len(table) == 3
    assert table.evictions_total == 1
    assert table.get_many([1, 2, 3, 4], now=2.0) == [None, A, B, B]
    assert table.get_many([2, 4], now=10.5) == [None, B]
    with pytest.raises(ValueError, match="max_entries"):
        HolderTable(0)


async def test_holders_written_soon_are_readable_once_the_store_has_them(
    sut: StoreUnderTest,
) -> None:
    """``set_holders_soon`` (the request path's write): the memory store has it when the
    call returns, a remote store once its background write is done; no failure here."""
    store = sut.store
    failures: list[int] = []
    store.set_holders_soon([(11, A), (12, B)], 60.0, lambda: failures.append(1))

    async def written() -> bool:
        return await store.get_holders([11, 12]) == [A, B]

    await wait_until(written, timeout=5.0)
    assert failures == []
