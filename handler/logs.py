"""Logging setup, the per-job logger whose every line carries the job's id, and `clean`:
what a job's input controls reaches a log line escaped (one line stays one line) and cut short."""
from __future__ import annotations

import logging
import re
import sys

FORMAT = "%(asctime)s %(levelname)-7s %(name)s | %(message)s"
MAX_VALUE_CHARS = 200  # of one user-controlled value in a log line or an error message
MAX_MESSAGE_CHARS = 8192  # of one job log line's message, whatever it holds

# C0 and C1 controls (newline, carriage return, escape, NEL, ...), DEL and the Unicode line separators
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    c = match.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def has_control_chars(text: str) -> bool:
    """Whether `text` holds a character that `clean` escapes."""
    return _CONTROL.search(text) is not None


def clean(value, limit: int = MAX_VALUE_CHARS) -> str:
    """`value` as text for a log line or an error message: control characters and line
    separators escaped (`\\n`, `\\x1b`, `\\u2028`), cut after `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) - limit
    if cut > 0:
        text = text[:limit]
    text = _CONTROL.sub(_escape, text)
    return f"{text}... ({cut:,} more characters)" if cut > 0 else text


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
    """Prefixes each line with `[job <id>]` and sets `record.job_id`. Every message is
    formatted here and passed through `clean` (MAX_MESSAGE_CHARS): a job's line is one line."""

    def __init__(self, logger: logging.Logger, job_id: str):
        super().__init__(logger, {"job_id": job_id})

    def process(self, msg, kwargs):
        kwargs.setdefault("extra", {})["job_id"] = self.extra["job_id"]
        return f"[job {clean(self.extra['job_id'], 128)}] {msg}", kwargs

    def log(self, level, msg, *args, **kwargs):
        if not self.isEnabledFor(level):
            return
        text = str(msg) % args if args else str(msg)
        msg, kwargs = self.process(clean(text, MAX_MESSAGE_CHARS), kwargs)
        kwargs.setdefault("stacklevel", 2)  # the caller's line, not this one
        self.logger.log(level, msg, **kwargs)
