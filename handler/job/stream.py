"""A request streamed as a job streams it, whatever its route: the new text in batches of
worker-vllm's growing item sizes (`StreamBatching`), then the finished Completion once it
passed the failure contract's check; an empty output that nothing was streamed of runs
again first (EMPTY_OUTPUT_RETRIES: handler.job.retry)."""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from handler.job.requests import JobRequests
from handler.job.retry import EmptyOutputRetry


async def stream_batches(run: JobRequests, request, engine_request_id: str, wrap: Callable[[str], Any] = str,
                         head: tuple = ()) -> AsyncIterator[tuple[str, Any]]:
    """Run the request: ("items", [...]) each time a streaming job's new text (each piece
    through `wrap`, after `head` in the first batch) reaches the next item size in tokens,
    then ("done", (Completion, the items not yet yielded)) once it passed the failure check.
    An empty output that nothing was streamed of runs again (EmptyOutputRetry) first."""
    spec = run.spec
    retry = EmptyOutputRetry(run, request, engine_request_id)
    head_sent = False
    while True:
        pending, tokens, has_text, streamed = ([] if head_sent else list(head)), 0, False, False
        sizes = spec.batching.sizes()
        target = next(sizes)
        comp = None
        async with contextlib.aclosing(run.events(retry.request, retry.request_id)) as events:
            async for kind, value, ntok in events:
                if kind == "done":
                    comp = value
                    continue
                if not spec.stream:
                    continue
                if value:
                    pending.append(wrap(value))
                    has_text = True
                tokens += ntok
                if pending and tokens >= target:
                    yield "items", pending
                    streamed = streamed or has_text  # the client has some of this attempt's text
                    pending, tokens, target, head_sent = [], 0, next(sizes), True
        if not retry.again(comp, streamed):
            break
    yield "done", (retry.completion, pending)
