"""Log forging: what a job's input controls (unknown key names at the top level, in
sampling_params, summarize and openai_input) reaches the worker's log escaped and cut short:
one job line is one line, however the key is spelled, and never megabytes long."""
from __future__ import annotations

import logging

import pytest

from handler.logs import FORMAT, clean
from tests.handler.conftest import error_of, run

# a key that, logged raw, would write a second line looking like the worker's own
FORGED = "x\n2026-01-01 00:00:00,000 INFO    handler.worker | [job other] completed ok\r\u2028\x1b[2J\x85"
HUGE = "k" * 5_000_000
MAX_LINE = 20_000  # characters of one formatted log line (the finished line with its JSON is far below)


def job_lines(caplog, job_id: str) -> list[str]:
    """The job's log lines as the worker's stderr handler writes them."""
    fmt = logging.Formatter(FORMAT)
    return [fmt.format(r) for r in caplog.records if getattr(r, "job_id", None) == job_id]


def assert_clean(lines: list[str]) -> None:
    assert lines, "the job logged nothing"
    for line in lines:
        assert len(line) < MAX_LINE, len(line)
        assert not any(c in line for c in "\n\r\x1b\x85\u2028\u2029"), line[:300]


CASES = {
    "top": lambda key: {"prompt": "Hi", key: 1},
    "sampling": lambda key: {"prompt": "Hi", "sampling_params": {key: 1}},
    "summarize": lambda key: {"summarize": {"text": "A short document.", key: 1}},
}


@pytest.mark.parametrize("where", sorted(CASES))
def test_a_bad_key_cannot_forge_or_flood_the_log(loop, shared_worker, caplog, where):
    caplog.set_level(logging.DEBUG, logger="handler")
    for n, key in enumerate((FORGED, HUGE)):
        jid = f"forge-{where}-{n}"
        err = error_of(run(loop, shared_worker, CASES[where](key), jid))
        assert err["code"] == "invalid_input"
        assert_clean(job_lines(caplog, jid))
    if where in ("top", "summarize"):  # our own refusal names the key as sent (JSON carries it), cut short
        err = error_of(run(loop, shared_worker, CASES[where](HUGE), f"forge-{where}-err"))
        assert len(err["field"]) < 300 and err["field"].endswith("kkkk... (4,999,900 more characters)")
        assert len(err["message"]) < 2000
        err = error_of(run(loop, shared_worker, CASES[where](FORGED), f"forge-{where}-err2"))
        assert err["field"].endswith(FORGED)


def test_an_unknown_openai_key_is_logged_on_one_short_line(loop, shared_worker, caplog):
    caplog.set_level(logging.DEBUG, logger="handler")
    for n, key in enumerate((FORGED, HUGE)):
        jid = f"forge-openai-{n}"
        r = run(loop, shared_worker, {"openai_route": "/v1/completions", "openai_input": {
            "prompt": "Hi", "max_tokens": 2, "ignore_eos": True, key: 1}}, jid)
        assert r["status"] == "FAILED", r  # a field this worker does not implement fails naming it
        lines = job_lines(caplog, jid)
        assert any("is not supported by this worker" in line for line in lines)
        assert_clean(lines)


def test_clean_escapes_control_characters_and_cuts_long_text():
    assert clean("plain text, tabs\tand unicode 회의록") == "plain text, tabs\\tand unicode 회의록"
    assert clean("a\nb\r\x00\x1b\x7f\x85\u2028\u2029") == "a\\nb\\r\\x00\\x1b\\x7f\\x85\\u2028\\u2029"
    cut = clean("z" * 1000, 100)
    assert cut.startswith("z" * 100) and len(cut) < 140 and "900 more characters" in cut
    assert clean(7) == "7"
