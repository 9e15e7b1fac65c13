"""The worker at the runpod SDK's edges. Batch poisoning: one job-take batch holding two good
jobs, one nested 1,200 levels deep and one with invalid UTF-8, through the real SDK loop: the
good ones complete, the bad ones fail invalid_input naming why. The per-job parser on its own.
The drain's deadline on an in-process worker: running jobs and one waiting for the model fail
worker_shutdown (retryable, with the text so far), a job after the deadline is refused."""
from __future__ import annotations

import asyncio
import json
import threading
import time

from handler.local import run_job
from handler.settings import load_settings
from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.hardening.outcomes import assert_clean_exit, error_object, output_text

ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "128", "MAX_CONCURRENCY": "8", "JOB_KV_TOKENS": "64",
       "DEFAULT_BATCH_SIZE": "8", "METRICS_LOG_INTERVAL_S": "0"}
DEEP = 1200  # past the JSON parser's recursion limit (1,000 frames)
GOOD = {"prompt": "The quick brown fox", "sampling_params": {"max_tokens": 8, "ignore_eos": True}}
DEEP_INPUT = b'{"prompt": "x", "sampling_params": {"stop": ' + b"[" * DEEP + b"]" * DEEP + b"}}"
BAD_UTF8_INPUT = b'{"prompt": "caf\xc3\xa9 \xff\xfe au lait"}'


def test_a_batch_with_unparseable_jobs_runs_the_good_ones_and_fails_the_bad_ones_coded(tiny_llama_dir, figures):
    with FakeControlPlane() as fake:
        fake.submit(GOOD, "good-1")
        fake.submit_raw(DEEP_INPUT, "deep")
        fake.submit_raw(BAD_UTF8_INPUT, "bad-utf8")
        fake.submit(GOOD, "good-2")
        proc = WorkerProcess({**fake.worker_env(), **ENV, "MODEL_NAME": tiny_llama_dir})
        rc = proc.serve_until(fake, fake.all_final, 60, "every job of the batch final")
    assert_clean_exit(fake, proc, rc)
    first = fake.takes[0]
    assert first["batch"] and int(first["batch_size"]) >= 4, fake.takes
    assert all(fake.jobs[j].worker == "worker-1" for j in fake.jobs)
    if len(fake.take_times) > 1:  # all four came in the first take
        assert max(j.taken_at for j in fake.jobs.values()) <= fake.take_times[1]
    for jid in ("good-1", "good-2"):
        job = fake.jobs[jid]
        assert job.status == "COMPLETED" and output_text(job.output).strip(), (jid, job.status_view())
    why = {"deep": "nests deeper than the JSON parser allows", "bad-utf8": "not valid UTF-8"}
    for jid, reason in why.items():
        job = fake.jobs[jid]
        err = error_object(job.error)
        assert job.status == "FAILED" and err is not None, (jid, job.status_view())
        assert err["code"] == "invalid_input" and err["field"] == "input" and err["retryable"] is False, err
        assert reason in err["message"], err
        logged = [line for line in proc.lines if f"[job {jid}]" in line and "could not be parsed" in line]
        assert logged and " INFO " in logged[0], logged
    figures.set("sdk_edges_batch", batch=4, completed=2, failed_invalid_input=2, lost=0)


def test_the_job_take_parser_reads_each_job_of_a_batch_on_its_own():
    from handler.runpod_loop.job_take import UnreadableInput, parse_jobs

    tricky = {"id": "z", "input": {"prompt": 'brackets ]}" ,{ and a quote \\" in a string'}}
    body = b"[" + b", ".join([
        json.dumps({"id": "a", "input": GOOD}).encode(),
        b'{"id": "deep", "batchId": "b-1", "input": ' + DEEP_INPUT + b"}",
        b'{"input": ' + BAD_UTF8_INPUT + b', "id": "bad-utf8"}',
        b'{"id": "no-input"}',
        b'{"input": "\xff"}',  # no readable id: dropped (nothing can be posted for it)
        b"7",
        json.dumps(tricky).encode(),
    ]) + b"]"
    jobs = parse_jobs(body)
    assert [j["id"] for j in jobs] == ["a", "deep", "bad-utf8", "no-input", "z"]
    assert jobs[0] == {"id": "a", "input": GOOD} and jobs[-1] == tricky
    assert jobs[1]["batchId"] == "b-1" and "nests deeper" in jobs[1]["input"].reason
    assert isinstance(jobs[2]["input"], UnreadableInput) and "UTF-8" in jobs[2]["input"].reason
    assert jobs[3]["input"].reason == "the job has no input"
    # a body that parses whole is json.loads' result; the legacy take's one object is a list of one
    good = [{"id": f"j{i}", "input": {"prompt": "x" * i}, "webhook": None} for i in range(5)]
    assert parse_jobs(json.dumps(good).encode()) == good
    assert parse_jobs(json.dumps(good[0]).encode()) == [good[0]]
    one = parse_jobs(b'{"id": "one", "input": ' + DEEP_INPUT + b"}")
    assert [j["id"] for j in one] == ["one"] and isinstance(one[0]["input"], UnreadableInput)
    assert parse_jobs(b"not json") == parse_jobs(b"[]") == parse_jobs(b'"a string"') == parse_jobs(b"[1, 2") == []


# -- the drain's deadline, in-process --------------------------------------------------------
def _settings(model_dir: str):
    return load_settings({"MODEL_NAME": model_dir, "MAX_MODEL_LEN": "512", "NUM_KV_BLOCKS": "128",
                          "DEFAULT_BATCH_SIZE": "4", "METRICS_LOG_INTERVAL_S": "0", "DRAIN_TIMEOUT_S": "30"})


def _error(result: dict) -> dict:
    assert result["status"] == "FAILED", result
    err = error_object(result["error"])
    assert err is not None, result
    return err


async def _consume(worker, job: dict, items: list, first: asyncio.Event) -> dict:
    """The job as the SDK runs it, its items kept as they come (`first` set at the first one)."""
    async for item in worker.handle(job):
        if isinstance(item, dict) and item.get("error"):
            return {"status": "FAILED", "error": item["error"]}
        items.append(item)
        first.set()
    return {"status": "COMPLETED", "output": items}


def test_the_drain_deadline_fails_running_jobs_worker_shutdown_with_their_text_and_refuses_later_ones(tiny_llama_dir):
    from handler.worker import Worker

    long = {"max_tokens": 400, "ignore_eos": True}

    async def main():
        w = Worker(_settings(tiny_llama_dir))
        try:
            await run_job(w.handle, {"id": "warmup", "input": {"prompt": "hi"}})
            streamed, first = [], asyncio.Event()
            jobs = [asyncio.create_task(_consume(w, {"id": "stream", "input": {
                        "prompt": "The roadmap", "stream": True, "max_batch_size": 2, "sampling_params": long}},
                        streamed, first)),
                    asyncio.create_task(run_job(w.handle, {"id": "whole", "input": {
                        "prompt": "Meeting notes:", "sampling_params": long}}))]
            await asyncio.wait_for(first.wait(), 60)
            while len(streamed) < 3:  # a few tokens in: both jobs have text by now
                await asyncio.sleep(0.01)
            w.drain.begin("SIGTERM")
            t0 = time.monotonic()
            assert await w.drain.expire() == 2
            results = await asyncio.wait_for(asyncio.gather(*jobs), 10)
            ended_s = time.monotonic() - t0
            after = await run_job(w.handle, {"id": "after", "input": {"prompt": "too late"}})
            return results, streamed, ended_s, after, w.engine.stats()
        finally:
            await w.aclose()

    (stream, whole), streamed, ended_s, after, stats = asyncio.run(main())
    assert ended_s < 2.0, ended_s  # ended by the deadline, not run to the end
    text = "".join(item["text"] for item in streamed)
    for result in (stream, whole):
        err = _error(result)
        assert err["code"] == "worker_shutdown" and err["retryable"] is True, err
        assert err["partial_text"].strip() and err["drain_timeout_s"] == 30, err
    assert _error(stream)["partial_text"].startswith(text) and text
    refused = _error(after)
    assert refused["code"] == "worker_shutdown" and refused["retryable"] and "partial_text" not in refused
    assert "before the job could start" in refused["message"], refused
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["num_running"] == 0, stats


def test_a_job_waiting_for_the_model_load_at_the_drain_deadline_fails_worker_shutdown_at_once(tiny_llama_dir):
    from handler.engine_setup import build_engine
    from handler.worker import Worker

    release = threading.Event()

    def slow_factory(settings, on_progress):
        release.wait(30)  # the load takes until the test lets it go
        return build_engine(settings, on_progress)

    async def main():
        w = Worker(_settings(tiny_llama_dir), engine_factory=slow_factory)
        try:
            job = asyncio.create_task(run_job(w.handle, {"id": "waiting", "input": {"prompt": "Hi"}}))
            await asyncio.sleep(0.3)
            assert not job.done()
            w.drain.begin("SIGTERM")
            t0 = time.monotonic()
            await w.drain.expire()
            result = await asyncio.wait_for(job, 5)
            return result, time.monotonic() - t0
        finally:
            release.set()
            await w.aclose()

    result, ended_s = asyncio.run(main())
    err = _error(result)
    assert err["code"] == "worker_shutdown" and err["retryable"] is True and ended_s < 1.0, (err, ended_s)
