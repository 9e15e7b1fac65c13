"""KV admission: a job's engine request enters the engine only when the KV blocks it may come
to hold (every choice of it, each up to its max_tokens; a window for a model whose every layer
slides) fit beside those of the requests already admitted, so n x tokens cannot set off a
preemption storm. The others wait, in (priority, arrival) order, and count as queued: past
QUEUE_TIMEOUT_S they fail `overloaded` (retryable); a request that could never fit fails
`kv_capacity`. The blocks admitted but not yet free lower what the concurrency modifier offers."""
from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from dataclasses import dataclass, field

from handler.errors import JobError


def kv_blocks(request, engine, prefix_caching: bool) -> int:
    """The most KV blocks `request` (an engine request: prompt ids, max_tokens, its choices) holds:
    its first choice whole; each other choice its own tokens (with prefix caching the prompt's
    full blocks are shared), each at most what one sequence holds at once (request_kv_tokens)."""
    stats = engine.stats()
    size = stats["kv_block_size"]
    per_seq = engine.request_kv_tokens
    prompt, out = len(request.prompt_token_ids), request.max_tokens
    first = math.ceil(min(prompt + out, per_seq) / size)
    own = (prompt % size if prefix_caching else prompt) + out
    return first + (request.params.num_choices - 1) * math.ceil(min(own, per_seq) / size)


@dataclass(order=True, slots=True)
class _Waiter:
    priority: int
    arrival: int
    blocks: int = field(compare=False)
    granted: asyncio.Future = field(compare=False)


class KVAdmission:
    """The worker's ledger of admitted KV blocks (`reserved`) and the requests waiting for room."""

    def __init__(self):
        self.reserved = 0
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(self, blocks: int, total: int, priority: int, timeout: float | None,
                      overloaded: JobError) -> None:
        """Admit `blocks` (of `total`), waiting in order for room; raises `overloaded` when `timeout`
        passes first, kv_capacity when they could never fit."""
        if blocks > total:
            raise JobError("kv_capacity", f"the request's choices may hold {blocks} KV blocks; the whole cache "
                           f"has {total}: ask for fewer choices or max_tokens", needed_blocks=blocks,
                           capacity_blocks=total)
        waiter = _Waiter(priority, next(self._arrivals), blocks, asyncio.get_running_loop().create_future())
        bisect.insort(self._waiting, waiter)
        self._grant(total)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.granted), timeout)
        except TimeoutError:
            self._give_up(waiter, total)
            raise overloaded from None
        except BaseException:  # cancelled (RunPod stopped the job), or the drain's deadline
            self._give_up(waiter, total)
            raise

    def _give_up(self, waiter: _Waiter, total: int) -> None:
        if waiter.granted.done() and not waiter.granted.cancelled():
            self.release(waiter.blocks, total)  # granted as the wait ended: give it back
        else:
            waiter.granted.cancel()
            self._waiting.remove(waiter)
            self._grant(total)

    def release(self, blocks: int, total: int) -> None:
        self.reserved -= blocks
        self._grant(total)

    def _grant(self, total: int) -> None:
        """Admit the waiters in order while the first fits (or nothing else is admitted)."""
        while self._waiting:
            head = self._waiting[0]
            if self.reserved and self.reserved + head.blocks > total:
                return
            self._waiting.pop(0)
            self.reserved += head.blocks
            head.granted.set_result(None)
