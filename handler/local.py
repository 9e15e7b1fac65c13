"""Local runs (`--test_input`): one job through the handler's stream exactly as
the SDK's worker loop consumes it, the aggregated result printed as /status shows it."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

from handler.serve.sdk_job import drive

log = logging.getLogger("handler.local")


async def run_job(handler, job: dict) -> dict:
    """Iterate an async-generator handler as runpod's rp_job.handle_job does with
    return_aggregate_stream (handler.serve.sdk_job): items are collected; an item with a
    truthy `error` fails the job."""
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
