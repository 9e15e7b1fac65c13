"""One job's running state (`JobContext`: its logger, clock, tokens, retries) and its end: the
metrics it adds and the one `finished` log line with status, code, tokens, retries and timings
(its error message cut short: part of it may be the job's input)."""
from __future__ import annotations

import json
import logging
import time

from handler.errors import JobError
from handler.logs import JobLog, clean

log = logging.getLogger("handler.worker")
MAX_ERROR_CHARS = 1000  # of the error message in a job's finished line (the JSON after it stays whole)


class JobContext:
    """One job's state while it runs: its logger, clock, deadline and token counts."""

    def __init__(self, job: dict):
        self.job = job
        self.id = str(job.get("id") or "unknown")
        self.log = JobLog(log, self.id)
        self.start = time.monotonic()
        self.spec = None
        self.deadline: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.arrival: float | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self.completion_tokens = 0
        self.cached = False  # the result came from the request_id cache
        self.empty_output_retries = 0  # requests run again for an empty output (EMPTY_OUTPUT_RETRIES)
        self.waited_for_load = 0.0
        self.spec_draft_tokens: int | None = None  # speculative decoding's drafted and accepted tokens,
        self.spec_accepted_tokens = 0  # over the job's requests (None: none of them speculated)

    def add_tokens(self, n: int) -> None:
        """`n` new output tokens arrived now."""
        if n <= 0:
            return
        now = time.monotonic()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now
        self.completion_tokens += n

    def add_speculation(self, metrics: dict) -> None:
        """A finished request's drafted and accepted tokens (its metrics have them when it speculated)."""
        if "spec_draft_tokens" in metrics:
            self.spec_draft_tokens = (self.spec_draft_tokens or 0) + metrics["spec_draft_tokens"]
            self.spec_accepted_tokens += metrics["spec_accepted_tokens"]

    def speculation_usage(self) -> dict:
        """usage's spec_draft_tokens and spec_accepted_tokens, when a request of the job speculated."""
        if self.spec_draft_tokens is None:
            return {}
        return {"spec_draft_tokens": self.spec_draft_tokens, "spec_accepted_tokens": self.spec_accepted_tokens}

    @property
    def ttft(self) -> float | None:
        return self.first_token - self.start if self.first_token is not None else None

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_token is None or self.completion_tokens < 2:
            return None
        return (self.last_token - self.first_token) / (self.completion_tokens - 1)

    def timings(self) -> dict:
        now = time.monotonic()
        out = {
            "queue_s": round((self.arrival or now) - self.start, 4),
            "first_token_s": round(self.ttft, 4) if self.ttft is not None else None,
            "total_s": round(now - self.start, 4),
        }
        if self.waited_for_load:
            out["model_load_wait_s"] = round(self.waited_for_load, 4)
        return out


def job_finished(ctx: JobContext, status: str, error: JobError | None, metrics, stats: dict | None,
                 in_flight: int) -> None:
    """Count the job in the metrics and log its one `finished` line:
    `[job <id>] <status> <code>[: <message>] {json of tokens, timings, engine state}`."""
    code = error.code if error else ("cancelled" if status == "cancelled" else "ok")
    timings = ctx.timings()
    tpot = ctx.tpot
    adapter = getattr(ctx.spec, "lora", None)  # a LoRA adapter of LORA_MODULES (checked), or None
    metrics.job_finished(status, code, timings["total_s"], ctx.ttft, tpot if status == "completed" else None,
                         ctx.prompt_tokens, ctx.completion_tokens, adapter=adapter)
    if ctx.empty_output_retries:
        metrics.empty_output_retries.inc(ctx.empty_output_retries)
    if stats:
        metrics.engine_state(stats)
    record = {
        "status": status, "code": code, "prompt_tokens": ctx.prompt_tokens, "cached_prompt_tokens": ctx.cached_tokens,
        "completion_tokens": ctx.completion_tokens, **timings,
        "tpot_s": round(tpot, 5) if tpot is not None else None, "cached_result": ctx.cached,
        "empty_output_retries": ctx.empty_output_retries,
        "route": ctx.spec.route if ctx.spec is not None else None, "jobs_in_flight": in_flight,
        **ctx.speculation_usage(), **({"lora": adapter} if adapter else {}),
    }
    if stats:
        record.update({"kv_blocks_free": stats["kv_blocks_free"], "kv_blocks_total": stats["kv_blocks_total"],
                       "running": stats["num_running"], "waiting": stats["num_waiting"]})
    level = logging.INFO if status != "failed" or code == "invalid_input" else logging.WARNING
    message = f": {clean(error.message, MAX_ERROR_CHARS)}" if error else ""  # its user-controlled part cut short
    ctx.log.log(level, "%s %s%s %s", status, code, message,
                json.dumps(record, ensure_ascii=False), extra={"job_finished": record})
