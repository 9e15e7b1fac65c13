"""The job handler: the engine's lifecycle (one lazy load shared by the jobs
arriving during it), the async-generator handler, concurrency, and shutdown."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from handler import summarize_core, summarize_job
from handler.engine_setup import build_engine
from handler.errors import JobError, error_item, invalid
from handler.job_report import JobContext, job_finished
from handler.limits import output_cap
from handler.openai_routes import OpenAIFormatter, models_response
from handler.request_stream import Completion, RequestStream
from handler.result_cache import ResultCache
from handler.schema import JobSpec, parse_job_input

log = logging.getLogger("handler.worker")

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct-AWQ"


class Worker:
    """Owns the engine and serves jobs; `runpod_config()` is what runpod.serverless.start gets."""

    def __init__(self, settings: Any, *, engine_factory: Callable[[Any, Callable], Any] | None = None,
                 progress: Callable[[dict, Any], None] | None = None, metrics=None):
        from handler.metrics import Metrics

        self.settings = settings
        self.engine = None
        self.sdk_config: dict | None = None
        self.dead: JobError | None = None
        self.in_flight = 0
        self.metrics = metrics or Metrics()
        self.cache = ResultCache(settings.result_cache_size, settings.result_cache_ttl_s)
        self._engine_factory = engine_factory or build_engine
        self._progress = progress
        self._load_task: asyncio.Task | None = None
        self._load_error: JobError | None = None
        self._summary_task: asyncio.Task | None = None
        self._load_stage: str | None = None

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
            per_job = max(1, math.ceil(self._job_kv_tokens(engine) / stats["kv_block_size"]))
            fits = self.in_flight + stats["kv_blocks_free"] // per_job
            value = max(1, min(cap, fits))
            if self.in_flight and not (value < current and stats["num_waiting"] > 0):
                value = current
        self.metrics.concurrency.set(value)
        return value

    def _job_kv_tokens(self, engine) -> int:
        return self.settings.job_kv_tokens or min(engine.max_model_len, engine.kv_capacity_tokens)

    async def handle(self, job: dict) -> AsyncIterator[Any]:
        """The async-generator handler: output items, then (on failure) one error item last."""
        ctx = JobContext(job)
        self.in_flight += 1
        self.metrics.in_flight.inc()
        error: JobError | None = None
        status = "cancelled"
        try:
            async with contextlib.aclosing(self._job_items(ctx)) as items:
                async for item in items:
                    yield item
            status = "completed"
        except JobError as exc:
            error, status = exc, "failed"
        except Exception as exc:  # noqa: BLE001 - any bug still ends as a FAILED job with an error object
            ctx.log.exception("unexpected error")
            error, status = JobError.from_exception(exc), "failed"
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.dec()
            self._finished(ctx, status, error)
        if error is not None:
            if error.code == "engine_dead":
                self._engine_died(error, ctx)
            yield error_item(error)

    # -- job flow ---------------------------------------------------------------------------
    async def _job_items(self, ctx: JobContext) -> AsyncIterator[Any]:
        spec = parse_job_input(ctx.job.get("input"), self.settings)
        ctx.spec = spec
        for note in spec.notes:
            ctx.log.warning(note)
        if spec.timeout_s:
            ctx.deadline = ctx.start + spec.timeout_s
        if spec.route == "/v1/models":
            yield models_response(self.model_label(), self.engine.max_model_len if self.engine else None)
            return
        owner = False
        if spec.request_id:
            stored = await self.cache.claim(spec.result_key, spec.fingerprint)
            if stored is not None:
                ctx.cached = True
                ctx.log.info("request_id %r: returning the stored result", spec.request_id)
                for i, item in enumerate(stored):
                    last = i == len(stored) - 1
                    yield {**item, "cached": True} if last and isinstance(item, dict) else item
                return
            owner = True
        items: list = []
        ok = False
        try:
            engine = await self._get_engine(ctx)
            if spec.route == "summarize":
                gen = summarize_job.summarize_items(self, ctx, engine, spec)
            elif spec.is_openai:
                gen = self._openai(ctx, engine, spec)
            else:
                gen = self._generate(ctx, engine, spec)
            async with contextlib.aclosing(gen):
                async for item in gen:
                    items.append(item)
                    yield item
            ok = True
        finally:
            if owner:
                if ok:
                    self.cache.store(spec.result_key, items)
                else:
                    self.cache.release(spec.result_key)

    async def _generate(self, ctx: JobContext, engine, spec: JobSpec) -> AsyncIterator[dict]:
        ids = self._prompt_ids(engine, spec)
        buf, buf_tokens = "", 0
        sizes = spec.batching.sizes()
        target = next(sizes)
        comp = None
        async with contextlib.aclosing(self._events(ctx, engine, ids, spec.sampling, ctx.id, spec)) as events:
            async for kind, value, ntok in events:
                if kind == "done":
                    comp = value
                    continue
                buf += value
                buf_tokens += ntok
                if spec.stream and buf and buf_tokens >= target:
                    yield {"text": buf}
                    buf, buf_tokens, target = "", 0, next(sizes)
        self._check(ctx, spec, comp)
        yield self._final_item(ctx, comp, buf if spec.stream else comp.text)

    async def _openai(self, ctx: JobContext, engine, spec: JobSpec) -> AsyncIterator[Any]:
        fmt = OpenAIFormatter(spec.route, ctx.id, self.model_label(), role=self.settings.openai_response_role,
                              raw=self.settings.raw_openai_output, include_usage=spec.include_usage)
        ids = self._prompt_ids(engine, spec)
        chunks: list[dict] = [fmt.chunk("", first=True)] if fmt.chat else []
        sizes = spec.batching.sizes()
        target, buf_tokens = next(sizes), 0
        comp = None
        async with contextlib.aclosing(self._events(ctx, engine, ids, spec.sampling, ctx.id, spec)) as events:
            async for kind, value, ntok in events:
                if kind == "done":
                    comp = value
                    continue
                if not spec.stream:
                    continue
                if value:
                    chunks.append(fmt.chunk(value))
                buf_tokens += ntok
                if chunks and buf_tokens >= target:
                    yield fmt.pack(chunks)
                    chunks, buf_tokens, target = [], 0, next(sizes)
        self._check(ctx, spec, comp)
        usage = fmt.usage(comp.prompt_tokens, comp.completion_tokens, comp.cached_tokens)
        if not spec.stream:
            yield fmt.response(comp.text, comp.finish_reason, usage)
            return
        chunks.append(fmt.chunk(None, comp.finish_reason))
        if spec.include_usage:
            chunks.append(fmt.usage_chunk(usage))
        yield fmt.pack(chunks, done=True)

    # -- pieces -------------------------------------------------------------------------------
    def _render_ids(self, engine, messages: list[dict]) -> list[int]:
        tok = engine.tokenizer
        if not getattr(tok, "chat_template", None):
            return tok.encode(summarize_core.plain_prompt(messages))
        return tok.encode(self._apply_template(tok, messages), add_special_tokens=False)

    @staticmethod
    def _apply_template(tok, messages: list[dict]) -> str:
        if not getattr(tok, "chat_template", None):
            raise invalid("messages", "this model's tokenizer has no chat template; send a prompt instead")
        try:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - a template's refusal (e.g. role order) is the input's fault
            raise invalid("messages", f"the chat template refused these messages: {exc}") from None

    def _prompt_ids(self, engine, spec: JobSpec) -> list[int]:
        tok = engine.tokenizer
        if spec.messages is not None:
            # the template writes its own special tokens (BOS included), as vLLM's chat path does
            return tok.encode(self._apply_template(tok, spec.messages), add_special_tokens=False)
        if isinstance(spec.prompt, list):
            # checked here, so the error names the job's field (the engine's would name prompt_token_ids)
            bad = [t for t in spec.prompt if not 0 <= t < engine.vocab_size]
            if bad:
                raise invalid("openai_input.prompt" if spec.is_openai else "prompt",
                              f"token ids outside the vocabulary (size {engine.vocab_size}): {bad[:3]}")
            return spec.prompt
        return tok.encode(spec.prompt)

    def _params(self, engine, sampling: dict, num_prompt: int):
        """SamplingParams with max_tokens resolved: a missing one is what fits the
        context (and the KV cache), capped at DEFAULT_MAX_TOKENS: never vLLM's 16."""
        from engine import SamplingParams
        from engine.errors import InvalidInputError

        kw = dict(sampling)
        if kw.get("max_tokens") is None:
            room = min(engine.max_model_len, engine.kv_capacity_tokens) - num_prompt
            default = min(self.settings.default_max_tokens, output_cap(self.settings) or math.inf)
            kw["max_tokens"] = max(1, int(min(default, room)))
        try:
            return SamplingParams(**kw)
        except InvalidInputError as exc:
            raise invalid(f"sampling_params.{exc.field or 'sampling_params'}", exc.message) from None

    async def _events(self, ctx: JobContext, engine, prompt_ids: list[int], sampling: dict, request_id: str,
                      spec: JobSpec) -> AsyncIterator[tuple[str, Any, int]]:
        """Run one request: ("delta", text, new_tokens) events, then ("done", Completion, 0).
        Raises JobError on failure, timeout or queue timeout, with the text so far."""
        params = self._params(engine, sampling, len(prompt_ids))
        if engine.is_dead:
            raise JobError("engine_dead", "the engine is dead; this worker is being replaced")
        submitted = time.monotonic()
        ctx.arrival = ctx.arrival or submitted
        queue_timeout = self.settings.queue_timeout_s
        stream = RequestStream(engine, {"prompt_token_ids": prompt_ids}, params, request_id, spec.priority,
                               spec.cache_salt)
        text, ntok, out = "", 0, None
        started = False  # the engine has run a step of it: no longer queued
        try:
            while True:
                now = time.monotonic()
                limits = []
                if ctx.deadline is not None:
                    limits.append(ctx.deadline - now)
                if queue_timeout and out is None and not started:
                    limits.append(submitted + queue_timeout - now)
                if not await stream.wait(max(0.0, min(limits)) if limits else None):
                    if ctx.deadline is not None and time.monotonic() >= ctx.deadline:
                        raise JobError("timeout", f"the job's deadline of {spec.timeout_s:g}s passed",
                                       timeout_s=spec.timeout_s).with_partial_text(text)
                    queued = getattr(engine, "is_queued", None)
                    if queued is not None and not queued(request_id):
                        started = True  # a long prefill, not a queue: wait for its tokens
                        continue
                    raise JobError("overloaded", f"still queued in the engine QUEUE_TIMEOUT_S={queue_timeout:g}s "
                                   "after reaching it", retryable=True)
                # snapshot first: the stream moves on while we are suspended at the yield below
                latest, error, done = stream.latest, stream.error, stream.done
                if latest is not None and latest is not out:
                    if out is None:
                        ctx.prompt_tokens += len(latest.prompt_token_ids)
                        ctx.cached_tokens += latest.num_cached_tokens or 0
                    out = latest
                    comp = out.outputs[0]
                    new_text, new_tok = comp.text[len(text):], len(comp.token_ids) - ntok
                    ctx.add_tokens(new_tok)
                    text, ntok = comp.text, len(comp.token_ids)
                    if new_text or new_tok:
                        yield "delta", new_text, new_tok
                if error is not None:
                    err = JobError.from_exception(error)
                    engine_text = err.details.pop("partial_text", None) or ""
                    raise err.with_partial_text(max(text, engine_text, key=len))
                if done:
                    break
        finally:
            await stream.close()
        if out is None:
            raise JobError("internal_error", "the engine ended the request without any output")
        comp = out.outputs[0]
        result = Completion(text, comp.finish_reason, len(out.prompt_token_ids), ntok, out.num_cached_tokens,
                            dict(out.metrics or {}))
        yield "done", result, 0

    def _check(self, ctx: JobContext, spec: JobSpec, comp: Completion) -> None:
        """The failure contract on a finished request: never success with empty or
        (when asked) truncated text."""
        if comp.finish_reason is None:
            raise JobError("internal_error", "the request ended without a finish reason").with_partial_text(comp.text)
        if comp.finish_reason == "abort":
            raise JobError("cancelled", "the request was aborted").with_partial_text(comp.text)
        usage = {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens}
        if not comp.text.strip():
            raise JobError("empty_output", f"the model produced {comp.completion_tokens} tokens but no text "
                           f"(finish_reason {comp.finish_reason})", finish_reason=comp.finish_reason,
                           usage=usage).with_partial_text(comp.text)
        if comp.finish_reason == "length" and spec.on_truncation == "error":
            raise JobError("truncated", f"the output reached its limit of {comp.completion_tokens} tokens "
                           "(on_truncation: error)", finish_reason="length", usage=usage).with_partial_text(comp.text)

    def _final_item(self, ctx: JobContext, comp: Completion, text: str) -> dict:
        return {
            "text": text,
            "finish_reason": comp.finish_reason,
            "truncated": comp.finish_reason == "length",
            "usage": {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens,
                      "total_tokens": comp.prompt_tokens + comp.completion_tokens,
                      "cached_prompt_tokens": comp.cached_tokens},
            "timings": ctx.timings(),
            "request_id": ctx.spec.request_id if ctx.spec and ctx.spec.request_id else ctx.id,
        }

    # -- engine lifecycle --------------------------------------------------------------------
    async def _get_engine(self, ctx: JobContext):
        if self.dead is not None:
            raise JobError("engine_dead", self.dead.message)
        if self.engine is not None:
            return self.engine
        if self._load_error is not None:
            raise JobError(self._load_error.code, self._load_error.message)
        if self._load_task is None:
            self._load_task = asyncio.get_running_loop().create_task(self._load())
        task = self._load_task
        t0 = time.monotonic()
        while not task.done():
            now = time.monotonic()
            if ctx.deadline is not None and now >= ctx.deadline:
                raise JobError("timeout", f"the job's deadline of {ctx.spec.timeout_s:g}s passed while the model "
                               "was loading", timeout_s=ctx.spec.timeout_s)
            payload = {"status": "loading model", "waited_s": round(now - t0, 1)}
            if self._load_stage:
                payload["stage"] = self._load_stage
            self._send_progress(ctx, payload)
            wait = self.settings.load_progress_interval_s
            if ctx.deadline is not None:
                wait = min(wait, ctx.deadline - now)
            await asyncio.wait({task}, timeout=wait)
        ctx.waited_for_load = time.monotonic() - t0
        if task.exception() is not None:
            err = JobError.from_exception(task.exception())
            raise JobError(err.code, err.message)
        return task.result()

    async def _load(self):
        t0 = time.monotonic()
        log.info("loading the model (%s)", self.settings.model_name or "the embedded default model")

        def stage(message: str) -> None:  # called from the loading thread
            self._load_stage = message

        try:
            engine = await asyncio.to_thread(self._engine_factory, self.settings, stage)
        except Exception as exc:  # noqa: BLE001 - every load failure becomes model_load_failed
            err = JobError.from_exception(exc)
            code_ok = err.code == "model_load_failed"
            message = err.message if code_ok else f"{type(exc).__name__}: {exc}"
            self._load_error = JobError("model_load_failed", message, retryable=False)
            log.error("model load failed: %s", message, exc_info=not code_ok)
            self._request_refresh("the model could not be loaded")
            raise self._load_error from exc
        self.engine = engine
        seconds = time.monotonic() - t0
        self.metrics.load_seconds.set(seconds)
        self.metrics.bind_engine(engine.stats)
        stats = engine.stats()
        log.info("engine ready in %.1fs: %s, max_model_len %d, %d KV blocks of %d tokens (%d tokens)",
                 seconds, engine.model_name, engine.max_model_len, stats["kv_blocks_total"],
                 stats["kv_block_size"], engine.kv_capacity_tokens)
        if self.settings.metrics_log_interval_s:
            interval = self.settings.metrics_log_interval_s
            self._summary_task = asyncio.get_running_loop().create_task(self.metrics.log_every(interval))
        return engine

    def _send_progress(self, ctx: JobContext, payload: dict) -> None:
        waited = payload.get("waited_s", 0)
        ctx.log.log(logging.INFO if not waited else logging.DEBUG, "waiting for the model load (%.0fs)", waited)
        if self._progress is not None:
            try:
                self._progress(ctx.job, payload)
            except Exception:  # noqa: BLE001 - a lost progress update must not fail the job
                ctx.log.warning("progress update failed", exc_info=True)

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

    def model_label(self) -> str:
        if self.settings.openai_served_model_name_override:
            return self.settings.openai_served_model_name_override
        if self.settings.model_name:
            return self.settings.model_name
        return DEFAULT_MODEL_LABEL

    # -- bookkeeping ----------------------------------------------------------------------------
    def _finished(self, ctx: JobContext, status: str, error: JobError | None) -> None:
        stats = self.engine.stats() if self.engine is not None else None
        job_finished(ctx, status, error, self.metrics, stats, self.in_flight)

    async def aclose(self) -> None:
        """Stop the background tasks (the engine's loop, the summary logger)."""
        if self._summary_task is not None:
            self._summary_task.cancel()
            self._summary_task = None
        if self.engine is not None and hasattr(self.engine, "shutdown"):
            await self.engine.shutdown()

    def close(self) -> dict | None:
        """After the SDK's loop ended: log the final state; returns the engine stats."""
        stats = self.engine.stats() if self.engine is not None else None
        if stats:
            self.metrics.engine_state(stats)
        log.info("worker exit: metrics %s", json.dumps(self.metrics.summary()))
        log.info("worker exit: engine stats %s", json.dumps(stats))
        return stats
