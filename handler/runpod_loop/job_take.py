"""Job takes read job by job. The runpod SDK parses a job-take body as one JSON document,
so one job it cannot parse (nested past the parser's limit, invalid UTF-8) loses the whole
batch. Here each job is parsed on its own; one that cannot be read keeps its id and gets an
`UnreadableInput` as its input, which the handler fails `invalid_input`, and the others run."""
from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass

log = logging.getLogger("handler.runpod_loop")

# A JSON string (its escapes skipped) or one structural character: all that splitting a body
# into its jobs needs. Structural characters are ASCII and never part of a multi-byte UTF-8
# sequence, so the split works on bodies that are not valid UTF-8 too.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},:]', re.DOTALL)
_WS = b" \t\r\n"


@dataclass(frozen=True, slots=True)
class UnreadableInput:
    """Stands in for the input of a job whose body could not be parsed; no JSON makes one."""

    reason: str


async def take_jobs(session, num_jobs: int = 1) -> list[dict] | None:
    """The SDK's `rp_job.get_job` (same URL, statuses and checks) with the body read by `parse_jobs`."""
    from runpod.http_client import TooManyRequests  # here: importing the handler loads no runpod
    from runpod.serverless.modules import rp_job

    # rp_job's URL helper keeps the take's query (batch size, job_in_progress) exactly the SDK's
    async with session.get(rp_job._job_get_url(num_jobs)) as response:
        if response.status in (204, 400):  # no job; 400 is what FlashBoot answers while idle
            return None
        if response.status == 429:
            raise TooManyRequests(response.request_info, response.history, status=response.status,
                                  message=response.reason)
        response.raise_for_status()
        if response.content_type != "application/json" or response.content_length == 0:
            log.debug("job take: no JSON body (%s)", response.content_type)
            return None
        body = await response.read()
    return parse_jobs(body) or None


def parse_jobs(body: bytes) -> list[dict]:
    """The jobs of a job-take body (one job object, or a list of them). A job that cannot be
    parsed keeps its id and gets an UnreadableInput; one whose id cannot be read either is
    dropped with a warning (no result can be posted for it)."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError are ValueErrors
        return _parse_each(body, exc)
    if isinstance(doc, dict):
        doc = [doc]
    if not isinstance(doc, list):
        log.warning("job take: the body is neither a job nor a list of jobs (a JSON %s): ignored", type(doc).__name__)
        return []
    return [job for item in doc if (job := _checked(item)) is not None]


def _parse_each(body: bytes, exc: BaseException) -> list[dict]:
    """The slow path, for a body that does not parse whole: split it into its jobs, parse each."""
    start = _skip_ws(body, 0)
    if start < len(body) and body[start] == ord("{"):
        spans = [(start, len(body.rstrip(_WS)))]
    elif start < len(body) and body[start] == ord("["):
        split = _pieces(body, start)
        spans = [(s, e) for s, e, _ in split[0]] if split else None
    else:
        spans = None
    if spans is None:
        log.warning("job take: the body could not be parsed (%s) nor split into jobs: ignored", _why(exc))
        return []
    jobs = []
    for s, e in spans:
        try:
            item = json.loads(body[s:e].decode("utf-8"))
        except (ValueError, RecursionError) as item_exc:
            job = _unreadable(body, _skip_ws(body, s), item_exc)
        else:
            job = _checked(item)
        if job is not None:
            jobs.append(job)
    return jobs


def _checked(item) -> dict | None:
    """A parsed job as the SDK's loop needs it (a string id, an input); None when it has no id."""
    jid = item.get("id") if isinstance(item, dict) else None
    if not isinstance(jid, str) or not jid:
        log.warning("job take: an item without a string id (a JSON %s) was dropped: no result can be posted "
                    "for it", type(item).__name__)
        return None
    if "input" not in item:
        log.info("[job %s] the job has no input: failing it invalid_input", jid)
        return {**item, "input": UnreadableInput("the job has no input")}
    return item


def _unreadable(body: bytes, start: int, exc: BaseException) -> dict | None:
    """The job opening at body[start] that did not parse: its members that parse on their own
    (the id above all) with an UnreadableInput; None when its id cannot be read."""
    reason = _why(exc)
    split = _pieces(body, start) if start < len(body) and body[start] == ord("{") else None
    job: dict = {}
    for s, e, colon in split[0] if split else ():
        if colon < 0:
            continue
        try:
            key = json.loads(body[s:colon].decode("utf-8"))
            if isinstance(key, str) and key != "input":
                job[key] = json.loads(body[colon + 1:e].decode("utf-8"))
        except (ValueError, RecursionError):
            continue
    jid = job.get("id")
    if not isinstance(jid, str) or not jid:
        log.warning("job take: a job could not be parsed (%s) and its id cannot be read: dropped, no result "
                    "can be posted for it", reason)
        return None
    log.info("[job %s] the job's body could not be parsed (%s): failing it invalid_input; the other jobs of "
             "the take run", jid, reason)
    job["input"] = UnreadableInput(f"the job's body could not be parsed: {reason}")
    return job


def _pieces(body: bytes, start: int) -> tuple[list[tuple[int, int, int]], int] | None:
    """The comma-separated pieces of the array or object opening at body[start], as
    (start, end, colon) spans (colon: the piece's first top-level ':', or -1), and the index
    just past its closing bracket; None when it never closes."""
    depth, pieces, piece_start, colon = 0, [], start + 1, -1
    for m in _TOKEN.finditer(body, start):
        c = body[m.start()]
        if c == ord('"'):
            continue
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
            if depth == 0:
                pieces.append((piece_start, m.start(), colon))
                return [p for p in pieces if body[p[0]:p[1]].strip(_WS)], m.end()
        elif depth == 1 and c == ord(","):
            pieces.append((piece_start, m.start(), colon))
            piece_start, colon = m.end(), -1
        elif depth == 1 and c == ord(":") and colon < 0:
            colon = m.start()
    return None


def _skip_ws(body: bytes, i: int) -> int:
    while i < len(body) and body[i] in _WS:
        i += 1
    return i


def _why(exc: BaseException) -> str:
    """Why a job could not be parsed, in words (never the body's content)."""
    if isinstance(exc, RecursionError):
        return "it nests deeper than the JSON parser allows"
    if isinstance(exc, UnicodeDecodeError):
        return f"it is not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"it is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    return f"{type(exc).__name__}: {exc}"
