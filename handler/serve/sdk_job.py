"""A job's end by the runpod SDK's rules (rp_job.handle_job, runpod 1.12) for an async-generator
handler with return_aggregate_stream: each item is streamed and collected; a dict item with a
truthy `error` ends the stream, is not streamed, and fails the job with `str(error)`; a raised
exception fails it with the SDK's text; otherwise COMPLETED with the list of items."""
from __future__ import annotations

import asyncio
import contextlib
import traceback
from collections.abc import Callable
from typing import Any

from handler.serve.jobs import CANCELLED, COMPLETED, FAILED, Job, JobStore


async def drive(handler, job: dict, on_item: Callable[[Any], None] | None = None) -> dict:
    """Run `handler(job)` to its end: {"status": "COMPLETED", "output": [items]} or
    {"status": "FAILED", "error": "..."} as the SDK posts them; `on_item` hears each streamed item."""
    output: list[Any] = []
    try:
        async with contextlib.aclosing(handler(job)) as items:
            async for item in items:
                if isinstance(item, dict) and item.get("error"):
                    return {"status": FAILED, "error": str(item["error"])}
                output.append(item)
                if on_item is not None:
                    on_item(item)
    except Exception as exc:  # noqa: BLE001 - the SDK's run_job_generator reports it as this text
        return {"status": FAILED, "error": f"handler: {exc} \ntraceback: {traceback.format_exc()}"}
    return {"status": COMPLETED, "output": output}


async def run_job(handler, job: Job, store: JobStore, worker: str | None = None) -> None:
    """Run a queued job on `handler`, its state kept in `store`. Cancelled (POST /cancel):
    the handler's task is cancelled and the job stays CANCELLED, as RunPod marks it."""
    if not store.start(job, worker):
        return
    try:
        result = await drive(handler, {"id": job.id, "input": job.input}, lambda item: store.add(job, item))
    except asyncio.CancelledError:
        store.end(job, CANCELLED)
        raise
    store.end(job, result["status"], output=result.get("output"), error=result.get("error"))
