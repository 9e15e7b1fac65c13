"""Jobs run in this process by the runpod SDK's rules for a job's end (rp_job.handle_job, runpod
1.12, for an async-generator handler with return_aggregate_stream): each item is streamed and
collected; a dict item with a truthy `error` ends the stream, is not streamed, and fails the job
with `str(error)`; a raised exception fails it with the SDK's text; otherwise COMPLETED with the
list of items. `--test_input` runs one such job and prints its result as /status shows it."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from handler.http.jobs import COMPLETED, FAILED

log = logging.getLogger("handler.local")


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


async def run_job(handler, job: dict) -> dict:
    """`drive` with the job's id in the result, as /status shows it."""
    return {"id": job["id"], **await drive(handler, job)}


def load_job(test_input: str | None) -> dict:
    """The job from --test_input's JSON, else ./test_input.json (as the SDK's local mode)."""
    if test_input is None:
        if not os.path.exists("test_input.json"):
            raise ValueError("no --test_input given and no test_input.json in the current folder")
        with open("test_input.json", encoding="utf-8") as f:
            test_input = f.read()
    try:
        job = json.loads(test_input)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--test_input is not JSON: {exc}") from None
    if not isinstance(job, dict) or job.get("input") is None:
        raise ValueError('the test job must be an object with "input"')
    job.setdefault("id", "local_test")
    return job


def run_local(worker, test_input: str | None, process_start: float) -> int:
    """Run the job, print its result on stdout; 0 when COMPLETED, 1 when FAILED."""
    try:
        job = load_job(test_input)
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    job_start = time.monotonic()

    async def main() -> dict:
        try:
            return await run_job(worker.handle, job)
        finally:
            await worker.aclose()

    result = asyncio.run(main())
    sys.stdout.write(json.dumps(result, ensure_ascii=False, indent=2) + "\n")
    sys.stdout.flush()
    last = result.get("output", [None])[-1] if result.get("output") else None
    first = last.get("timings", {}).get("first_token_s") if isinstance(last, dict) else None
    if first is not None:
        log.info("[job %s] cold start: first token %.2fs after process start (%.2fs after the job started)",
                 job["id"], job_start - process_start + first, first)
    worker.close()
    if result["status"] != "COMPLETED":
        log.error("[job %s] FAILED: %s", job["id"], result["error"])
        return 1
    return 0
