import pytest

from workers.snapshot import RetryableStoreError, RetryPolicy, StoreError
from workers.snapshot.retry import retrying

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.002)


def test_backoff_doubles_up_to_the_cap() -> None:
    p = RetryPolicy(base_delay=0.2, max_delay=1.0)
    assert [p.delay(n) for n in (1, 2, 3, 4, 5)] == [0.2, 0.4, 0.8, 1.0, 1.0]


async def test_transient_errors_are_retried() -> None:
    calls = []

    async def op() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RetryableStoreError("503")
        return "ok"

    assert await retrying(op, FAST) == "ok" and len(calls) == 3


async def test_gives_up_after_the_last_attempt() -> None:
    calls = []

    async def op() -> None:
        calls.append(1)
        raise RetryableStoreError("503")

    with pytest.raises(RetryableStoreError):
        await retrying(op, FAST)
    assert len(calls) == 3


async def test_permanent_errors_are_not_retried() -> None:
    calls = []

    async def op() -> None:
        calls.append(1)
        raise StoreError("access denied")

    with pytest.raises(StoreError):
        await retrying(op, FAST)
    assert len(calls) == 1
