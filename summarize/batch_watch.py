"""Following one finalized batch of `summarize --batch`: its summary polled with backoff, its
child requests paged whenever more of them finished, each final child's result handed to the
document waiting for it, and the children the batch will never finish (the batch failed or was
cancelled, a child gone from its list) given their error."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from summarize.batch import CANCELLED, CHILD_FINAL, ENDED, BatchAPI, BatchCallError
from summarize.inputs import Document
from summarize.runner import Attempt

log = logging.getLogger("summarize")

MAX_POLL_FAILURES = 8  # looks at a batch in a row that may fail (network, 5xx) before its documents fail
LOST_AFTER = 2  # looks in a row at a finished batch whose list lacks a child before that child is lost


@dataclass(eq=False)
class Pending:
    """A document's attempt waiting for its child request's result."""

    doc: Document
    job_input: dict
    future: asyncio.Future

    @property
    def request_id(self) -> str:
        return self.job_input["request_id"]

    @property
    def waiting(self) -> bool:
        return not self.future.done()  # done: answered, or cancelled (the run was interrupted)

    def give(self, attempt: Attempt) -> None:
        if self.waiting:
            self.future.set_result(attempt)

    def fail(self, exc: BaseException) -> None:
        if self.waiting:
            self.future.set_exception(exc)


def failed(code: str, message: str, retryable: bool, job_id: str | None = None) -> Attempt:
    return Attempt("FAILED", error={"code": code, "message": message, "retryable": retryable}, job_id=job_id)


def child_attempt(child: dict) -> Attempt:
    """A final child request as the attempt of its document: its output is the worker's job
    output, its error the worker's error (parsed as the /run path parses them)."""
    return Attempt(child["status"], child.get("output"), child.get("error"), child["id"], _seconds(child))


def _seconds(child: dict) -> float | None:
    """The child's run time from its startedAt and completedAt (ISO 8601), when both are there."""
    try:
        start, end = (datetime.fromisoformat(str(child[k]).replace("Z", "+00:00"))
                      for k in ("startedAt", "completedAt"))
        return max(0.0, (end - start).total_seconds())
    except (KeyError, ValueError, TypeError):
        return None


def _count(summary: dict, key: str) -> int:
    value = summary.get(key)
    return value if isinstance(value, int) else 0


class Watch:
    """Polls batch `batch_id` until each of `children` (child id -> Pending) has its result."""

    def __init__(self, api: BatchAPI, call: Callable[..., Awaitable[Any]], batch_id: str,
                 children: dict[str, Pending], poll_s: tuple[float, float]):
        self.api, self.call = api, call
        self.batch_id = batch_id
        self.children = children
        self.poll_s = poll_s
        self.seconds: list[float] = []  # run time of each child handed over
        self._seen: int | None = None  # finished requests at the last listing
        self._lost_looks = 0

    async def run(self) -> None:
        delay, slowest = self.poll_s
        failures = 0
        while self.children:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, slowest)
            try:
                await self.look()
            except BatchCallError as exc:
                if exc.status == 404:
                    self._end_all("job_lost", f"batch {self.batch_id} is unknown to the endpoint (expired?)", True)
                    return
                failures += 1
                log.warning("batch %s: %s (%d in a row)", self.batch_id, exc, failures)
                if failures >= MAX_POLL_FAILURES:
                    self._end_all("endpoint_unreachable", f"{failures} looks at batch {self.batch_id} failed in a "
                                  f"row: {exc}", True)
                continue
            failures = 0

    async def look(self) -> None:
        """One look: the summary; the list of children when more finished (or the batch ended)."""
        summary = await self.call(self.api.summary, self.batch_id)
        finished = _count(summary, "requestCompleted") + _count(summary, "requestFailed")
        ended = summary["status"] in ENDED
        if finished != self._seen or ended or self._lost_looks:
            self._seen = finished
            listing = await self.call(lambda: list(self.api.children(self.batch_id)))
            # a child cancelled by the batch's own end gets the batch's error below
            self._hand_over({c["id"]: child_attempt(c) for c in listing if c["id"] in self.children
                             and c.get("status") in CHILD_FINAL and not (ended and c["status"] == "CANCELLED")})
            listed = {c["id"] for c in listing}
        else:
            listed = set(self.children)
        if ended:
            cancelled = summary["status"] == CANCELLED
            self._end_all("cancelled" if cancelled else "batch_failed", f"batch {self.batch_id} ended "
                          f"{summary['status']} before this request finished", not cancelled)
        elif finished >= _count(summary, "requestTotal") > 0 and set(self.children) - listed:
            self._lost_looks += 1
            if self._lost_looks >= LOST_AFTER:
                self._end_all("job_lost", f"the request is not in batch {self.batch_id}'s list any more "
                              "(expired?)", True, only=set(self.children) - listed)
        else:
            self._lost_looks = 0

    def _hand_over(self, finals: dict[str, Attempt]) -> None:
        """Answer the documents of the final children (one that no longer waits, as the run is
        being interrupted, has no line written: a rerun collects its child again)."""
        for cid, attempt in finals.items():
            if attempt.gpu_seconds is not None:
                self.seconds.append(attempt.gpu_seconds)
            self.children.pop(cid).give(attempt)

    def _end_all(self, code: str, message: str, retryable: bool, only: set[str] | None = None) -> None:
        """The children still waiting (or those of `only`) end with this error."""
        ending = list(self.children) if only is None else only
        self._hand_over({cid: failed(code, message, retryable, cid) for cid in ending})

    def fail(self, exc: BaseException) -> None:
        """Every document still waiting on this batch gets `exc` (a FatalError ends the run)."""
        for pending in self.children.values():
            pending.fail(exc)
