"""Results kept by request_id within a scope (the job's cache salt): the same id with the
same input gets the stored result (or waits for the running one); the same id with other
input is refused, naming the id and never the scope."""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from handler.errors import invalid


class ResultKey(NamedTuple):
    """A stored result's key: no string joins the two, so neither part can forge the other."""

    scope: str | None  # the job's derived cache salt (tenants never share results); never shown
    request_id: str


@dataclass(slots=True)
class _Entry:
    fingerprint: str
    items: list | None = None  # set once completed
    done: asyncio.Event = field(default_factory=asyncio.Event)
    expires: float = float("inf")


class ResultCache:
    """Completed jobs' items by key, at most `size` of them, each for `ttl_s` seconds."""

    def __init__(self, size: int, ttl_s: float, clock=time.monotonic):
        self.size = size
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()

    def _expire(self):
        now = self.clock()
        for rid in [r for r, e in self._entries.items() if e.items is not None and e.expires <= now]:
            del self._entries[rid]

    async def claim(self, key: Hashable, fingerprint: str) -> list | None:
        """The stored items for (key: a ResultKey or a plain id, fingerprint), waiting for a running job
        with them; None when the caller must compute (it then owns the id until
        `store` or `release`). Raises invalid_input for the same id with other input."""
        while True:
            self._expire()
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = _Entry(fingerprint)
                return None
            if entry.fingerprint != fingerprint:
                shown = key.request_id if isinstance(key, ResultKey) else key
                raise invalid("request_id", f"{shown!r} was already used with a different input")
            if entry.items is not None:
                self._entries.move_to_end(key)
                return entry.items
            await entry.done.wait()  # the running job stores or releases

    def store(self, key: Hashable, items: list) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        if self.size <= 0:
            self.release(key)
            return
        entry.items = items
        entry.expires = self.clock() + self.ttl_s
        entry.done.set()
        done = [r for r, e in self._entries.items() if e.items is not None]
        for rid in done[: max(0, len(done) - self.size)]:
            del self._entries[rid]

    def release(self, key: Hashable) -> None:
        """The owning job failed or was cancelled: forget the id (a retry computes again)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.done.set()

    def __len__(self) -> int:
        return len(self._entries)
