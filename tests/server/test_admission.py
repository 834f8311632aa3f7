"""The worker's budget of calls and bytes in flight (server/runtime/admission.py): first come first
served, refused after the admission timeout, nothing kept by a request that gave up; the
Python budget and the native transport's alike."""

from __future__ import annotations

import asyncio

import pytest
from polling import until, until_async

from tierserve.server.errors import http_status
from tierserve.server.grpc.native import native_available
from tierserve.server.runtime.admission import Admission, BurstTrim, LocalBudget, ServerBusyError
from tierserve.server.runtime.allocator import trimmer
from tierserve.server.settings import Settings

KINDS = ["local", "native"] if native_available() else ["local"]


def _budget(kind: str, max_bytes: int, max_calls: int):
    if kind == "native":
        from tierserve_native import Budget

        return Budget(max_bytes, max_calls)
    return LocalBudget(max_bytes, max_calls)


def _admission(kind: str, timeout: float = 5.0) -> Admission:
    settings = Settings.build(config="ps.json", admission_timeout_s=timeout,
                              max_request_bytes=100, max_connection_bytes=100,
                              max_inflight_bytes=100, max_inflight_calls=3)  # fmt: skip
    return Admission(_budget(kind, 100, 3), settings)


@pytest.mark.parametrize("kind", KINDS)
def test_waiters_get_room_in_order_and_are_refused_after_the_timeout(kind):
    async def main():
        admission = _admission(kind, timeout=0.3)
        await admission.take(1, 60)
        order = []

        async def request(name: str, nbytes: int) -> None:
            await admission.take(1, nbytes)
            order.append(name)

        second = asyncio.ensure_future(request("second", 50))
        assert await until_async(lambda: len(admission.waiters) == 1)
        third = asyncio.ensure_future(request("third", 10))  # fits, but waits its turn
        assert await until_async(lambda: len(admission.waiters) == 2)
        assert order == []
        admission.give(1, 60)
        await asyncio.gather(second, third)
        assert order == ["second", "third"]
        with pytest.raises(ServerBusyError) as refused:
            big = asyncio.ensure_future(admission.take(1, 60))
            while not big.done():  # refused once its 0.3 s admission timeout passed
                await asyncio.sleep(0.05)  # the sweep's pace
                admission.waiters.admit()  # what the HTTP sweep does
            await big
        assert http_status(refused.value) == 503 and "max_inflight_bytes" in str(refused.value)
        assert (admission.budget.calls, admission.budget.nbytes) == (2, 60)

    asyncio.run(main())


@pytest.mark.parametrize("room_first", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_request_that_gives_up_while_waiting_keeps_nothing(kind, room_first):
    async def main():
        admission = _admission(kind)
        await admission.take(3, 0)  # every call taken
        waiting = asyncio.ensure_future(admission.take(1, 10))
        assert await until_async(lambda: len(admission.waiters) == 1)
        # room comes just as it gives up, before or after: nothing is kept either way
        if room_first:
            admission.give(1, 0)
            waiting.cancel()
        else:
            waiting.cancel()
            admission.give(1, 0)
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert (admission.budget.calls, admission.budget.nbytes) == (2, 0)
        await admission.take(1, 100)  # and the room is there for the next one

    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_the_heap_is_trimmed_once_a_burst_is_over(kind):
    budget = _budget(kind, 1 << 30, 100)
    trim = BurstTrim(budget, threshold=1 << 20)
    assert budget.try_take(1, 1 << 21)
    assert not trim.check()  # still in flight
    budget.give(1, 1 << 21)
    trim.budget.try_take(1, 1000)  # a little still in flight: the burst is over
    before = trimmer.trims
    assert trim.check()
    assert not trim.check()  # once
    if trimmer._trim is not None:  # glibc
        assert until(lambda: trimmer.trims > before, timeout=30)
