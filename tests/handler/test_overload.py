"""Overload: a job that really waits in the engine's queue (one sequence at a time, a slow step)
past QUEUE_TIMEOUT_S fails `overloaded` (retryable) while the running one finishes; the summarize
client sends such documents to its --fallback-endpoint."""
from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import pytest

from handler.local import run_job
from tests.fakes.runpod_rest_api import FakeRestAPI
from tests.handler.conftest import assert_free, error_of, settings_for, text_of
from tests.summarize.conftest import local_env  # noqa: F401 - a fixture
from tests.summarize.notes import ENV, by_doc, check_line, make_notes, read_lines, summarize

LONG = {"max_tokens": 60, "ignore_eos": True, "temperature": 0}


def slow_steps(worker, seconds: float) -> None:
    """Every engine step takes at least `seconds` more: a busy GPU."""
    inner = worker.engine.engine
    step = inner.step

    def slow():
        time.sleep(seconds)
        return step()

    inner.step = slow


def test_a_job_queued_past_the_queue_timeout_fails_overloaded(loop, make_worker):
    w = make_worker(QUEUE_TIMEOUT_S="0.3", MAX_NUM_SEQS="1")
    assert loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": {"prompt": "Hi", "sampling_params": {
        "max_tokens": 2, "ignore_eos": True}}}))["status"] == "COMPLETED"
    slow_steps(w, 0.03)  # 60 tokens: about two seconds

    async def main():
        waiting_seen = []
        first = asyncio.ensure_future(run_job(w.handle, {"id": "first", "input": {"prompt": "The roadmap",
                                                                                   "sampling_params": LONG}}))
        while not w.engine.stats()["num_running"]:
            await asyncio.sleep(0.005)
        t0 = time.monotonic()
        second = asyncio.ensure_future(run_job(w.handle, {"id": "second", "input": {"prompt": "Action items",
                                                                                     "sampling_params": LONG}}))
        while not second.done():
            waiting_seen.append(w.engine.stats()["num_waiting"])
            await asyncio.sleep(0.02)
        failed_after = time.monotonic() - t0
        first_done_early = first.done()
        return await first, second.result(), failed_after, first_done_early, waiting_seen

    first, second, failed_after, first_done_early, waiting_seen = loop.run_until_complete(main())
    err = error_of(second)
    assert err["code"] == "overloaded" and err["retryable"] is True and "QUEUE_TIMEOUT_S=0.3" in err["message"]
    assert "queued" in err["message"]
    assert max(waiting_seen) == 1  # it really sat in the engine's queue
    assert 0.3 <= failed_after < 1.5 and not first_done_early  # it gave up while the first still ran
    assert first["status"] == "COMPLETED" and first["output"][-1]["usage"]["completion_tokens"] == 60
    assert_free(w)  # the overloaded request left the queue, its blocks (none) and stream gone
    assert w.engine.stats()["num_streams"] == 0
    assert w.metrics.summary()["jobs"]["failed:overloaded"] == 1

    # with the engine free again, a job within the timeout runs
    again = loop.run_until_complete(run_job(w.handle, {"id": "third", "input": {"prompt": "Action items",
                                                                                 "sampling_params": LONG}}))
    assert text_of(again) and again["output"][-1]["usage"]["completion_tokens"] == 60


def test_a_slow_first_step_is_not_queueing(loop, make_worker):
    """Past QUEUE_TIMEOUT_S without a token, but the engine has run a step of the job
    (a long prefill on a busy GPU): it is not overloaded and completes."""
    w = make_worker(QUEUE_TIMEOUT_S="0.2", MAX_NUM_SEQS="1")
    assert loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": {"prompt": "Hi", "sampling_params": {
        "max_tokens": 2, "ignore_eos": True}}}))["status"] == "COMPLETED"
    runner = w.engine.engine.runner
    execute = runner.execute

    def slow_forward(scheduled, **kw):  # the step has taken the job: its forward alone outlasts the timeout
        time.sleep(0.5)
        return execute(scheduled, **kw)

    runner.execute = slow_forward
    t0 = time.monotonic()
    res = loop.run_until_complete(run_job(w.handle, {"id": "slow", "input": {"prompt": "The roadmap",
                                                                              "sampling_params": {**LONG,
                                                                                                  "max_tokens": 3}}}))
    assert time.monotonic() - t0 >= 0.5
    assert res["status"] == "COMPLETED" and res["output"][-1]["usage"]["completion_tokens"] == 3, res
    assert_free(w)


# -- the summarize client's fallback endpoint --------------------------------------------------
class TwoEndpoints(FakeRestAPI):
    """The primary fake; requests for `other.endpoint` at the same base URL go to `other`."""

    other: FakeRestAPI

    def _dispatch(self, req, method):
        parts = urlsplit(req.path).path.strip("/").split("/")
        if len(parts) > 1 and parts[1] == self.other.endpoint:
            return self.other._dispatch(req, method)
        return super()._dispatch(req, method)


@pytest.fixture(scope="module")
def endpoints(tiny_llama_dir):
    from handler.worker import Worker

    from handler.engine_setup import build_engine

    def busy_engine(settings, on_progress=None):
        """An engine whose steps never get to run anything (a GPU taken by others): every
        request is still queued when QUEUE_TIMEOUT_S passes."""
        engine = build_engine(settings, on_progress)

        def busy():
            time.sleep(0.01)
            return []

        engine.engine.step = busy
        return engine

    def worker(factory=None, **extra):
        return lambda **env: Worker(settings_for(tiny_llama_dir, **{**ENV, **extra, **env}), engine_factory=factory)

    # every job on the primary is still queued when QUEUE_TIMEOUT_S passes: a full queue
    with FakeRestAPI(worker(), endpoint="ep-fallback") as fallback:
        primary = TwoEndpoints(worker(busy_engine, QUEUE_TIMEOUT_S="0.05"), endpoint="ep-busy")
        primary.other = fallback
        with primary:
            yield primary, fallback


@pytest.fixture
def endpoint_env(local_env, endpoints, monkeypatch):  # noqa: F811 - local_env is the imported fixture
    primary, _ = endpoints
    monkeypatch.setenv("RUNPOD_API_KEY", primary.api_key)
    monkeypatch.setenv("RUNPOD_ENDPOINT_BASE_URL", primary.base_url)
    return local_env


def test_overloaded_documents_go_to_the_fallback_endpoint(endpoint_env, endpoints, capsys):
    primary, fallback = endpoints
    make_notes(endpoint_env)
    # without a fallback: overloaded is retryable, so retried on the busy endpoint, then reported
    assert summarize("notes/standup.md", "--out", "alone.jsonl", "--endpoint", "ep-busy", "--retries", "1") == 1
    alone = by_doc(read_lines(endpoint_env / "alone.jsonl"))["notes/standup.md"]
    assert alone["status"] == "failed" and alone["attempts"] == 2
    assert alone["error"]["code"] == "overloaded" and alone["error"]["retryable"] is True
    assert "served_by" not in alone

    busy_before, fallback_before = len(primary.jobs), len(fallback.jobs)
    assert summarize("notes", "--out", "r.jsonl", "--endpoint", "ep-busy", "--fallback-endpoint", "ep-fallback") == 3
    lines = by_doc(read_lines(endpoint_env / "r.jsonl"))
    for doc in ("notes/standup.md", "notes/회의록.txt", "notes/archive/long.md"):
        check_line(lines[doc], "summary")
        assert lines[doc]["served_by"] == "endpoint ep-fallback" and lines[doc]["attempts"] == 1
        assert fallback.jobs[lines[doc]["job_id"]].status == "COMPLETED"
    check_line(lines["notes/empty.txt"], "empty_document")  # never sent anywhere
    busy = [j for j in list(primary.jobs.values())[busy_before:]]
    assert len(busy) == 3 and all(json.loads(j.error)["code"] == "overloaded" for j in busy)
    assert len(fallback.jobs) - fallback_before == 3
    assert "overloaded on endpoint ep-busy; sending it to endpoint ep-fallback" in capsys.readouterr().err
    assert not primary.violations and not fallback.violations


def test_a_job_whose_choices_the_kv_cache_cannot_hold_yet_waits_as_queued_then_fails_overloaded(loop, make_worker):
    """Two jobs of 64 choices, each the whole KV cache (64 blocks, one a choice): the second waits
    for the first's blocks instead of both running and preempting each other, and that wait is
    queueing: past QUEUE_TIMEOUT_S it fails overloaded (retryable) while the first completes."""
    w = make_worker(QUEUE_TIMEOUT_S="0.3", NUM_KV_BLOCKS="64", MAX_CHOICES="64")
    assert loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": {"prompt": "Hi", "sampling_params": {
        "max_tokens": 2, "ignore_eos": True}}}))["status"] == "COMPLETED"
    slow_steps(w, 0.05)  # 12 tokens: about a second
    wide = {"prompt": [5, 17, 33, 120], "sampling_params": {"n": 64, "max_tokens": 12, "ignore_eos": True,
                                                            "temperature": 1.0}}

    async def main():
        first = asyncio.ensure_future(run_job(w.handle, {"id": "first", "input": wide}))
        while not w.engine.stats()["num_running"]:
            await asyncio.sleep(0.005)
        second = await run_job(w.handle, {"id": "second", "input": wide})
        return await first, second

    before = w.engine.stats()["num_preemptions"]
    first, second = loop.run_until_complete(main())
    err = error_of(second)
    assert err["code"] == "overloaded" and err["retryable"] is True and "QUEUE_TIMEOUT_S=0.3" in err["message"]
    assert "64 choices" in err["message"], err
    assert first["status"] == "COMPLETED" and len(first["output"][-1]["choices"]) == 64
    assert w.engine.stats()["num_preemptions"] == before
    assert_free(w)


def test_a_request_preempted_and_waiting_past_the_queue_timeout_fails_overloaded(loop, make_worker):
    """A preempted request waits in the engine's queue again: that counts as queued. Two requests
    that cannot both grow to their length in 6 blocks (the KV admission off, as for a request whose
    estimate was short): the one preempted fails overloaded (retryable) with its text so far once it
    has waited QUEUE_TIMEOUT_S, while the other completes."""
    w = make_worker(QUEUE_TIMEOUT_S="0.5", NUM_KV_BLOCKS="6", ENABLE_PREFIX_CACHING="false")
    assert loop.run_until_complete(run_job(w.handle, {"id": "warm", "input": {"prompt": "Hi", "sampling_params": {
        "max_tokens": 2, "ignore_eos": True}}}))["status"] == "COMPLETED"
    w.admission = None  # every request straight to the engine
    slow_steps(w, 0.03)
    grow = {"max_tokens": 60, "ignore_eos": True, "temperature": 0}

    async def main():
        jobs = [asyncio.ensure_future(run_job(w.handle, {"id": f"grow-{i}", "input": {
            "prompt": [5 + i] * 8, "stream": True, "max_batch_size": 1, "sampling_params": grow}})) for i in range(2)]
        return await asyncio.gather(*jobs)

    results = loop.run_until_complete(main())
    assert w.engine.stats()["num_preemptions"] >= 1
    failed = [r for r in results if r["status"] == "FAILED"]
    assert len(failed) == 1 and [r["status"] for r in results].count("COMPLETED") == 1, results
    err = error_of(failed[0])
    assert err["code"] == "overloaded" and err["retryable"] is True and "preempted" in err["message"], err
    assert_free(w)
