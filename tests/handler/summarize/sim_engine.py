"""A stand-in for the engine whose steps run on a simulated clock, as a CPU costs them (a fixed
cost per step plus one per token in it), with the engine's own scheduler and KV block manager
deciding what each step holds. The real tiny engine beside it does the tokenizing. Nothing
waits on real time: a step runs once every coroutine has gone as far as it can."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from engine.block_manager import BlockManager
from engine.outputs import CompletionOutput, RequestOutput
from engine.scheduler import Scheduler
from engine.sequence import Sequence

STEP_COST = 1.0  # simulated seconds of one step, whatever it holds
TOKEN_COST = 1 / 32  # and of each token in it
SETTLE_ROUNDS = 200  # event-loop passes without news before the next step
TOKEN_ID = 5


@dataclass
class _Sample:
    token_id: int = TOKEN_ID
    logprob: float = 0.0
    top_logprobs: dict | None = None
    error: str | None = None


class SimEngine:
    """`real`'s input processor, sizes and stats; `generate` on the simulated clock `now`."""

    def __init__(self, real, num_blocks: int = 256, budget: int = 2048, max_num_seqs: int = 256):
        self.real = real
        self.scheduler = Scheduler(BlockManager(num_blocks, 16, True), max_num_seqs, budget)
        self.now = 0.0
        self.steps: list[list[str]] = []  # the request ids of each step
        self._queues: dict[str, asyncio.Queue] = {}
        self._seqs: dict[str, Sequence] = {}
        self._loop: asyncio.Task | None = None
        self._wake = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self.real, name)

    @property
    def device(self) -> str:
        return "cpu"

    def queued_since(self, request_id: str) -> float | None:
        seq = self._seqs.get(request_id)
        return seq.arrival_time if seq is not None and seq in self.scheduler.waiting else None

    async def generate(self, request, params=None, request_id: str = "", priority: int = 0, cache_salt=None):
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._run())
        seq = Sequence(request_id, request.prompt, list(request.prompt_token_ids), request.params,
                       request.max_tokens, priority=priority)
        self._seqs[request_id], self._queues[request_id] = seq, asyncio.Queue()
        self.scheduler.add(seq)
        self._wake.set()
        try:
            while True:
                out = await self._queues[request_id].get()
                yield out
                if out.finished:
                    return
        finally:
            if seq.finish_reason is None:  # the consumer went away: abort
                self.scheduler.finish(seq)
            del self._queues[request_id], self._seqs[request_id]

    async def _settle(self) -> None:
        for _ in range(SETTLE_ROUNDS):
            await asyncio.sleep(0)

    async def _run(self) -> None:
        while True:
            await self._settle()
            if not self.scheduler.has_unfinished():
                self._wake.clear()
                await self._wake.wait()
                continue
            out = self.scheduler.schedule()
            self.now += STEP_COST + TOKEN_COST * out.num_batched_tokens
            self.steps.append([seq.request_id for seq, _ in out.scheduled])
            samples = [_Sample() if seq.num_computed_tokens + n >= seq.num_tokens else None
                       for seq, n in out.scheduled]
            for seq, _ in self.scheduler.update_from_output(out.scheduled, samples):
                done = seq.num_output_tokens >= seq.max_tokens
                if done:
                    seq.finish_reason = "length"
                    self.scheduler.finish(seq)
                text = " ".join(["ok"] * seq.num_output_tokens)
                comp = CompletionOutput(0, text, list(seq.output_token_ids), finish_reason=seq.finish_reason)
                self._queues[seq.request_id].put_nowait(
                    RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [comp], done))

    async def shutdown(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        await self.real.shutdown()
