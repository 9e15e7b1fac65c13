"""A summarize batch: one `summarize` job per document (the worker does the map-reduce),
run concurrently, retried with backoff when the error is retryable, each result stored as it ends."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from handler.job.choices import is_truncated
from handler.summarize import core
from summarize.inputs import Document
from summarize.names import shown
from summarize.store import ResultStore

log = logging.getLogger("summarize")

STYLES = {
    "bullets": "Write the summary as a short list of bullet points.",
    "paragraph": "Write the summary as one short paragraph.",
}
LANGUAGE = "Write it in the same language as the text"
MAX_BACKOFF_S = 60.0
REFRESH_S = 1.0  # seconds between redraws of the progress bars


class FatalError(RuntimeError):
    """Stops the whole run (bad key, unknown endpoint): no document could succeed."""


@dataclass(slots=True)
class Options:
    style: str = "bullets"
    instructions: str | None = None  # the user's own, added to ours
    max_summary_tokens: int | None = None  # None: the worker's default
    concurrency: int = 8
    retries: int = 3
    backoff_s: float = 2.0

    def prompt_instructions(self) -> str:
        """What the model is asked: our defaults, the style, the document's own language
        unless the user's instructions say otherwise."""
        base = f"{core.DEFAULT_INSTRUCTIONS} {STYLES[self.style]} {LANGUAGE}"
        return f"{base}, unless these instructions say otherwise: {self.instructions.strip()}" \
            if self.instructions else base + "."

    def recorded(self) -> dict:
        """The options a result was made with (stored on each line)."""
        return {"style": self.style, "instructions": self.instructions, "max_summary_tokens": self.max_summary_tokens}

    def job_input(self, doc: Document) -> dict:
        spec: dict[str, Any] = {"text": doc.text, "instructions": self.prompt_instructions()}
        if self.max_summary_tokens:
            spec["max_tokens"] = self.max_summary_tokens
        # the same document with the same options is the same request: a worker that already
        # finished it (its result cache) answers again instead of recomputing
        ident = json.dumps([doc.doc, doc.sha256, self.recorded()], ensure_ascii=False).encode()
        return {"summarize": spec, "request_id": "summarize-" + hashlib.sha256(ident).hexdigest()[:32]}


@dataclass(slots=True)
class Attempt:
    """One job's end as RunPod's /status shows it."""

    status: str  # COMPLETED | FAILED | CANCELLED | TIMED_OUT
    output: Any = None
    error: Any = None
    job_id: str | None = None
    gpu_seconds: float | None = None
    served_by: str | None = None  # set when a fallback runner (not the first one) ran it


class Runner(Protocol):
    """Where documents run. A runner may also have `tokens_in_flight() -> int`: the tokens its
    unfinished attempts have used so far (the token bar moves with them)."""

    label: str

    async def start(self) -> None: ...
    async def attempt(self, doc: Document, job_input: dict) -> Attempt: ...
    def gpu_seconds(self, elapsed: float) -> float | None: ...
    async def close(self) -> None: ...


def parse_error(error: Any) -> dict:
    """A FAILED job's error as an object with code, message, retryable. The worker sends its
    error object as a JSON string; anything else (the SDK's exception report, a plain
    string) is kept as the message under code `worker_error`."""
    if isinstance(error, str):
        try:
            parsed = json.loads(error)
        except json.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            error = parsed
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return {**error, "message": str(error.get("message", "")), "retryable": bool(error.get("retryable"))}
    if isinstance(error, dict) and "error_message" in error:  # the runpod SDK's report of a raised exception
        return {"code": "worker_error", "message": f"{error.get('error_type', 'error')}: {error['error_message']}",
                "retryable": False}
    return {"code": "worker_error", "message": str(error) if error else "the job failed without an error",
            "retryable": False}


def outcome(a: Attempt) -> tuple[dict | None, dict | None]:
    """(result fields, None) for a summary, else (None, error object)."""
    if a.status == "COMPLETED":
        items = a.output if isinstance(a.output, list) else [a.output]
        items = [i for i in items if isinstance(i, dict)]
        final = next((i for i in reversed(items) if "finish_reason" in i), None)
        text = "".join(i["text"] for i in items if isinstance(i.get("text"), str))
        if final is None or not text.strip():
            shown = json.dumps(a.output, ensure_ascii=False)[:200]
            return None, {"code": "bad_output", "message": f"the job COMPLETED without a summary: {shown} "
                          "(is the endpoint running this worker?)", "retryable": False}
        info = final.get("summarize") or {}
        truncated = bool(final.get("truncated")) or is_truncated(final.get("finish_reason"))
        return {"status": "truncated" if truncated else "ok", "summary": text.strip(),
                "chunks": info.get("chunks", 1), "usage": _usage(final.get("usage")),
                "finish_reason": final.get("finish_reason"), "rounds": info.get("rounds", 0),
                "truncated_parts": info.get("truncated_parts", 0)}, None
    if a.status == "FAILED":
        return None, parse_error(a.error)
    if a.status == "TIMED_OUT":
        return None, {"code": "timeout", "message": "the job passed the endpoint's execution timeout",
                      "retryable": True}
    if a.status == "CANCELLED":
        return None, {"code": "cancelled", "message": "the job was cancelled on the endpoint", "retryable": False}
    return None, {"code": "worker_error", "message": f"the job ended {a.status}", "retryable": False}


def _usage(u: Any) -> dict:
    """The job's token counts; speculative decoding's drafted and accepted tokens when it reported them."""
    u = u if isinstance(u, dict) else {}
    p, c = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    spec = {k: int(u[k]) for k in ("spec_draft_tokens", "spec_accepted_tokens") if isinstance(u.get(k), int)}
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, **spec}


def backoff_delay(base: float, retry: int) -> float:
    """Seconds before retry number `retry` (1, 2, ...): doubling, capped, with jitter."""
    return min(MAX_BACKOFF_S, base * 2 ** (retry - 1)) * random.uniform(0.75, 1.25)


@dataclass
class RunStats:
    total: int = 0  # documents of the run
    skipped: int = 0  # done by an earlier run
    counts: dict = field(default_factory=lambda: {"ok": 0, "truncated": 0, "failed": 0})
    prompt_tokens: int = 0
    completion_tokens: int = 0
    gpu_seconds: float | None = None
    elapsed: float = 0.0
    interrupted: bool = False
    retries: int = 0

    @property
    def finished(self) -> int:
        return sum(self.counts.values())


def done_message(line: dict) -> str:
    """The one line printed when a document ends."""
    if line["status"] == "failed":
        err = line["error"]
        return f"{shown(line['doc'])}: failed: {shown(err['code'])}: {shown(err.get('message', ''))}"
    chunks = line.get("chunks", 1)
    took = f", {line['seconds']:.1f}s" if line.get("seconds") is not None else ""
    return (f"{shown(line['doc'])}: {line['status']} ({chunks} chunk{'s' if chunks != 1 else ''}, "
            f"{line['usage']['total_tokens']} tokens{took})")


class Batch:
    """Summarizes the documents not yet done; `stats` stays readable after an interruption."""

    def __init__(self, docs: list[Document], store: ResultStore, runner: Runner, options: Options,
                 *, progress: bool | None = None, notify: Callable[[str], None] = log.warning,
                 refresh_s: float = REFRESH_S):
        self.docs = docs
        self.store = store
        self.runner = runner
        self.options = options
        self.progress = progress
        self.notify = notify
        self.refresh_s = refresh_s
        self.stats = RunStats(total=len(docs))
        self.lines: dict[tuple[str, str], dict] = {}  # the line of each document of the run
        self.docs_bar = self.tokens_bar = None  # tqdm bars while `run` runs

    async def run(self, done: dict[tuple[str, str], dict]) -> RunStats:
        from tqdm import tqdm

        self.lines.update(done)
        todo = [d for d in self.docs if d.key not in done]
        self.stats.skipped = len(self.docs) - len(todo)
        if self.stats.skipped:
            self.notify(f"{self.stats.skipped} of {len(self.docs)} documents are done already (kept from "
                        f"{self.store.path})")
            self._check_options(done.values())
        t0 = time.monotonic()
        disable = None if self.progress is None else not self.progress
        self.docs_bar = tqdm(total=len(todo), desc="documents", unit="doc", disable=disable, position=0, leave=True)
        self.tokens_bar = tqdm(desc="tokens", unit="tok", unit_scale=True, disable=disable, position=1, leave=True)
        gate = asyncio.Semaphore(max(1, self.options.concurrency))
        tasks = []
        ticker = asyncio.create_task(self._tick())
        try:
            if any(d.error is None for d in todo):
                await self.runner.start()
            tasks = [asyncio.create_task(self._one(d, gate)) for d in todo]
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:  # Ctrl-C: gather has cancelled the documents in flight
            self.stats.interrupted = True
            await asyncio.gather(*tasks, return_exceptions=True)  # let them cancel their endpoint jobs
            raise
        except BaseException as exc:
            self.stats.interrupted = isinstance(exc, KeyboardInterrupt)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            ticker.cancel()
            self.stats.elapsed = time.monotonic() - t0
            gpu = self.runner.gpu_seconds(self.stats.elapsed)
            if gpu is not None:
                self.stats.gpu_seconds = gpu
            for bar in (self.docs_bar, self.tokens_bar):
                bar.close()
        return self.stats

    async def _tick(self) -> None:
        """Every `refresh_s`: the token bar shows the tokens of finished documents and of those
        in flight (when the runner knows them), and both bars redraw, so elapsed time moves."""
        in_flight = getattr(self.runner, "tokens_in_flight", None)
        while True:
            await asyncio.sleep(self.refresh_s)
            done = self.stats.prompt_tokens + self.stats.completion_tokens
            self.tokens_bar.n = done + (in_flight() if in_flight is not None else 0)
            for bar in (self.docs_bar, self.tokens_bar):
                bar.refresh()

    async def _one(self, doc: Document, gate: asyncio.Semaphore) -> None:
        if doc.error is not None:
            self._finish(self._line(doc, error=doc.error, attempts=0))
            return
        async with gate:
            line = await self._summarize(doc)
        self._finish(line)

    async def _summarize(self, doc: Document) -> dict:
        job_input = self.options.job_input(doc)
        t0 = time.monotonic()
        errors: list[dict] = []
        gpu = None
        for n in range(1, self.options.retries + 2):
            try:
                a = await self.runner.attempt(doc, job_input)
            except (FatalError, asyncio.CancelledError):
                raise
            except Exception as exc:  # noqa: BLE001 - a client bug fails this document, with the reason
                log.exception("%s: the attempt failed in the client", shown(doc.doc))
                a = Attempt("FAILED", error={"code": "client_error", "message": f"{type(exc).__name__}: {exc}",
                                             "retryable": False})
            if a.gpu_seconds is not None:
                gpu = (gpu or 0.0) + a.gpu_seconds
            result, error = outcome(a)
            extra = {"attempts": n, "seconds": round(time.monotonic() - t0, 3), "job_id": a.job_id,
                     "gpu_seconds": round(gpu, 3) if gpu is not None else None,
                     "retried_after": [e["code"] for e in errors], "served_by": a.served_by}
            if result is not None:
                return self._line(doc, **result, **extra)
            errors.append(error)
            if not error.get("retryable") or n > self.options.retries:
                return self._line(doc, error=error, **extra)
            delay = backoff_delay(self.options.backoff_s, n)
            self.stats.retries += 1
            self.notify(f"{shown(doc.doc)}: {error['code']} ({shown(error.get('message', '')[:120])}); retry {n} of "
                        f"{self.options.retries} in {delay:.1f}s")
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _line(self, doc: Document, *, status: str = "failed", summary: str | None = None, chunks: int = 0,
              usage: dict | None = None, error: dict | None = None, **extra) -> dict:
        """A result line: the six fields of the contract first, then what helps a reader."""
        assert (status == "failed") == (error is not None)
        line = {"doc": doc.doc, "status": status, "summary": summary, "chunks": chunks,
                "usage": usage or _usage(None), "error": error, "source": doc.source, "sha256": doc.sha256,
                "chars": len(doc.text) if doc.text else 0}
        line.update({k: v for k, v in extra.items() if v is not None})
        line.update({"runner": self.runner.label, "options": self.options.recorded(),
                     "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        return line

    def _finish(self, line: dict) -> None:
        self.store.append(line)
        self.lines[(line["doc"], line["sha256"])] = line
        self.stats.counts[line["status"]] += 1
        u = line["usage"]
        self.stats.prompt_tokens += u["prompt_tokens"]
        self.stats.completion_tokens += u["completion_tokens"]
        self.docs_bar.update(1)
        self.tokens_bar.n = max(self.tokens_bar.n, self.stats.prompt_tokens + self.stats.completion_tokens)
        self.docs_bar.set_postfix({k: v for k, v in self.stats.counts.items() if v}, refresh=True)
        self.tokens_bar.refresh()
        self.notify(done_message(line))

    def _check_options(self, done_lines) -> None:
        now = self.options.recorded()
        differ = sum(1 for line in done_lines if line.get("options", now) != now)
        if differ:
            self.notify(f"{differ} done documents were summarized with other options; they are kept "
                        "(write to a new --out to redo them)")

