"""The RunPod SDK's face of the worker: the async-generator job handler, the
concurrency modifier tied to free KV blocks, and asking RunPod to replace the
worker when its engine cannot go on."""
from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from handler.engine_setup import EngineLoader, build_engine, model_label
from handler.errors import JobError, error_item, invalid
from handler.job.admission import KVAdmission
from handler.job.context import JobContext, job_finished
from handler.job.requests import JobRequests, job_prompt
from handler.job_input import parse_job_input
from handler.lora.served import ServedAdapters
from handler.native.output import generate_items, worker_vllm_items
from handler.openai.completions_output import models_response, openai_items
from handler.openai.responses_output import responses_items
from handler.result_cache import ResultCache
from handler.runpod_loop.drain import Drain, JobDrain, JobEngine, unless_expired
from handler.runpod_loop.job_take import UnreadableInput
from handler.summarize.job import summarize_items
from handler.tools.chat_options import setup_chat

log = logging.getLogger("handler.worker")


class Worker:
    """Owns the engine and serves jobs; `runpod_config()` is what runpod.serverless.start gets."""

    def __init__(self, settings: Any, *, engine_factory: Callable[[Any, Callable], Any] | None = None,
                 progress: Callable[[dict, Any], None] | None = None, metrics=None):
        from handler.metrics import Metrics

        self.settings = settings
        self.sdk_config: dict | None = None
        self.dead: JobError | None = None
        self.in_flight = 0
        self.metrics = metrics or Metrics()
        self.cache = ResultCache(settings.result_cache_size, settings.result_cache_ttl_s)
        # SIGTERM's drain: the SDK loop (handler.runpod_loop.scaler) starts and ends it, each job registers
        self.drain = Drain(settings.drain_timeout_s, self._abort_request)
        self.admission = KVAdmission()  # engine requests enter when the KV blocks they may hold fit
        self.adapters = ServedAdapters(settings)  # LORA_MODULES: loaded and checked with the engine
        self.loader = EngineLoader(settings, self.adapters.wrap(engine_factory or build_engine), self.metrics,
                                   progress=progress, on_failure=self._request_refresh)

    @property
    def engine(self):
        """The engine once loaded (None before)."""
        return self.loader.engine

    # -- what the SDK calls ------------------------------------------------------------
    def runpod_config(self) -> dict:
        self.sdk_config = {
            "handler": self.handle,
            "concurrency_modifier": self.concurrency_modifier,
            "return_aggregate_stream": True,
        }
        return self.sdk_config

    def concurrency_modifier(self, current: int) -> int:
        """How many jobs to hold: MAX_CONCURRENCY until the engine is up (jobs arriving
        during the load share it); then the jobs the free KV blocks hold, JOB_KV_TOKENS each.

        The SDK only resizes when no job is in flight (it stops taking jobs until then),
        so while jobs run the value only drops, and only when the engine is short of blocks."""
        cap = self.settings.max_concurrency
        engine = self.engine
        if engine is None or self.dead is not None:
            value = cap if engine is None and self.dead is None else max(1, current)
        else:
            stats = engine.stats()
            self.metrics.engine_state(stats)
            per_job_tokens = self.settings.job_kv_tokens or engine.request_kv_tokens
            per_job = max(1, math.ceil(per_job_tokens / stats["kv_block_size"]))
            # blocks admitted to requests may not be allocated yet: count them as taken
            free = min(stats["kv_blocks_free"], stats["kv_blocks_total"] - self.admission.reserved)
            fits = self.in_flight + max(0, free) // per_job
            value = max(1, min(cap, fits))
            if self.in_flight and not (value < current and stats["num_waiting"] > 0):
                value = current
        self.metrics.concurrency.set(value)
        return value

    async def handle(self, job: dict) -> AsyncIterator[Any]:
        """The async-generator handler: output items, then (on failure) one error item last."""
        ctx = JobContext(job)
        live = self.drain.enter()
        self.in_flight += 1
        self.metrics.in_flight.inc()
        error: JobError | None = None
        status = "cancelled"
        try:
            async with contextlib.aclosing(self._job_items(ctx, live)) as items:
                async for item in items:
                    yield item
            status = "completed"
        except JobError as exc:  # the drain's deadline turns its abort into worker_shutdown
            error, status = self.drain.ended(exc, live), "failed"
        except Exception as exc:  # noqa: BLE001 - any bug still ends as a FAILED job with an error object
            ctx.log.exception("unexpected error")
            error, status = JobError.from_exception(exc), "failed"
        finally:
            self.drain.leave(live)
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            stats = self.engine.stats() if self.engine is not None else None
            job_finished(ctx, status, error, self.metrics, stats, self.in_flight)
        if error is not None:
            if error.code == "engine_dead":
                self._engine_died(error, ctx)
            yield error_item(error)

    # -- job flow ---------------------------------------------------------------------------
    async def _job_items(self, ctx: JobContext, live: JobDrain) -> AsyncIterator[Any]:
        """A job's items: from the result cache for a known request_id, else run."""
        raw = ctx.job.get("input")
        if isinstance(raw, UnreadableInput):  # the job take could not parse this job's body
            raise invalid("input", raw.reason)
        spec = parse_job_input(raw, self.settings)
        ctx.spec = spec
        for note in spec.notes:
            ctx.log.warning(note)
        if spec.timeout_s:
            ctx.deadline = ctx.start + spec.timeout_s
        if spec.route == "/v1/models":
            base = model_label(self.settings)
            yield models_response(base, self.engine.max_model_len if self.engine else None,
                                  self.adapters.model_cards(base))
            return
        if spec.idempotency_key is None:
            async with contextlib.aclosing(self._run(ctx, live)) as items:
                async for item in items:
                    yield item
            return
        stored = await self.cache.claim(spec.result_key, spec.fingerprint)
        if stored is not None:
            ctx.cached = True
            ctx.log.info("request_id %r: returning the stored result", spec.idempotency_key)
            for i, item in enumerate(stored):
                last = i == len(stored) - 1
                yield {**item, "cached": True} if last and isinstance(item, dict) else item
            return
        items: list = []
        try:
            async with contextlib.aclosing(self._run(ctx, live)) as gen:
                async for item in gen:
                    items.append(item)
                    yield item
        except BaseException:
            self.cache.release(spec.result_key)
            raise
        self.cache.store(spec.result_key, items)

    async def _run(self, ctx: JobContext, live: JobDrain) -> AsyncIterator[Any]:
        """Load the engine (once), then run the job's route (not after the drain's deadline)."""
        if self.dead is not None:
            raise JobError("engine_dead", self.dead.message)
        if self.drain.expired:
            raise self.drain.shutdown_error(running=False)
        engine = self.engine
        if engine is None:  # loading: a job waiting for it ends at the drain's deadline too
            engine = await unless_expired(live, self.drain, self.loader.get(ctx))
        else:
            self.loader.start_summary()  # loaded at start, before the SDK's event loop ran
        spec = ctx.spec
        spec.lora_request = self.adapters.request(spec.lora)  # None: the base model
        model = spec.lora or model_label(self.settings)  # what the OpenAI routes answer as `model`
        # the job's view of the engine records its request ids, for the drain's aborts
        run = JobRequests(ctx, JobEngine(engine, self.drain, live), spec, self.settings, self.admission)
        if spec.route == "summarize":
            items = summarize_items(run)
        else:
            setup_chat(run)  # tool-call and reasoning parsers for this model (may adjust the sampling)
            request = run.prepare(job_prompt(spec), spec.params)
            if spec.route == "/v1/responses":
                items = responses_items(run, request, ctx.id, model)
            elif spec.is_openai:
                items = openai_items(run, request, ctx.id, model)
            elif self.settings.output_format == "worker-vllm":
                items = worker_vllm_items(run, request, ctx.id)
            else:
                items = generate_items(run, request, ctx.id)
        async with contextlib.aclosing(items):
            async for item in items:
                yield item

    # -- replacing the worker ------------------------------------------------------------------
    def _engine_died(self, error: JobError, ctx: JobContext) -> None:
        if self.dead is None:
            self.dead = error
            ctx.log.error("engine is dead (%s): asking RunPod to replace this worker", error.message)
        self._request_refresh("the engine is dead")

    def _request_refresh(self, why: str) -> None:
        """Ask RunPod to replace the worker. The SDK reads `refresh_worker` from our
        config dict when a job ends (also for generator handlers): it adds stopPod to
        the result and stops taking jobs; the process then exits."""
        if self.sdk_config is not None and not self.sdk_config.get("refresh_worker"):
            self.sdk_config["refresh_worker"] = True
            log.error("%s: this worker will be replaced after the jobs in flight", why)

    # -- shutdown --------------------------------------------------------------------------------
    async def _abort_request(self, request_id: str) -> None:
        """The drain's deadline: abort one request (it ends with finish_reason "abort")."""
        if self.engine is not None:
            await self.engine.abort(request_id)

    async def aclose(self) -> None:
        """Stop the background tasks (the engine's loop, the summary logger)."""
        await self.loader.aclose()

    def close(self) -> dict | None:
        """After the SDK's loop ended: log the final state; returns the engine stats."""
        stats = self.engine.stats() if self.engine is not None else None
        if stats:
            self.metrics.engine_state(stats)
        log.info("worker exit: metrics %s", json.dumps(self.metrics.summary()))
        log.info("worker exit: engine stats %s", json.dumps(stats))
        return stats
