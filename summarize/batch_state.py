"""What `summarize --batch` records beside its results file (`<out>.batches`), so that a rerun
after an interruption collects the batches already made instead of submitting again: each batch
made (and its endpoint), the child request ids its add calls answered, each with the job's
`request_id` (which names the document, its content and the options), its finalization, and a
batch given up. A child is settled when a line of the results file carries its id as `job_id`
(its result was written) or a newer child was made for the same request (a retry). Append-only
JSON lines, each flushed and fsynced; a torn last line (the process was killed mid-write) is
left out."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger("summarize")

SUFFIX = ".batches"


def state_path(out: str) -> str:
    return out + SUFFIX


@dataclass
class BatchRecord:
    """One batch as recorded: its children (child id -> request_id), in the order added."""

    id: str
    endpoint: str
    children: dict[str, str] = field(default_factory=dict)
    finalized: bool = False
    dropped: bool = False  # given up (cancelled)


class BatchState:
    """The records of one results file: `load()` them, then each change is one appended line.
    `written`: the child ids that have a line in the results file (the caller keeps it current)."""

    def __init__(self, path: str, endpoint: str, written: set[str] | None = None):
        self.path = path
        self.endpoint = endpoint
        self.batches: dict[str, BatchRecord] = {}  # this endpoint's, oldest first
        self.elsewhere: list[str] = []  # open batches recorded for another endpoint: left alone
        self.written: set[str] = written or set()

    def load(self) -> BatchState:
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                for n, raw in enumerate(f, 1):
                    self._apply(raw, n)
        latest = self._latest()
        for b in [b for b in self.batches.values() if b.endpoint != self.endpoint]:
            del self.batches[b.id]
            if self._is_open(b, latest):
                self.elsewhere.append(b.id)
        return self

    def unsettled(self, record: BatchRecord) -> dict[str, str]:
        """The children of `record` (child id -> request_id) whose result is still to collect."""
        return self._unsettled(record, self._latest())

    def open_batches(self) -> list[BatchRecord]:
        """Batches still worth collecting, newest first: drafts, and finalized ones with a
        child unsettled; not those given up."""
        latest = self._latest()
        return [b for b in reversed(self.batches.values()) if self._is_open(b, latest)]

    def created(self, batch_id: str) -> None:
        self.batches[batch_id] = BatchRecord(batch_id, self.endpoint)
        self._write({"event": "created", "batch": batch_id, "endpoint": self.endpoint})

    def added(self, batch_id: str, children: dict[str, str]) -> None:
        self.batches[batch_id].children.update(children)
        self._write({"event": "added", "batch": batch_id, "children": children})

    def finalized(self, batch_id: str) -> None:
        self.batches[batch_id].finalized = True
        self._write({"event": "finalized", "batch": batch_id})

    def dropped(self, batch_id: str) -> None:
        self.batches[batch_id].dropped = True
        self._write({"event": "dropped", "batch": batch_id})

    def remove_if_done(self) -> bool:
        """Delete the file when no batch in it is open (nothing left to collect); whether it was."""
        if self.open_batches() or self.elsewhere or not os.path.exists(self.path):
            return False
        os.unlink(self.path)
        return True

    def _latest(self) -> dict[str, str]:
        """request_id -> its newest child, over every batch recorded."""
        return {rid: cid for b in self.batches.values() for cid, rid in b.children.items()}

    def _unsettled(self, record: BatchRecord, latest: dict[str, str]) -> dict[str, str]:
        return {c: r for c, r in record.children.items() if c not in self.written and latest.get(r) == c}

    def _is_open(self, record: BatchRecord, latest: dict[str, str]) -> bool:
        return not record.dropped and (not record.finalized or bool(self._unsettled(record, latest)))

    def _write(self, event: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _apply(self, raw: str, n: int) -> None:
        try:
            event = json.loads(raw)
            kind, batch_id = event["event"], event["batch"]
        except (json.JSONDecodeError, KeyError, TypeError):
            if raw.strip():
                log.warning("%s:%d is not a complete record; it is left out", self.path, n)
            return
        if kind == "created":
            self.batches[batch_id] = BatchRecord(batch_id, str(event.get("endpoint")))
            return
        record = self.batches.get(batch_id)
        if record is None:
            return
        if kind == "added":
            record.children.update(event.get("children") or {})
        elif kind == "finalized":
            record.finalized = True
        elif kind == "dropped":
            record.dropped = True
