"""The native job's items: the request's text streamed in worker-vllm's growing item sizes (or
whole), then the final item with finish_reason, truncated, usage and timings; or, with
OUTPUT_FORMAT=worker-vllm, worker-vllm's own `{"choices": [{"tokens": [...]}], "usage"}` items."""
from __future__ import annotations

from collections.abc import AsyncIterator

from handler.job.choices import detailed, is_truncated
from handler.job.requests import Completion, JobRequests
from handler.job.stream import stream_batches
from handler.native.choices import native_choice_items


async def generate_items(run: JobRequests, request, engine_request_id: str) -> AsyncIterator[dict]:
    if detailed(request.params):  # n > 1 or logprobs (handler.native.choices)
        async for item in native_choice_items(run, request, engine_request_id, stream_batches, final_item):
            yield item
        return
    async for kind, value in stream_batches(run, request, engine_request_id):
        if kind == "items":
            yield {"text": "".join(value)}
        else:
            comp, rest = value
            yield final_item(run, comp, "".join(rest) if run.spec.stream else comp.text)


async def worker_vllm_items(run: JobRequests, request, engine_request_id: str) -> AsyncIterator[dict]:
    """OUTPUT_FORMAT=worker-vllm: the items as worker-vllm's own (non-OpenAI) jobs gave them,
    `{"choices": [{"tokens": [text, ...]}], "usage": {"input", "output"}}`, each streamed item
    with the usage so far; the failure contract's errors stay ours."""
    ctx = run.ctx
    n = request.params.num_choices

    def item(texts: dict[int, list[str]]) -> dict:
        return {"choices": [{"tokens": texts.get(i, [])} for i in range(n)],
                "usage": {"input": ctx.prompt_tokens, "output": ctx.completion_tokens}}

    if not detailed(request.params):
        async for kind, value in stream_batches(run, request, engine_request_id):
            if kind == "items":
                yield item({0: value})
            else:
                comp, rest = value
                if not run.spec.stream:
                    yield item({0: [comp.text]})
                elif rest:
                    yield item({0: rest})
        return
    # n > 1 (or logprobs asked): the events are batches of per-choice deltas; worker-vllm
    # indexes the choices, each with its own tokens (logprobs are not in its native items)
    async for kind, value in stream_batches(run, request, engine_request_id, lambda d: d):
        if kind == "items":
            yield item(_texts_by_choice(value))
        else:
            comp, rest = value
            if not run.spec.stream:
                yield item({c.index: [c.text] for c in comp.choices})
            elif rest:
                yield item(_texts_by_choice(rest))


def _texts_by_choice(batches: list) -> dict[int, list[str]]:
    """Batches of ChoiceDeltas as each choice's new texts, in order."""
    out: dict[int, list[str]] = {}
    for batch in batches:
        for d in batch:
            if d.text:
                out.setdefault(d.index, []).append(d.text)
    return out


def final_item(run: JobRequests, comp: Completion, text: str) -> dict:
    return {
        "text": text,
        "finish_reason": comp.finish_reason,
        "truncated": is_truncated(comp.finish_reason),
        "usage": {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens,
                  "total_tokens": comp.prompt_tokens + comp.completion_tokens,
                  "cached_prompt_tokens": comp.cached_tokens, **run.ctx.speculation_usage()},
        "timings": run.ctx.timings(),
        "request_id": run.spec.idempotency_key or run.ctx.id,
    }
