"""The summarize command in endpoint mode, through the runpod SDK, against a fake /v2 REST API
whose jobs run on the project's handler: the local statuses, retries only when retryable."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import runpod  # imported first, as in a user's program: the base URL is read when the command runs

from tests.fakes.runpod_rest_api import FakeRestAPI
from tests.summarize.conftest import fake_api_fixture, point_client_at
from tests.summarize.notes import EXPECTED, KOREAN, by_doc, check_line, make_notes, read_lines, summarize


rest_api = fake_api_fixture(FakeRestAPI)


@pytest.fixture
def endpoint_env(local_env, rest_api, monkeypatch):
    point_client_at(rest_api, monkeypatch)
    return local_env


def jobs_of(api: FakeRestAPI, needle: str, since: float = 0.0) -> list:
    """The fake's jobs (created after `since`) whose input contains `needle`, oldest first."""
    with api.lock:
        jobs = [j for j in api.jobs.values()
                if j.created >= since and needle in json.dumps(api.inputs[j.id], ensure_ascii=False)]
    return sorted(jobs, key=lambda j: j.created)


def test_endpoint_mode_gives_the_statuses_of_local_mode(endpoint_env, rest_api):
    make_notes(endpoint_env)
    t0 = time.monotonic()
    assert summarize("notes", "--out", "local.jsonl") == 3
    calls_before = len(rest_api.calls)
    assert summarize("notes", "--out", "endpoint.jsonl", "--endpoint", rest_api.endpoint) == 3

    local = by_doc(read_lines(endpoint_env / "local.jsonl"))
    remote = by_doc(read_lines(endpoint_env / "endpoint.jsonl"))
    assert set(remote) == set(local) == set(EXPECTED)
    for doc, outcome in EXPECTED.items():
        check_line(remote[doc], outcome)
        assert remote[doc]["status"] == local[doc]["status"]
        assert remote[doc]["chunks"] == local[doc]["chunks"]
    assert remote["notes/archive/long.md"]["chunks"] > 1  # the worker split it: one job for the document
    assert len(jobs_of(rest_api, "Standup", t0)) == 1
    job = rest_api.jobs[remote["notes/회의록.txt"]["job_id"]]
    assert rest_api.inputs[job.id]["summarize"]["text"] == KOREAN and job.status == "COMPLETED"
    calls = rest_api.calls[calls_before:]
    assert calls.count(("POST", "run")) == 3 and ("GET", "status") in calls and ("GET", "health") in calls
    assert ("POST", "runsync") not in calls and not rest_api.violations
    assert remote["notes/standup.md"]["gpu_seconds"] is not None  # from the job's executionTime


def test_out_of_memory_is_retried_and_invalid_input_is_not(endpoint_env, rest_api, capsys):
    make_notes(endpoint_env)
    t0 = time.monotonic()
    rest_api.fail_with_oom(lambda job_input: "Standup" in job_input["summarize"]["text"])
    assert summarize("notes", "--out", "r.jsonl", "--endpoint", rest_api.endpoint) == 3  # only the empty and binary files failed: they never can
    lines = by_doc(read_lines(endpoint_env / "r.jsonl"))
    for doc, outcome in EXPECTED.items():
        check_line(lines[doc], outcome)
    standup = lines["notes/standup.md"]
    assert standup["attempts"] == 2 and standup["retried_after"] == ["out_of_memory"]
    first, second = jobs_of(rest_api, "Standup", t0)
    assert first.worker == "oom" and first.status == "FAILED" and second.status == "COMPLETED"
    err = json.loads(first.error)  # the worker's own error object, as /status showed it
    assert err["code"] == "out_of_memory" and err["retryable"] is True
    assert "out_of_memory" in capsys.readouterr().err  # the retry was announced

    # instructions too long for any prompt in a 512-token context: the worker refuses the input
    too_long = "Mention every name and every date. " * 60
    rc = summarize("notes/standup.md", "notes/회의록.txt", "--out", "bad.jsonl", "--endpoint", rest_api.endpoint,
                   "--instructions", too_long)
    assert rc == 1
    bad = by_doc(read_lines(endpoint_env / "bad.jsonl"))
    assert set(bad) == {"notes/standup.md", "notes/회의록.txt"}
    for line in bad.values():
        assert line["status"] == "failed" and line["attempts"] == 1
        assert line["error"]["code"] == "invalid_input" and line["error"]["retryable"] is False
        assert line["error"]["field"] == "summarize.text" and "too small" in line["error"]["message"]
    assert len(jobs_of(rest_api, too_long.strip())) == 2  # one job each: no retry


def test_when_retries_run_out_the_error_reaches_the_jsonl(endpoint_env, rest_api, capsys):
    make_notes(endpoint_env)
    rest_api.fail_with_oom(lambda job_input: job_input["summarize"]["text"] == KOREAN, times=2)
    rc = summarize("notes/회의록.txt", "notes/standup.md", "--out", "r.jsonl", "--endpoint", rest_api.endpoint,
                   "--retries", "1", "--report", "report.md")
    assert rc == 1
    lines = by_doc(read_lines(endpoint_env / "r.jsonl"))
    korean = lines["notes/회의록.txt"]
    assert korean["status"] == "failed" and korean["summary"] is None and korean["attempts"] == 2
    assert korean["error"]["code"] == "out_of_memory" and korean["error"]["retryable"] is True
    assert "out of memory" in korean["error"]["message"]
    check_line(lines["notes/standup.md"], "summary")
    assert "notes/회의록.txt: out_of_memory" in capsys.readouterr().out
    assert "**Failed** (out_of_memory)" in (endpoint_env / "report.md").read_text(encoding="utf-8")

    # a rerun retries the failed document (the fault is gone now) and keeps the finished one
    assert summarize("notes/회의록.txt", "notes/standup.md", "--out", "r.jsonl", "--endpoint",
                     rest_api.endpoint) == 0
    rerun = by_doc(read_lines(endpoint_env / "r.jsonl"))
    check_line(rerun["notes/회의록.txt"], "summary")
    assert rerun["notes/standup.md"] == lines["notes/standup.md"]


def test_ctrl_c_cancels_the_jobs_in_flight_and_a_rerun_finishes(endpoint_env, rest_api, capsys, terminal_sigint):
    make_notes(endpoint_env)
    before = set(rest_api.statuses())
    rest_api.held = True  # no worker free: the jobs wait IN_QUEUE

    def ctrl_c_when_queued():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            queued = [s for j, s in rest_api.statuses().items() if j not in before and s == "IN_QUEUE"]
            if len(queued) == 3:
                break
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_when_queued, daemon=True).start()
    try:
        rc = summarize("notes", "--out", "r.jsonl", "--endpoint", rest_api.endpoint)
    finally:
        rest_api.held = False
    assert rc == 130
    mine = {j: s for j, s in rest_api.statuses().items() if j not in before}
    assert list(mine.values()) == ["CANCELLED"] * 3
    assert "cancelled 3 jobs in flight" in capsys.readouterr().out
    lines = by_doc(read_lines(endpoint_env / "r.jsonl"))  # only the files that failed at reading
    assert set(lines) == {"notes/empty.txt", "notes/logo.png"}

    assert summarize("notes", "--out", "r.jsonl", "--endpoint", rest_api.endpoint) == 3  # only the empty and binary files failed: they never can
    lines = by_doc(read_lines(endpoint_env / "r.jsonl"))
    for doc, outcome in EXPECTED.items():
        check_line(lines[doc], outcome)


def test_a_refused_key_stops_the_run_before_any_job(endpoint_env, rest_api, monkeypatch, capsys):
    make_notes(endpoint_env)
    monkeypatch.setenv("RUNPOD_API_KEY", "wrong-key")
    jobs_before = len(rest_api.jobs)
    assert summarize("notes", "--out", "r.jsonl", "--endpoint", rest_api.endpoint) == 2
    assert "API key was refused" in capsys.readouterr().err
    assert len(rest_api.jobs) == jobs_before and read_lines(endpoint_env / "r.jsonl") == []
    rest_api.violations.clear()


def test_the_fake_serves_run_status_stream_cancel_and_health(rest_api):
    endpoint = runpod.Endpoint(rest_api.endpoint, api_key=rest_api.api_key)
    endpoint.rp_client.endpoint_url_base = rest_api.base_url

    job = endpoint.run({"prompt": KOREAN, "stream": True, "sampling_params": {"max_tokens": 12, "temperature": 0}})
    streamed = list(job.stream())
    state = endpoint.rp_client.get(f"{rest_api.endpoint}/status/{job.job_id}")
    assert state["status"] == "COMPLETED" and streamed == state["output"]
    assert streamed[-1]["finish_reason"] and "".join(i["text"] for i in streamed).strip()

    bad = {"prompt": "hi", "sampling_params": {"temperature": -1}}
    assert endpoint.run_sync(bad, timeout=30) is None  # the SDK's run_sync drops the error...
    failed = endpoint.run(bad)
    state = rest_api.wait_final(failed.job_id, 30)
    assert state["status"] == "FAILED"
    assert json.loads(state["error"])["code"] == "invalid_input"  # ...that /status keeps

    slow = endpoint.run({"prompt": "hi", "sampling_params": {"max_tokens": 2000, "ignore_eos": True}})
    deadline = time.monotonic() + 30
    while slow.status() != "IN_PROGRESS" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert endpoint.health()["jobs"]["inProgress"] >= 1
    assert slow.cancel()["status"] == "CANCELLED"
    assert rest_api.wait_final(slow.job_id, 5)["status"] == "CANCELLED"
    health = endpoint.health()
    assert health["jobs"]["completed"] >= 1 and health["jobs"]["failed"] >= 1 and health["workers"]["ready"] == 1
    assert not rest_api.violations
