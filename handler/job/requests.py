"""How a job runs its engine requests: the prompt and sampling values through
the engine's input processor (its coded errors named by the job's fields; a
large prompt tokenized in a thread of its own, never on the event loop), the
event loop over the engine's stream (deadline, queue timeout, partial text),
and the failure contract's check on the finished request."""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from handler.errors import JobError
from handler.job.choices import ChoiceTracker, detailed, is_truncated
from handler.job.costs import fitting_max_tokens
from handler.job.limits import json_chars
from handler.job.sampling import invalid_from_engine
from handler.job.schema import JobSpec
from handler.lora.select import lora_job_error


OFF_LOOP_SIZE = 8192  # characters (or token ids) of a prompt past which it is processed off the event loop
_prompt_pool: ThreadPoolExecutor | None = None


def prompt_pool() -> ThreadPoolExecutor:
    """The one thread that processes large prompts: they queue behind each other, never in the
    default executor where the engine's steps run (a burst of them cannot hold a step back)."""
    global _prompt_pool
    if _prompt_pool is None:
        _prompt_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prompts")
    return _prompt_pool


BAD_WORD_COST = 64  # characters a bad word weighs beyond its own: it is tokenized twice


def prompt_size(prompt) -> int:
    """Characters (or token ids) of a prompt in the input processor's forms: what rendering and
    tokenizing it costs (the messages' contents, their tool calls and the tool definitions)."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            prompt = prompt["prompt_token_ids"]
        elif "messages" in prompt:
            messages = [m for m in prompt["messages"] if isinstance(m, dict)]
            return (sum(len(m["content"]) for m in messages if isinstance(m.get("content"), str))
                    + sum(json_chars(m["tool_calls"]) for m in messages if m.get("tool_calls"))
                    + json_chars(prompt.get("tools") or []))
        else:
            prompt = prompt.get("prompt")
    return len(prompt) if isinstance(prompt, (str, list)) else 0


def request_size(prompt, sampling) -> int:
    """prompt_size, and what the sampling values cost the input processor (their bad_words)."""
    words = sampling.get("bad_words") if isinstance(sampling, dict) else getattr(sampling, "bad_words", None)
    return prompt_size(prompt) + sum(len(w) + BAD_WORD_COST for w in words or () if isinstance(w, str))


@dataclass(slots=True)
class PendingRequest:
    """A prompt too large to tokenize on the event loop, with its SamplingParams (checked, max_tokens
    as asked): `JobRequests.events` processes it in `prompt_pool` first (its errors then come from
    there, coded the same); like an EngineRequest, a retry may replace its params."""

    prompt: Any
    params: Any  # engine.SamplingParams


@dataclass(slots=True)
class Completion:
    """A finished request, as the job reports it."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    metrics: dict
    # every choice (handler.job.choices.Choice), for a request of n > 1 or logprobs; text and
    # finish_reason above are choice 0's, completion_tokens all choices'
    choices: list = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list | None = None  # engine Logprob dicts per prompt token (the first: None)


class RequestStream:
    """`engine.generate` consumed by a task: `latest` is the newest output, `error` the
    request's failure, `done` the end; `wait` reports news, `close` aborts. A slow
    reader gets text coalesced, never queued."""

    def __init__(self, engine, request, request_id: str, priority: int, cache_salt: str | None, lora_request=None):
        self.latest = None
        self.error: BaseException | None = None
        self.done = False
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._consume(engine, request, request_id, priority, cache_salt, lora_request))

    async def _consume(self, engine, request, request_id, priority, cache_salt, lora_request):
        adapter = {} if lora_request is None else {"lora_request": lora_request}  # the base model: as before
        try:
            async for out in engine.generate(request, None, request_id=request_id, priority=priority,
                                             cache_salt=cache_salt, **adapter):
                self.latest = out
                self._changed.set()
        except Exception as exc:  # noqa: BLE001 - handed to the job, which reports it
            self.error = exc
        finally:
            self.done = True
            self._changed.set()

    async def wait(self, timeout: float | None) -> bool:
        """Wait for news (new output, an error, the end); False when `timeout` passed first."""
        if not self._changed.is_set():
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return False
        self._changed.clear()
        return True

    async def close(self) -> None:
        """Abort the request if it still runs (the engine frees its KV blocks)."""
        if not self._task.done():
            self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # we ourselves are being cancelled


def job_prompt(spec: JobSpec):
    """The job's prompt as the engine's input processor takes it."""
    if spec.messages is not None:
        return {"messages": spec.messages, **(spec.chat.prompt_fields() if spec.chat is not None else {})}
    if isinstance(spec.prompt, list):
        return {"prompt_token_ids": spec.prompt}
    return spec.prompt


class JobRequests:
    """One job's engine requests: `prepare` a prompt with sampling values, run it with
    `events`, `check` the result against the failure contract."""

    def __init__(self, ctx, engine, spec: JobSpec, settings: Any, admission=None):
        self.ctx, self.engine, self.spec, self.settings = ctx, engine, spec, settings
        self.admission = admission  # handler.job.admission.KVAdmission: the worker's ledger of KV blocks

    def prepare(self, prompt, sampling):
        """The engine request of `prompt` with `sampling` (values, or the job's SamplingParams: used as
        they are, not built again): a missing max_tokens is what fits the context (and the KV
        cache), capped at DEFAULT_MAX_TOKENS (and MAX_OUTPUT_TOKENS): never vLLM's 16.
        A request over OFF_LOOP_SIZE (request_size) comes back as a PendingRequest that `events` processes
        in a thread, so tokenizing a million characters stalls no other job's stream."""
        if request_size(prompt, sampling) > OFF_LOOP_SIZE:
            from engine.input_processor import sampling_params

            with self._coded_errors():
                return PendingRequest(prompt, sampling_params(sampling))
        return self._process(prompt, sampling)

    def _process(self, prompt, sampling):
        """input_processor.process with the job's defaults (a missing max_tokens: what fits the context,
        DEFAULT_MAX_TOKENS, MAX_OUTPUT_TOKENS and the job's cost caps); `sampling`: values or SamplingParams."""
        from engine.input_processor import sampling_params

        cap = getattr(self.settings, "max_output_tokens", None) or math.inf
        default = int(min(self.settings.default_max_tokens, cap))
        with self._coded_errors():
            params = sampling_params(sampling)
            if params.max_tokens is None:
                chars = len(self.spec.prompt) if isinstance(self.spec.prompt, str) else 0
                fit = fitting_max_tokens(params, self.settings, chars, self.spec.echo)
                if params.num_choices > 1:  # every choice's tokens in the KV cache at once (handler.job.admission)
                    block = self.engine.stats()["kv_block_size"]
                    kv_fit = self.engine.kv_capacity_tokens // params.num_choices - 2 * block
                    fit = kv_fit if fit is None else min(fit, kv_fit)
                default = max(1, min(default, fit)) if fit is not None else default
            return self.engine.input_processor.process(prompt, params, default_max_tokens=default)

    @contextlib.contextmanager
    def _coded_errors(self):
        """The engine's refusals as the job's: invalid_input naming the job's field; prompt_too_long,
        kv_capacity with the engine's codes and numbers."""
        from engine.errors import EngineError, InvalidInputError

        try:
            yield
        except InvalidInputError as exc:
            raise invalid_from_engine(self.spec, exc) from None
        except EngineError as exc:
            raise JobError.from_exception(exc) from None

    async def _process_off_loop(self, pending: PendingRequest):
        """A PendingRequest processed in prompt_pool, within the job's deadline."""
        future = asyncio.get_running_loop().run_in_executor(prompt_pool(), self._process, pending.prompt,
                                                            pending.params)
        limit = None if self.ctx.deadline is None else max(0.0, self.ctx.deadline - time.monotonic())
        try:
            return await asyncio.wait_for(future, limit)
        except TimeoutError:
            raise self._deadline_error("") from None

    def count_tokens(self, prompt) -> int:
        """Tokens of a prompt as prepare would encode it."""
        return len(self.engine.input_processor.encode(prompt)[1])

    async def events(self, request, engine_request_id: str) -> AsyncIterator[tuple[str, Any, int]]:
        """Run one request: ("delta", text, new_tokens) events, then ("done", Completion, 0); for a
        request of n > 1 or logprobs (handler.job.choices.detailed) a delta is a list of ChoiceDelta.
        Raises JobError on failure, timeout or queue timeout, with the text so far."""
        engine, ctx = self.engine, self.ctx
        if engine.is_dead:
            raise JobError("engine_dead", "the engine is dead; this worker is being replaced")
        if isinstance(request, PendingRequest):
            request = await self._process_off_loop(request)
        reached = time.monotonic()  # queued from here: waiting for the KV cache, then in the engine
        release = await self._admit(request)
        ctx.arrival = ctx.arrival or time.monotonic()
        stream = RequestStream(engine, request, engine_request_id, self.spec.priority, self.spec.cache_salt,
                               self.spec.lora_request)
        text, ntok, out = "", 0, None
        tracker, detail = ChoiceTracker(), detailed(request.params)
        try:
            while True:
                queued = self._queued_since(engine_request_id, reached if out is None else None)
                if not await stream.wait(self._wait_limit(queued)):
                    self._raise_deadline(text)
                    queued = self._queued_since(engine_request_id, reached if out is None else None)
                    if queued is None or time.monotonic() < queued + self.settings.queue_timeout_s:
                        continue  # running (a long prefill is not a queue), or not queued that long yet
                    raise JobError("overloaded", f"still queued in the engine QUEUE_TIMEOUT_S="
                                   f"{self.settings.queue_timeout_s:g}s after reaching it (or after it was "
                                   "preempted)", retryable=True).with_partial_text(text)
                # snapshot first: the stream moves on while we are suspended at the yield below
                latest, error, done = stream.latest, stream.error, stream.done
                if latest is not None and latest is not out:
                    if out is None:
                        ctx.prompt_tokens += len(latest.prompt_token_ids)
                        ctx.cached_tokens += latest.num_cached_tokens or 0
                    out = latest
                    new_text, new_tok, deltas = tracker.advance(out)
                    ctx.add_tokens(new_tok)
                    text, ntok = tracker.text, tracker.ntok
                    if new_text or new_tok:
                        yield "delta", (deltas if detail else new_text), new_tok
                if error is not None:
                    err = lora_job_error(self.spec, error) or JobError.from_exception(error)
                    engine_text = err.details.pop("partial_text", None) or ""
                    raise err.with_partial_text(max(text, engine_text, key=len))
                if done:
                    break
        finally:
            await stream.close()
            release()
        if out is None:
            raise JobError("internal_error", "the engine ended the request without any output")
        comp = out.outputs[0]
        ctx.add_speculation(out.metrics or {})
        yield "done", Completion(text, comp.finish_reason, len(out.prompt_token_ids), ntok, out.num_cached_tokens,
                                 dict(out.metrics or {}), tracker.choices(out) if detail else [],
                                 list(out.prompt_token_ids), out.prompt_logprobs), 0

    async def _admit(self, request) -> Callable[[], None]:
        """Wait until the KV blocks the request may hold fit (handler.job.admission), as queued
        time (QUEUE_TIMEOUT_S: overloaded; the job's deadline: timeout); returns their release."""
        admission = self.admission
        if admission is None:
            return lambda: None
        from handler.job.admission import kv_blocks

        blocks = kv_blocks(request, self.engine, self.settings.enable_prefix_caching)
        total = self.engine.stats()["kv_blocks_total"]
        overloaded = JobError("overloaded", f"still queued QUEUE_TIMEOUT_S={self.settings.queue_timeout_s:g}s "
                              f"after reaching the worker: the KV blocks its {request.params.num_choices} choices "
                              f"may hold ({blocks} of {total}) are held by the requests running", retryable=True)
        wait = admission.acquire(blocks, total, self.spec.priority, self._wait_limit(time.monotonic()), overloaded)
        unless_expired = getattr(self.engine, "unless_expired", None)  # the drain's deadline ends the wait
        try:
            await (unless_expired(wait) if unless_expired is not None else wait)
        except JobError as err:
            if err is overloaded:
                self._raise_deadline("")  # the job's own deadline passed, not the queue's
            raise
        return lambda: admission.release(blocks, total)

    def _queued_since(self, engine_request_id: str, reached: float | None) -> float | None:
        """With QUEUE_TIMEOUT_S: since when the request waits with none of it running (the engine's
        word: first, or after a preemption), counted from `reached` (the worker) before its first
        output; None while it runs."""
        if not self.settings.queue_timeout_s:
            return None
        since = self.engine.queued_since(engine_request_id)
        return since if since is None or reached is None else min(since, reached)

    def _wait_limit(self, queued: float | None) -> float | None:
        """Seconds to wait for news: until the job's deadline, and with QUEUE_TIMEOUT_S until the queue
        timeout of a queued request (one that runs is looked at again that often: it may be preempted)."""
        now, timeout = time.monotonic(), self.settings.queue_timeout_s
        limits = []
        if self.ctx.deadline is not None:
            limits.append(self.ctx.deadline - now)
        if timeout:
            limits.append(timeout if queued is None else queued + timeout - now)
        return max(0.0, min(limits)) if limits else None

    def _raise_deadline(self, text: str) -> None:
        if self.ctx.deadline is not None and time.monotonic() >= self.ctx.deadline:
            raise self._deadline_error(text)

    def _deadline_error(self, text: str) -> JobError:
        return JobError("timeout", f"the job's deadline of {self.spec.timeout_s:g}s passed",
                        timeout_s=self.spec.timeout_s).with_partial_text(text)

    def _raw_prompt_hint(self) -> str:
        """What to do when a raw text prompt to a model with a chat template came out empty: an
        instruct model often answers such a prompt with its end token at once."""
        spec = self.spec
        if not isinstance(spec.prompt, str) or spec.messages is not None or spec.route == "summarize":
            return ""
        if not self.engine.input_processor.has_chat_template:
            return ""
        if spec.route == "/v1/completions":
            return ("; this model has a chat template and /v1/completions sends the prompt raw: use "
                    "/v1/chat/completions with messages")
        return ('; this model has a chat template and the prompt was sent raw: send "messages", or '
                '"apply_chat_template": true with the prompt')

    def check(self, comp: Completion) -> None:
        """The failure contract on a finished request: never success with empty or
        (when asked) truncated text."""
        if comp.finish_reason is None:
            raise JobError("internal_error", "the request ended without a finish reason").with_partial_text(comp.text)
        if comp.finish_reason == "abort":
            raise JobError("cancelled", "the request was aborted").with_partial_text(comp.text)
        usage = {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens}
        empty = [c.index for c in comp.choices if not c.text.strip()] if len(comp.choices) > 1 else []
        if empty and len(empty) < len(comp.choices):  # the contract holds per choice
            raise JobError("empty_output", f"choices {empty} of {len(comp.choices)} choices produced no text",
                           finish_reason=comp.finish_reason, usage=usage, empty_choices=empty).with_partial_text(
                               comp.text)
        if not comp.text.strip():
            raise JobError("empty_output", f"the model produced {comp.completion_tokens} tokens but no text "
                           f"(finish_reason {comp.finish_reason}){self._raw_prompt_hint()}",
                           finish_reason=comp.finish_reason, usage=usage).with_partial_text(comp.text)
        if is_truncated(comp.finish_reason) and self.spec.on_truncation == "error":
            raise JobError("truncated", f"the output reached its limit of {comp.completion_tokens} tokens "
                           "(on_truncation: error)", finish_reason="length", usage=usage).with_partial_text(comp.text)
