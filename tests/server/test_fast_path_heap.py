"""The serving process's heap frozen after loading (``server/runtime/heap.py``): collections
skip the loaded models, and a retired version's reference cycles are still collected."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from polling import until_async

from tierserve.server.runtime import heap


@pytest.fixture
def thawed():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


class Version:
    """Stands for a loaded model version: an object in a reference cycle."""

    def __init__(self) -> None:
        self.me = self


def test_freeze_exempts_what_is_loaded_and_raises_the_young_threshold(thawed):
    loaded = Version()
    heap.freeze()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] >= heap.GEN0_THRESHOLD
    assert not any(o is loaded for o in gc.get_objects())  # no collection walks it


def test_a_retired_version_is_collected_after_a_swap_and_the_heap_freezes_again(thawed):
    async def main():
        old = Version()
        gone = weakref.ref(old)
        heap.freeze()
        refreezer = heap.Refreezer(asyncio.get_running_loop(), delay_s=0.05)
        del old  # retired: only its own cycle holds it
        gc.collect()
        assert gone() is not None  # frozen: a cycle the collector never sees
        refreezer.version_changed()
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert gone() is None
        # frozen again once the swap is over
        assert await until_async(lambda: gc.get_freeze_count() > 0, timeout=30)
        refreezer.version_changed()
        refreezer.close()  # a pending freeze is cancelled
        await asyncio.sleep(0.1)  # twice the 50 ms delay passes: that nothing happens is the test
        assert gc.get_freeze_count() == 0

    asyncio.run(main())
