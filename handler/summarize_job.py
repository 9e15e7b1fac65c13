"""The worker's `summarize` job: map-reduce over token chunks (summarize_core)
until the document fits the context, then the final summary as a normal job."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from handler import summarize_core
from handler.engine_setup import summary_defaults
from handler.errors import invalid
from handler.schema import JobSpec


async def summarize_items(worker, ctx, engine, spec: JobSpec) -> AsyncIterator[dict]:
    """The items of a `summarize` job: map over token chunks until the document
    fits, then one final generation streamed like any job."""
    tok = engine.tokenizer
    sm = spec.summarize
    context = min(engine.max_model_len, engine.kv_capacity_tokens)
    sampling = {**summary_defaults(worker.settings), **spec.sampling}
    summary_tokens = sm.max_tokens or spec.sampling.get("max_tokens") or min(
        sampling["max_tokens"], worker.settings.default_max_tokens)
    summary_tokens = min(summary_tokens, context // 2)
    sampling.pop("max_tokens")

    async def run(messages: list[dict], max_tokens: int, tag: str) -> summarize_core.Piece:
        ids = worker._render_ids(engine, messages)
        comp = None
        async for kind, value, _ in worker._events(ctx, engine, ids, {**sampling, "max_tokens": max_tokens},
                                                 f"{ctx.id}:{tag}", spec):
            if kind == "done":
                comp = value
        ctx.log.info("summarize %s: %d -> %d tokens (%s)", tag, comp.prompt_tokens, comp.completion_tokens,
                     comp.finish_reason)
        return summarize_core.Piece(comp.text, comp.finish_reason, comp.prompt_tokens, comp.completion_tokens)

    try:
        plan = await summarize_core.reduce_to_fit(
            sm.text, count_tokens=lambda m: len(worker._render_ids(engine, m)),
            encode=lambda t: tok.encode(t, add_special_tokens=False),
            decode=lambda ids: tok.decode(ids, skip_special_tokens=True), run=run, context_tokens=context,
            summary_tokens=summary_tokens, instructions=sm.instructions)
    except summarize_core.SummarizeError as exc:
        raise invalid("summarize.text", str(exc)) from None
    if plan.rounds:
        ctx.log.info("summarize: %d chunks, %d map rounds", plan.chunks, plan.rounds)
    final_spec = JobSpec(route="generate", messages=plan.messages, stream=spec.stream,
                         on_truncation=spec.on_truncation, priority=spec.priority, cache_salt=spec.cache_salt,
                         batching=spec.batching, sampling={**sampling, "max_tokens": summary_tokens})
    info = {"chunks": plan.chunks, "rounds": plan.rounds, "truncated_parts": plan.truncated_parts}
    map_usage = (plan.prompt_tokens, plan.completion_tokens)
    async with contextlib.aclosing(worker._generate(ctx, engine, final_spec)) as items:
        async for item in items:
            if "finish_reason" in item:
                item["summarize"] = info
                u = item["usage"]
                u["prompt_tokens"] += map_usage[0]
                u["completion_tokens"] += map_usage[1]
                u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
            yield item
