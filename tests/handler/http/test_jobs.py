"""The local endpoint's parts without a model: the SDK's rules for a job's end, the job queue's
concurrency (the worker's modifier, resized only with no job in flight, as the SDK's JobScaler),
the job store's views and retention."""
from __future__ import annotations

import asyncio
import json

import pytest

from handler.http.job_queue import JobQueue
from handler.http.jobs import JobStore
from handler.local import drive


def items_handler(*items, raises: Exception | None = None):
    async def handler(job):
        for item in items:
            yield item
        if raises is not None:
            raise raises
    return handler


@pytest.mark.parametrize("items, expected", [
    (({"text": "a"}, {"text": "b"}), {"status": "COMPLETED", "output": [{"text": "a"}, {"text": "b"}]}),
    (({"text": "a"}, {"error": '{"code": "truncated"}'}, {"text": "never"}),
     {"status": "FAILED", "error": '{"code": "truncated"}'}),
    (({"text": "a", "error": ""}, "plain"), {"status": "COMPLETED", "output": [{"text": "a", "error": ""}, "plain"]}),
])
def test_drive_ends_a_job_by_the_sdks_rules(loop, items, expected):
    streamed = []
    result = loop.run_until_complete(drive(items_handler(*items), {"id": "j", "input": {}}, streamed.append))
    assert result == expected
    assert streamed == expected.get("output", [items[0]])  # the error item itself is never streamed


def test_drive_reports_a_raised_exception_as_the_sdk_does(loop):
    result = loop.run_until_complete(drive(items_handler({"text": "a"}, raises=ValueError("boom")), {"id": "j"}))
    assert result["status"] == "FAILED" and result["error"].startswith("handler: boom \ntraceback: ")


def test_the_queue_runs_as_many_jobs_as_the_modifier_allows(loop):
    store = JobStore()
    running, peak, gate = set(), [0], asyncio.Event()
    asked = []

    async def handler(job):
        running.add(job["id"])
        peak[0] = max(peak[0], len(running))
        await gate.wait()
        running.discard(job["id"])
        yield {"text": job["input"]}

    def modifier(current):
        asked.append(current)
        return 2

    async def main():
        queue = JobQueue(store, handler, modifier)
        queue.start()
        jobs = [store.new(i) for i in range(5)]
        for job in jobs:
            queue.submit(job)
        await asyncio.sleep(0.3)
        states = [j.status for j in jobs]
        gate.set()
        for _ in range(100):
            if all(j.status == "COMPLETED" for j in jobs):
                break
            await asyncio.sleep(0.02)
        await queue.close()
        return states, jobs

    states, jobs = loop.run_until_complete(main())
    assert states == ["IN_PROGRESS"] * 2 + ["IN_QUEUE"] * 3 and peak[0] == 2
    assert asked[0] == 1  # the SDK's JobScaler starts at 1 and asks the modifier
    assert [j.output for j in jobs] == [[{"text": i}] for i in range(5)]


def test_a_new_concurrency_waits_for_the_jobs_in_flight(loop):
    store = JobStore()
    gate = asyncio.Event()
    value = [1]

    async def handler(job):
        await gate.wait()
        yield {"text": "x"}

    async def main():
        queue = JobQueue(store, handler, lambda current: value[0])
        queue.start()
        first = store.new("a")
        queue.submit(first)
        await asyncio.sleep(0.2)
        value[0] = 3
        later = [store.new(i) for i in range(3)]
        for job in later:
            queue.submit(job)
        await asyncio.sleep(0.3)
        held = [j.status for j in later]  # not started while `first` runs
        gate.set()
        await asyncio.sleep(0.3)
        await queue.close()
        return held, [j.status for j in later], queue.concurrency

    held, after, concurrency = loop.run_until_complete(main())
    assert held == ["IN_QUEUE"] * 3 and after == ["COMPLETED"] * 3 and concurrency == 3


def test_cancel_takes_a_queued_job_out_and_cancels_a_running_one(loop):
    store = JobStore()

    async def handler(job):
        await asyncio.sleep(30)
        yield {"text": "never"}

    async def main():
        queue = JobQueue(store, handler)
        queue.start()
        running, queued = store.new("a"), store.new("b")
        queue.submit(running)
        queue.submit(queued)
        await asyncio.sleep(0.2)
        queue.cancel(queued)
        queue.cancel(running)
        await asyncio.sleep(0.2)
        await queue.close()
        return running, queued, queue.running

    running, queued, left = loop.run_until_complete(main())
    assert running.status == queued.status == "CANCELLED" and left == 0
    assert running.started is not None and running.view()["executionTime"] >= 0


def test_finished_jobs_are_kept_for_their_retention_then_unknown(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("handler.http.jobs.time.monotonic", lambda: clock[0])
    store = JobStore()
    run, sync, queued = store.new("a"), store.new("b", sync=True), store.new("c")
    assert not run.id.startswith("sync-") and sync.id.startswith("sync-")
    for job in (run, sync):
        store.start(job)
        store.end(job, "FAILED", error=json.dumps({"code": "invalid_input"}))
    clock[0] += 61  # RunPod: /runsync results 1 minute, /run results 30 minutes
    assert store.get(sync.id) is None and store.get(run.id) is run and store.get(queued.id) is queued
    clock[0] += 30 * 60
    assert store.get(run.id) is None and store.get(queued.id) is queued  # only finished jobs expire
    assert store.health()["jobs"] == {"completed": 0, "failed": 0, "inProgress": 0, "inQueue": 1, "retried": 0}


def test_status_views_are_runpods():
    store = JobStore()
    job = store.new({"prompt": "x"})
    assert job.view() == {"id": job.id, "status": "IN_QUEUE"}
    store.start(job)
    store.progress({"id": job.id}, {"loading": "model"})
    assert job.view()["output"] == {"loading": "model"} and "executionTime" not in job.view()
    store.add(job, {"text": "a"})
    assert job.take_stream()["stream"] == [{"output": {"text": "a"}}] and job.take_stream()["stream"] == []
    store.end(job, "COMPLETED", output=[{"text": "a"}])
    assert not store.end(job, "FAILED", error="late")  # a job ends once
    view = job.view()
    assert view["status"] == "COMPLETED" and view["output"] == [{"text": "a"}] and "error" not in view
    assert {"delayTime", "executionTime", "workerId"} <= set(view)
