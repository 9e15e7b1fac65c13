"""Logging setup and the per-job logger whose every line carries the job's id."""
from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)-7s %(name)s | %(message)s"


def configure_logging(level: str = "info") -> None:
    """Log to stderr (stdout stays for results in local runs)."""
    root = logging.getLogger()
    if not any(getattr(h, "_handler_logs", False) for h in root.handlers):
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter(FORMAT))
        stream._handler_logs = True  # type: ignore[attr-defined]
        root.addHandler(stream)
    root.setLevel(level.upper())


class JobLog(logging.LoggerAdapter):
    """Prefixes each line with `[job <id>]` and sets `record.job_id`."""

    def __init__(self, logger: logging.Logger, job_id: str):
        super().__init__(logger, {"job_id": job_id})

    def process(self, msg, kwargs):
        kwargs.setdefault("extra", {})["job_id"] = self.extra["job_id"]
        return f"[job {self.extra['job_id']}] {msg}", kwargs
