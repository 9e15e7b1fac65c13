"""The worker's `summarize` job: map-reduce over token chunks (summarize.core)
until the document fits the context, then the final summary streamed like any job."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from handler.errors import invalid
from handler.execution import JobRequests
from handler.routes.generate import generate_items
from handler.summarize import core


def summary_defaults(settings) -> dict:
    """Sampling of summarize jobs: the default model's tuned values when it is served."""
    defaults = {**core.SUMMARY_SAMPLING, "max_tokens": core.SUMMARY_MAX_TOKENS}
    if not settings.model_name:
        from handler.prepare import default_model

        defaults.update(getattr(default_model, "SUMMARIZE_SAMPLING", {}))
    return defaults


async def summarize_items(run: JobRequests) -> AsyncIterator[dict]:
    """The items of a `summarize` job: map over token chunks until the document
    fits, then one final generation streamed like any job."""
    spec, settings, ctx = run.spec, run.settings, run.ctx
    processor = run.engine.input_processor
    sm = spec.summarize
    context = run.engine.max_request_tokens
    sampling = {**summary_defaults(settings), **spec.sampling}
    summary_tokens = sm.max_tokens or spec.sampling.get("max_tokens") or min(
        sampling["max_tokens"], settings.default_max_tokens)
    summary_tokens = min(summary_tokens, context // 2)
    sampling.pop("max_tokens")

    def prompt(messages: list[dict]):
        return {"messages": messages} if processor.has_chat_template else core.plain_prompt(messages)

    async def call(messages: list[dict], max_tokens: int, tag: str) -> core.Piece:
        request = run.prepare(prompt(messages), {**sampling, "max_tokens": max_tokens})
        comp = None
        async with contextlib.aclosing(run.events(request, f"{ctx.id}:{tag}")) as events:
            async for kind, value, _ in events:
                if kind == "done":
                    comp = value
        ctx.log.info("summarize %s: %d -> %d tokens (%s)", tag, comp.prompt_tokens, comp.completion_tokens,
                     comp.finish_reason)
        return core.Piece(comp.text, comp.finish_reason, comp.prompt_tokens, comp.completion_tokens)

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
    request = run.prepare(prompt(plan.messages), {**sampling, "max_tokens": summary_tokens})
    info = {"chunks": plan.chunks, "rounds": plan.rounds, "truncated_parts": plan.truncated_parts}
    async with contextlib.aclosing(generate_items(run, request, ctx.id)) as items:
        async for item in items:
            if "finish_reason" in item:
                item["summarize"] = info
                u = item["usage"]
                u["prompt_tokens"] += plan.prompt_tokens
                u["completion_tokens"] += plan.completion_tokens
                u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
            yield item
