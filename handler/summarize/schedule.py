"""Which engine calls of the summarize jobs in one worker run now: a document's last call
(its reduce step, or the only call of a short document) before map calls and other long
calls, shorter documents before longer ones, within the KV cache; on the CPU, where a step
costs in proportion to its tokens, long prefills go one at a time and wait while a short
last call runs or waits."""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

# an engine's input processor (one per engine; jobs see the engine through views of their own) -> its gate
_gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(order=True)
class _Call:
    key: tuple  # (0 for a last call else 1, document size, arrival): lower runs first
    kv: int = field(compare=False)
    final: bool = field(compare=False)
    admitted: asyncio.Future = field(compare=False)
    prefilling: bool = field(default=False, compare=False)


class Slot:
    """An admitted call; `prefilled()` when its first token arrived (its prompt is in the KV cache)."""

    def __init__(self, gate: CallGate, call: _Call):
        self._gate, self._call = gate, call

    def prefilled(self) -> None:
        self._gate.prefilled(self._call)


class CallGate:
    """Admits calls in (last call first, shorter document first, arrival) order while the admitted
    ones' KV tokens (prompt + output) fit `kv_tokens`. `exclusive`: a map call is admitted only
    while no last call runs or waits and no other map call is still in its prefill, so a short
    document's tokens never share an engine step with long prefills it did not find running."""

    def __init__(self, kv_tokens: int, exclusive: bool):
        self.kv_tokens = max(1, kv_tokens)
        self.exclusive = exclusive
        self.waiting: list[_Call] = []  # a heap
        self.kv_in_use = 0
        self.running = 0
        self.finals_running = 0
        self.maps_prefilling = 0
        self._arrival = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self, *, final: bool, size: int, kv: int, timeout: float | None = None) -> AsyncIterator[Slot]:
        """Wait for admission (at most `timeout` seconds: TimeoutError), hold it for the block."""
        call = _Call((0 if final else 1, size, next(self._arrival)), kv, final,
                     asyncio.get_running_loop().create_future())
        heapq.heappush(self.waiting, call)
        self._admit()
        try:
            await asyncio.wait_for(asyncio.shield(call.admitted), timeout)
        except BaseException:
            if call.admitted.done():
                self._release(call)
            else:
                call.admitted.cancel()
                self.waiting.remove(call)
                heapq.heapify(self.waiting)
                self._admit()
            raise
        try:
            yield Slot(self, call)
        finally:
            self._release(call)

    def prefilled(self, call: _Call) -> None:
        if call.prefilling:
            call.prefilling = False
            self.maps_prefilling -= 1
            self._admit()

    def _admissible(self, call: _Call) -> bool:
        if self.running and self.kv_in_use + call.kv > self.kv_tokens:
            return False
        return call.final or not self.exclusive or (self.finals_running == 0 and self.maps_prefilling == 0)

    def _admit(self) -> None:
        while self.waiting and self._admissible(self.waiting[0]):
            call = heapq.heappop(self.waiting)
            self.running += 1
            self.kv_in_use += call.kv
            self.finals_running += call.final
            call.prefilling = not call.final
            self.maps_prefilling += call.prefilling
            call.admitted.set_result(None)

    def _release(self, call: _Call) -> None:
        self.prefilled(call)
        self.running -= 1
        self.kv_in_use -= call.kv
        self.finals_running -= call.final
        self._admit()


def call_gate(engine) -> CallGate:
    """The gate of this engine's summarize calls (one per engine, made on first use): the KV
    cache's tokens; exclusive on the CPU."""
    key = engine.input_processor
    gate = _gates.get(key)
    if gate is None:
        exclusive = not str(getattr(engine, "device", "cpu")).startswith("cuda")
        gate = _gates[key] = CallGate(int(engine.kv_capacity_tokens), exclusive)
    return gate
