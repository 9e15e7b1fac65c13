"""AsyncLLMEngine: a background task steps the engine while work exists;
each request streams cumulative outputs (with the new text delta) to its consumer."""
from __future__ import annotations

import asyncio
import logging

from engine.config import EngineConfig
from engine.errors import EngineDeadError, EngineError
from engine.llm_engine import LLMEngine
from engine.lora.manager import check_lora_request
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._queues: dict[str, asyncio.Queue] = {}
        self._loop_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._lock = None  # engine calls run in one worker thread at a time
        self._dead: EngineError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncLLMEngine":
        return cls(LLMEngine(config))

    # properties the worker reads
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def input_processor(self):
        """engine.input_processor.InputProcessor: prompts and params into EngineRequests."""
        return self.engine.input_processor

    @property
    def kv_capacity_tokens(self) -> int:
        return self.engine.kv_capacity_tokens

    @property
    def max_request_tokens(self) -> int:
        """The largest request (prompt + output tokens) one sequence can be."""
        return self.engine.max_request_tokens

    @property
    def request_kv_tokens(self) -> int:
        """The most KV tokens one request holds at once (less than its length when every layer slides)."""
        return self.engine.request_kv_tokens

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def model_name(self) -> str:
        return self.engine.config.served_model_name or self.engine.config.model

    @property
    def is_dead(self) -> bool:
        return self._dead is not None

    def stats(self) -> dict:
        return {**self.engine.stats(), "num_streams": len(self._queues)}

    def _ensure_loop(self):
        loop = asyncio.get_running_loop()
        if self._wake is None or self._loop is not loop:  # first use, or a new event loop
            self._loop = loop
            self._wake = asyncio.Event()
            self._lock = asyncio.Lock()
            self._loop_task = None
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run_loop())

    async def _run_loop(self):
        while True:
            if not self.engine.has_unfinished_requests():
                self._wake.clear()
                ttl = self.engine.scheduler.bm.ttl_s
                if ttl is None:
                    await self._wake.wait()
                    continue
                try:  # idle: wake now and then to zero the KV of blocks whose TTL passed
                    await asyncio.wait_for(self._wake.wait(), timeout=min(ttl / 2, 5.0))
                except asyncio.TimeoutError:
                    async with self._lock:
                        self.engine.scrub_expired()
                continue
            try:
                async with self._lock:
                    outputs = await asyncio.to_thread(self.engine.step)
            except Exception as exc:  # noqa: BLE001 - an engine-wide failure fails every request
                log.exception("engine step failed; the engine is dead")
                self._dead = EngineDeadError(f"engine step failed: {exc}")
                for rid, q in list(self._queues.items()):
                    q.put_nowait(self._dead)
                return
            for out in outputs:
                q = self._queues.get(out.request_id)
                if q is not None:
                    q.put_nowait(out)
            await asyncio.sleep(0)

    async def generate(self, prompt, params: SamplingParams | None = None, request_id: str = "",
                       priority: int = 0, cache_salt: str | None = None, lora_request=None):
        """Async generator of cumulative RequestOutputs of a prompt (or an EngineRequest
        from `input_processor`, with params None) run with an adapter (lora_request, an
        engine.LoRARequest) or the base model; raises the request's EngineError if it fails;
        cancelling the consumer aborts the request."""
        if self._dead is not None:
            raise EngineDeadError(f"engine is dead: {self._dead.message}")
        self._ensure_loop()
        q: asyncio.Queue = asyncio.Queue()
        manager = self.engine.lora
        loaded = None
        if lora_request is not None and manager is not None and not manager.cached(lora_request):
            loaded = await asyncio.to_thread(manager.load, lora_request)  # file reads off the event loop
        async with self._lock:
            if loaded is not None:
                manager.put(loaded)  # add_request finds it cached
            self.engine.add_request(request_id, prompt, params, priority=priority, cache_salt=cache_salt,
                                    lora_request=lora_request)
        self._queues[request_id] = q
        self._wake.set()
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, Exception):
                    raise item
                out: RequestOutput = item
                if out.error is not None:
                    finished = True
                    raise out.error
                finished = out.finished
                yield out
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                await self.abort(request_id)

    def load_lora(self, lora_request) -> None:
        """Read and check an adapter before any request names it (the worker's start: a bad one is
        found then, not by a request). Blocking (its files are read): call it before requests run.
        LoRAError naming what is wrong; kept in the host cache while max_cpu_loras leaves room."""
        manager = self.engine.lora
        check_lora_request(manager, lora_request)
        adapter = manager.load(lora_request)
        if not manager.cached(lora_request) and len(manager.cpu) < manager.max_cpu:
            manager.put(adapter)

    def queued_since(self, request_id: str) -> float | None:
        """Since when the request waits in the engine's queue, first or after a preemption (None: running)."""
        return self.engine.queued_since(request_id)

    async def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks; its stream ends with finish_reason "abort"."""
        if self._lock is None:
            return
        async with self._lock:
            out = self.engine.abort_request(request_id)
        q = self._queues.get(request_id)
        if out is not None and q is not None:
            q.put_nowait(out)

    async def shutdown(self):
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._loop_task = None
        self.engine.close()  # tensor-parallel worker processes stop with the engine (SIGTERM drain ends here)
