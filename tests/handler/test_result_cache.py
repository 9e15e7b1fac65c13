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


def test_keys_are_scope_and_request_id_apart_and_a_conflict_names_only_the_id():
    from handler.result_cache import ResultKey

    async def main():
        c = ResultCache(4, 60)
        a, b = ResultKey("a", "b\x00c"), ResultKey("a\x00b", "c")  # one string "a\x00b\x00c" for both, once
        assert await c.claim(a, "fp") is None
        assert await c.claim(b, "other") is None  # its own entry: no conflict, nothing shared
        c.store(a, ["a"])
        c.store(b, ["b"])
        assert await c.claim(a, "fp") == ["a"] and await c.claim(b, "other") == ["b"]
        assert await c.claim(ResultKey(None, "c"), "fp") is None  # no scope is a scope of its own
        with pytest.raises(JobError) as info:
            await c.claim(ResultKey("tenant:secret-salt", "r-1"), "fp") or await c.claim(
                ResultKey("tenant:secret-salt", "r-1"), "changed")
        err = info.value.to_dict()
        assert err["field"] == "request_id" and "'r-1'" in err["message"] and "secret-salt" not in str(err)

    asyncio.run(main())
