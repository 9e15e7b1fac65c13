"""`summarize --fallback-endpoint`: a runner that sends a document whose attempt failed
`overloaded` (the worker's queue was too long) to a second endpoint at once, rather than
waiting to retry on the busy one."""
from __future__ import annotations

import logging
from collections.abc import Callable

from summarize.inputs import Document
from summarize.runner import Attempt, Runner, outcome

log = logging.getLogger("summarize")

OVERLOADED = "overloaded"


class FallbackRunner:
    """`primary` first; an `overloaded` failure goes to `fallback` (its result is the attempt's)."""

    def __init__(self, primary: Runner, fallback: Runner, notify: Callable[[str], None] = log.info):
        self.primary = primary
        self.fallback = fallback
        self.notify = notify
        self.label = f"{primary.label} (fallback: {fallback.label})"
        self.sent: list[str] = []  # documents sent to the fallback

    @property
    def cancelled(self) -> list[str]:
        return [*getattr(self.primary, "cancelled", []), *getattr(self.fallback, "cancelled", [])]

    async def start(self) -> None:
        await self.primary.start()
        await self.fallback.start()

    async def attempt(self, doc: Document, job_input: dict) -> Attempt:
        first = await self.primary.attempt(doc, job_input)
        _, error = outcome(first)
        if error is None or error.get("code") != OVERLOADED:
            return first
        self.notify(f"{doc.doc}: {OVERLOADED} on {self.primary.label}; sending it to {self.fallback.label}")
        self.sent.append(doc.doc)
        second = await self.fallback.attempt(doc, job_input)
        second.served_by = self.fallback.label
        if first.gpu_seconds is not None:
            second.gpu_seconds = (second.gpu_seconds or 0.0) + first.gpu_seconds
        return second

    def tokens_in_flight(self) -> int:
        return sum(getattr(r, "tokens_in_flight", lambda: 0)() for r in (self.primary, self.fallback))

    def gpu_seconds(self, elapsed: float) -> float | None:
        parts = [r.gpu_seconds(elapsed) for r in (self.primary, self.fallback)]
        known = [p for p in parts if p is not None]
        return sum(known) if known else None

    async def close(self) -> None:
        try:
            await self.primary.close()
        finally:
            await self.fallback.close()
