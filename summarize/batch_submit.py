"""Building one batch of `summarize --batch`: created empty, filled by add calls of at most
10 MiB (each call's answer, the ids of its requests, recorded before the next call), cleared of
requests no document waits for, finalized. A call that fails gives its documents a retryable
`submit_failed` when the API may take it later; a batch that cannot be finalized is given up."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from summarize.batch import DRAFT, FINALIZED, BatchAPI, BatchCallError, add_bodies
from summarize.batch_state import BatchState
from summarize.batch_watch import Pending, failed

log = logging.getLogger("summarize")


class Submitter:
    """The calls that make a batch, each recorded in `state`; `call` runs a blocking call off
    the event loop."""

    def __init__(self, api: BatchAPI, state: BatchState, call: Callable[..., Awaitable[Any]],
                 notify: Callable[[str], None]):
        self.api, self.state, self.call, self.notify = api, state, call, notify

    async def create(self, part: list[Pending]) -> str | None:
        """A new DRAFT batch's id; None (and `part` failed) when the API refused it."""
        try:
            batch_id = await self.call(self.api.create)
        except BatchCallError as exc:
            for p in part:
                p.give(failed("submit_failed", f"creating a batch: {exc}", exc.transient))
            return None
        self.state.created(batch_id)
        return batch_id

    async def fill(self, batch_id: str, part: list[Pending]) -> dict[str, Pending]:
        """Add `part` to the DRAFT batch; its children (child id -> Pending). A refused call
        fails its documents; the others go on."""
        children: dict[str, Pending] = {}
        for first, end, body in add_bodies([{"input": p.job_input} for p in part]):
            chunk = part[first:end]
            try:
                ids = await self.call(self.api.add, batch_id, body, len(chunk))
            except BatchCallError as exc:
                for p in chunk:
                    p.give(failed("submit_failed", f"adding to batch {batch_id}: {exc}", exc.transient))
                continue
            self.state.added(batch_id, {cid: p.request_id for cid, p in zip(ids, chunk)})
            children.update(zip(ids, chunk))
        return children

    async def finalize(self, batch_id: str, children: dict[str, Pending]) -> bool:
        """Take out of the DRAFT batch what no document waits for (an add call whose answer was
        lost to an interruption or a timeout), then finalize it; whether it was. A batch that
        could not be finalized is given up, its documents failed."""
        try:
            if not children:
                raise BatchCallError("no request was added")
            await self._prune(batch_id, set(children))
            await self.call(self.api.finalize, batch_id)
        except BatchCallError as exc:
            await self.drop(batch_id)
            for p in children.values():
                p.give(failed("submit_failed", f"finalizing batch {batch_id}: {exc}", exc.transient))
            return False
        self.state.finalized(batch_id)
        return True

    async def status(self, batch_id: str) -> str | None:
        """A recorded draft's status now (a run killed after its finalize call may not have
        recorded it); None when the API cannot tell."""
        try:
            summary = await self.call(self.api.summary, batch_id)
        except BatchCallError as exc:
            log.warning("batch %s: %s", batch_id, exc)
            return None
        if summary["status"] == FINALIZED:
            self.state.finalized(batch_id)
        return summary["status"] if summary["status"] in (DRAFT, FINALIZED) else None

    async def drop(self, batch_id: str) -> None:
        """Give a batch up: cancelled (best effort) and recorded as dropped."""
        try:
            await self.call(self.api.cancel, batch_id)
        except BatchCallError as exc:
            log.warning("could not cancel batch %s: %s", batch_id, exc)
        self.state.dropped(batch_id)

    async def _prune(self, batch_id: str, keep: set[str]) -> None:
        listed = await self.call(lambda: [c["id"] for c in self.api.children(batch_id)])
        extra = [cid for cid in listed if cid not in keep]
        for cid in extra:
            await self.call(self.api.delete, batch_id, cid)
        if extra:
            self.notify(f"batch {batch_id}: took out {len(extra)} requests that no document waits for")
