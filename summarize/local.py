"""Local mode of `summarize`: the worker's own handler in this process, on the local engine
with the worker's settings, each document one job consumed as the runpod SDK consumes it."""
from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

from handler.engine_setup import model_label
from handler.local import run_job
from handler.summarize.job import live_tokens
from summarize.inputs import Document
from summarize.runner import Attempt

log = logging.getLogger("summarize")

MAX_ENGINE_RESTARTS = 2


class LocalRunner:
    """Jobs go to an in-process `Worker` (its engine loads on the first job). A dead engine
    (engine_dead, retryable) is replaced by a new worker, at most MAX_ENGINE_RESTARTS times."""

    def __init__(self, settings: Any, notify: Callable[[str], None] = log.info, worker_factory=None):
        from handler.worker import Worker

        self.settings = settings
        self.notify = notify
        self._factory = worker_factory or (lambda s: Worker(s, progress=self._load_progress))
        self.worker = self._factory(settings)
        self.restarts = 0
        self._ids = itertools.count(1)
        self._stage: str | None = None
        self._lock = asyncio.Lock()
        self._in_flight: set[str] = set()  # ids of the jobs running now

    @property
    def label(self) -> str:
        return f"local ({model_label(self.settings)})"

    async def start(self) -> None:
        if self.worker.engine is None:
            self.notify(f"loading the model ({model_label(self.settings)})")

    async def attempt(self, doc: Document, job_input: dict) -> Attempt:
        worker = self.worker
        job_id = f"local-{next(self._ids)}"
        self._in_flight.add(job_id)
        try:
            result = await run_job(worker.handle, {"id": job_id, "input": job_input})
        finally:
            self._in_flight.discard(job_id)
        if result["status"] == "FAILED" and worker.dead is not None:
            await self._replace(worker)
        return Attempt(result["status"], result.get("output"), result.get("error"), job_id)

    def tokens_in_flight(self) -> int:
        """Tokens the jobs running now have used so far (prompts read, summary tokens made)."""
        return sum(live_tokens(job_id) for job_id in self._in_flight)

    def gpu_seconds(self, elapsed: float) -> float | None:
        """The run held one GPU for its whole time when the engine is on CUDA."""
        return elapsed if str(getattr(self.worker.engine, "device", "")).startswith("cuda") else None

    async def close(self) -> None:
        await self.worker.aclose()

    async def _replace(self, dead) -> None:
        async with self._lock:
            if self.worker is not dead or self.restarts >= MAX_ENGINE_RESTARTS:
                return
            self.restarts += 1
            self.notify(f"the engine died ({dead.dead.message}); starting a new one "
                        f"({self.restarts} of {MAX_ENGINE_RESTARTS})")
            await dead.aclose()
            self.worker = self._factory(self.settings)

    def _load_progress(self, job: dict, payload: dict) -> None:
        stage = payload.get("stage")
        if stage and stage != self._stage:
            self._stage = stage
            self.notify(f"loading the model: {stage}")
