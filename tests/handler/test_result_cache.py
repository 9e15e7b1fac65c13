"""request_id results: stored, shared with a concurrent duplicate, refused for other input."""
import asyncio

import pytest

from handler.errors import JobError
from handler.result_cache import ResultCache


def test_store_and_return():
    async def main():
        c = ResultCache(4, 60)
        assert await c.claim("r", "fp") is None
        c.store("r", [{"text": "x"}])
        assert await c.claim("r", "fp") == [{"text": "x"}]
        with pytest.raises(JobError) as info:
            await c.claim("r", "other")
        assert info.value.details["field"] == "request_id"

    asyncio.run(main())


async def owner_and_waiter() -> tuple[ResultCache, asyncio.Future]:
    """A cache whose request "r" is claimed (running), and a duplicate claim waiting on it."""
    c = ResultCache(4, 60)
    assert await c.claim("r", "fp") is None
    waiter = asyncio.ensure_future(c.claim("r", "fp"))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    return c, waiter


def test_a_duplicate_waits_for_the_running_one():
    async def main():
        c, waiter = await owner_and_waiter()
        c.store("r", ["done"])
        assert await waiter == ["done"]

    asyncio.run(main())


def test_a_failed_owner_lets_the_duplicate_compute():
    async def main():
        c, waiter = await owner_and_waiter()
        c.release("r")
        assert await waiter is None  # it owns the id now

    asyncio.run(main())


def test_expiry_and_size_limit():
    async def main():
        now = [0.0]
        c = ResultCache(2, 10, clock=lambda: now[0])
        for rid in "abc":
            await c.claim(rid, "fp")
            c.store(rid, [rid])
        assert len(c) == 2 and await c.claim("c", "fp") == ["c"]
        now[0] = 11
        assert await c.claim("c", "fp") is None  # expired: computed again

    asyncio.run(main())
