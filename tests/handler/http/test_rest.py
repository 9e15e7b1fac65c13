"""The local endpoint's /v2 REST API over real HTTP, on the real worker: a failing job is
FAILED with its coded error object (not COMPLETED, as the SDK's --rp_serve_api reports it),
/run + /status, /stream then /status, /cancel, /runsync's wait, /health, unknown ids."""
from __future__ import annotations

import asyncio
import json

import pytest

from tests.handler.conftest import assert_free

FAILING = {
    "invalid top_p": ({"prompt": "Hi", "sampling_params": {"top_p": 1.5}}, "invalid_input"),
    "prompt too long": ({"prompt": "word " * 400}, "prompt_too_long"),
    "on_truncation error": ({"prompt": "The quick brown fox", "on_truncation": "error",
                             "sampling_params": {"max_tokens": 2, "ignore_eos": True}}, "truncated"),
}


@pytest.mark.parametrize("case", list(FAILING))
def test_a_failing_job_is_failed_with_its_error_object_through_runsync_and_status(http, case):
    job_input, code = FAILING[case]

    async def body(h):
        status, sync = await h.post("/v2/any-endpoint-id/runsync", {"input": job_input})
        _, later = await h.get(f"/v2/another-id/status/{sync['id']}")
        return status, sync, later

    status, sync, later = http(body)
    assert status == 200 and sync["id"].startswith("sync-") and sync["id"].endswith("-u1")
    for view in (sync, later):
        assert view["status"] == "FAILED" and "output" not in view, view
        err = json.loads(view["error"])  # the SDK stringifies the error object: it parses back
        assert err["code"] == code and err["message"] and err["retryable"] is False, err
        assert isinstance(view["delayTime"], int) and isinstance(view["executionTime"], int)
    assert later == sync
    if code == "invalid_input":
        assert err["field"] == "sampling_params.top_p"
    if code == "truncated":
        assert err["partial_text"]


def test_run_then_status_polling_gives_the_aggregated_output(http):
    async def body(h):
        status, queued = await h.post("/v2/ep/run", {"input": {"prompt": "The quick brown fox", "stream": True,
                                                                "sampling_params": {"max_tokens": 8}}})
        return status, queued, await h.until(queued["id"])

    status, queued, done = http(body)
    assert status == 200 and set(queued) == {"id", "status"} and queued["status"] == "IN_QUEUE"
    assert done["status"] == "COMPLETED" and done["id"] == queued["id"], done
    items = done["output"]  # return_aggregate_stream: the list of the items the handler yielded
    assert isinstance(items, list) and len(items) > 1 and "".join(i["text"] for i in items).strip()
    assert items[-1]["finish_reason"] in ("stop", "length") and items[-1]["usage"]["completion_tokens"] > 0
    assert done["executionTime"] >= 0 and done["delayTime"] >= 0 and "error" not in done


def test_stream_then_status_still_knows_the_job(http):
    async def body(h):
        _, queued = await h.post("/v2/ep/run", {"input": {"prompt": "Once upon a time", "stream": True,
                                                          "sampling_params": {"max_tokens": 10, "ignore_eos": True}}})
        streamed, views = [], []
        while True:
            code, view = await h.get(f"/v2/ep/stream/{queued['id']}")
            assert code == 200 and set(view) >= {"status", "stream"}, view
            views.append(view)
            streamed += [chunk["output"] for chunk in view["stream"]]
            if view["status"] in ("COMPLETED", "FAILED", "CANCELLED"):
                break
            await asyncio.sleep(0.02)
        _, again = await h.get(f"/v2/ep/stream/{queued['id']}")
        return streamed, views, again, await h.until(queued["id"])

    streamed, views, again, state = http(body)
    assert views[-1]["status"] == "COMPLETED" and again["stream"] == []  # each item is returned once
    assert state["status"] == "COMPLETED" and state["output"] == streamed
    assert streamed[-1]["usage"]["completion_tokens"] == 10


def test_cancel_stops_a_running_job_and_frees_its_blocks(http, slow_steps):
    async def body(h):
        _, queued = await h.post("/v2/ep/run", {"input": {"prompt": "hi", "sampling_params": {
            "max_tokens": 200, "ignore_eos": True}}})
        running = await h.until(queued["id"], ("IN_PROGRESS",) + ("COMPLETED", "FAILED"))
        _, health = await h.get("/v2/ep/health")
        code, cancelled = await h.post(f"/v2/ep/cancel/{queued['id']}")
        await asyncio.sleep(0.3)  # the engine takes the abort at its next step
        return running, health, code, cancelled, await h.until(queued["id"])

    running, health, code, cancelled, final = http(body)
    assert running["status"] == "IN_PROGRESS" and running["workerId"]
    assert health["jobs"]["inProgress"] == 1 and health["workers"]["running"] == 1
    assert code == 200 and cancelled == {"id": final["id"], "status": "CANCELLED"}
    assert final["status"] == "CANCELLED" and "output" not in final
    assert_free(slow_steps.worker)  # the handler aborted the request: its KV blocks are back


def test_runsync_answers_the_state_to_poll_when_its_wait_passes(http, slow_steps):
    async def body(h):
        _, pending = await h.post("/v2/ep/runsync?wait=1000", {"input": {"prompt": "hi", "sampling_params": {
            "max_tokens": 60, "ignore_eos": True}}})
        return pending, await h.until(pending["id"])

    pending, done = http(body)
    assert pending["status"] in ("IN_QUEUE", "IN_PROGRESS") and "output" not in pending, pending
    assert done["status"] == "COMPLETED" and done["output"][-1]["usage"]["completion_tokens"] == 60


def test_health_counts_the_jobs_and_the_worker(http):
    async def body(h):
        await h.post("/v2/ep/runsync", {"input": {"prompt": "hi", "sampling_params": {"max_tokens": 2}}})
        await h.post("/v2/ep/runsync", {"input": {"prompt": "hi", "sampling_params": {"top_p": 0}}})
        return await h.get("/v2/whatever/health")

    code, health = http(body)
    assert code == 200
    assert health["jobs"]["completed"] >= 1 and health["jobs"]["failed"] >= 1
    assert health["jobs"]["inProgress"] == 0 and health["jobs"]["inQueue"] == 0
    assert health["workers"] == {"idle": 1, "running": 0, "initializing": 0, "ready": 1, "throttled": 0,
                                 "unhealthy": 0}


def test_unknown_ids_and_bad_bodies_get_runpods_answers(http):
    async def body(h):
        return [await h.get("/v2/ep/status/no-such-job"), await h.get("/v2/ep/stream/no-such-job"),
                await h.post("/v2/ep/cancel/no-such-job"), await h.post("/v2/ep/run", {"prompt": "no input key"}),
                await h.call("GET", "/v2/ep/run"), await h.get("/v2/ep/nowhere")]

    (s1, b1), (s2, b2), (s3, b3), (s4, b4), (s5, b5), (s6, b6) = http(body)
    assert s1 == s2 == s3 == 404 and b1 == b2 == b3 == {"error": "request does not exist"}
    assert s4 == 400 and "input" in b4["error"]
    assert s5 == 405 and b5["error"] and s6 == 404 and b6["error"]
