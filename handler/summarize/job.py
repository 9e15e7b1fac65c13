"""The worker's `summarize` job: map-reduce over token chunks (handler.summarize.core)
until the document fits the context, then the final summary streamed like any job.
Its engine calls go through the worker's CallGate (handler.summarize.schedule): last calls and
short documents first, so a short document never waits for a long one's chunks."""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

from handler.engine_setup import serves_default_model
from handler.errors import JobError, invalid
from handler.job.requests import JobRequests
from handler.job.sampling import invalid_from_engine
from handler.native.output import generate_items
from handler.summarize import core
from handler.summarize.schedule import call_gate

SHORT_PROMPT_TOKENS = 2048  # a last call this short (one engine step on the CPU) runs ahead of long calls
_live: dict[str, object] = {}  # job id -> the JobContext of a summarize job running in this process


def summary_defaults(settings) -> dict:
    """Sampling of summarize jobs: the default model's tuned values when it is served."""
    defaults = {**core.SUMMARY_SAMPLING, "max_tokens": core.SUMMARY_MAX_TOKENS}
    if serves_default_model(settings):
        from handler.prepare import default_model

        defaults.update(getattr(default_model, "SUMMARIZE_SAMPLING", {}))
    return defaults


def _params(run: JobRequests, values: dict, speculative: bool):
    """A summary call's SamplingParams: the job's values, with n-gram speculation asked for
    (a summary copies its document's words) unless SUMMARIZE_SPECULATION is off."""
    from engine.errors import InvalidInputError
    from engine.input_processor import sampling_params

    try:
        return dataclasses.replace(sampling_params(values), speculative=speculative)
    except InvalidInputError as exc:
        raise invalid_from_engine(run.spec, exc) from None


def summarize_context(engine, settings) -> int:
    """Tokens of one summarize call (prompt + summary): SUMMARIZE_CONTEXT_TOKENS, or with 0 the
    engine's longest request. (On the CPU a prompt costs in proportion to its length, about the
    same per token at 8k as at 2k: a smaller context only adds map calls. What kept short
    documents waiting was sharing engine steps with long prefills: the CallGate's business.)"""
    wanted = getattr(settings, "summarize_context_tokens", 0) or 0
    return min(engine.max_request_tokens, wanted) if wanted else engine.max_request_tokens


def live_tokens(job_id: str) -> int:
    """Prompt and output tokens that a summarize job running in this process has used so far."""
    ctx = _live.get(job_id)
    return ctx.prompt_tokens + ctx.completion_tokens if ctx is not None else 0


def _kv_tokens(request, fallback: int) -> int:
    ids = getattr(request, "prompt_token_ids", None)
    return len(ids) + request.max_tokens if ids is not None else fallback


def _short(request) -> bool:
    """A prompt of at most SHORT_PROMPT_TOKENS (a prompt still to tokenize is long)."""
    ids = getattr(request, "prompt_token_ids", None)
    return ids is not None and len(ids) <= SHORT_PROMPT_TOKENS


class _Calls:
    """A summarize job's engine calls, each admitted by the engine's CallGate: map calls one
    priority below the job's own (lower runs first in the engine), the last call at it. A last
    call whose prompt is longer than SHORT_PROMPT_TOKENS queues with the map calls (a long
    document that fits the context in one call must not hold up short ones either)."""

    def __init__(self, run: JobRequests, context: int):
        self.run, self.context = run, context
        self.gate = call_gate(run.engine)
        self.size = len(run.spec.summarize.text)
        priority = run.spec.priority
        self.map_run = JobRequests(run.ctx, run.engine, dataclasses.replace(run.spec, priority=min(
            priority + 1, 2**31 - 1)), run.settings)

    def slot(self, request, final: bool):
        deadline = self.run.ctx.deadline
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self.gate.slot(final=final and _short(request), size=self.size, kv=_kv_tokens(request, self.context),
                              timeout=timeout)

    @contextlib.asynccontextmanager
    async def admitted(self, request, final: bool):
        try:
            async with self.slot(request, final) as slot:
                yield slot
        except TimeoutError:
            spec = self.run.spec
            raise JobError("timeout", f"the job's deadline of {spec.timeout_s:g}s passed while it waited for "
                           "the engine", timeout_s=spec.timeout_s) from None

    async def map_call(self, prompt, sampling: dict, tag: str) -> core.Piece:
        run, ctx = self.map_run, self.run.ctx
        request = run.prepare(prompt, sampling)
        comp = None
        async with self.admitted(request, final=False) as slot:
            async with contextlib.aclosing(run.events(request, f"{ctx.id}:{tag}")) as events:
                async for kind, value, _ in events:
                    slot.prefilled()
                    if kind == "done":
                        comp = value
        ctx.log.info("summarize %s: %d -> %d tokens (%s)", tag, comp.prompt_tokens, comp.completion_tokens,
                     comp.finish_reason)
        return core.Piece(comp.text, comp.finish_reason, comp.prompt_tokens, comp.completion_tokens)


async def summarize_items(run: JobRequests) -> AsyncIterator[dict]:
    """The items of a `summarize` job: map over token chunks until the document
    fits, then one final generation streamed like any job."""
    _live[run.ctx.id] = run.ctx
    try:
        async with contextlib.aclosing(_items(run)) as items:
            async for item in items:
                yield item
    finally:
        _live.pop(run.ctx.id, None)


async def _items(run: JobRequests) -> AsyncIterator[dict]:
    spec, settings, ctx = run.spec, run.settings, run.ctx
    processor = run.engine.input_processor
    sm = spec.summarize
    context = summarize_context(run.engine, settings)
    sampling = {**summary_defaults(settings), **spec.sampling}
    summary_tokens = sm.max_tokens or spec.sampling.get("max_tokens") or min(
        sampling["max_tokens"], settings.default_max_tokens)
    summary_tokens = min(summary_tokens, context // 2)
    sampling.pop("max_tokens")
    calls = _Calls(run, context)
    speculative = bool(getattr(settings, "summarize_speculation", True))

    def prompt(messages: list[dict]):
        return {"messages": messages} if processor.has_chat_template else core.plain_prompt(messages)

    async def call(messages: list[dict], max_tokens: int, tag: str) -> core.Piece:
        return await calls.map_call(prompt(messages), _params(run, {**sampling, "max_tokens": max_tokens},
                                                              speculative), tag)

    tok = processor.tokenizer
    try:
        plan = await core.reduce_to_fit(
            sm.text, count_tokens=lambda m: run.count_tokens(prompt(m)),
            encode=lambda t: tok.encode(t, add_special_tokens=False),
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True), run=call, context_tokens=context,
            summary_tokens=summary_tokens, instructions=sm.instructions)
    except core.SummarizeError as exc:
        raise invalid("summarize.text", str(exc)) from None
    if plan.rounds:
        ctx.log.info("summarize: %d chunks, %d map rounds", plan.chunks, plan.rounds)
    request = run.prepare(prompt(plan.messages), _params(run, {**sampling, "max_tokens": summary_tokens}, speculative))
    info = {"chunks": plan.chunks, "rounds": plan.rounds, "truncated_parts": plan.truncated_parts}
    # (a long last call queued as a map call counts as prefilling until it ends: the next long call waits)
    async with calls.admitted(request, final=True), contextlib.aclosing(generate_items(run, request, ctx.id)) as items:
        async for item in items:
            if "finish_reason" in item:
                item["summarize"] = info
                u = item["usage"]
                u["prompt_tokens"] += plan.prompt_tokens
                u["completion_tokens"] += plan.completion_tokens
                u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
            yield item
