"""Handler test fixtures: one event loop for in-process workers on the real engine,
and helpers that run a job the way the runpod SDK consumes it."""
from __future__ import annotations

import asyncio
import json

import pytest

from handler.local import run_job as sdk_like_run_job
from handler.settings import load_settings


@pytest.fixture(scope="session")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    pending = asyncio.all_tasks(loop)  # the engines' background loops
    for task in pending:
        task.cancel()
    if pending:  # gather() of nothing would make its future on another loop
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()


def settings_for(model_dir: str, **env) -> object:
    # EMPTY_OUTPUT_RETRIES 8: the tiny random model's first sampled tokens are often half of a
    # UTF-8 character (which the detokenizer drops at the end), so a short sampled job's text can
    # be empty; retried with fresh seeds it is not (tests of the retries set their own count)
    base = {"MODEL_NAME": model_dir, "MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "64", "DEFAULT_MAX_TOKENS": "12",
            "DEFAULT_BATCH_SIZE": "4", "METRICS_LOG_INTERVAL_S": "0", "EMPTY_OUTPUT_RETRIES": "8"}
    base.update({k: str(v) for k, v in env.items()})
    return load_settings(base)


@pytest.fixture
def make_worker(tiny_llama_dir, loop):
    """Workers on the tiny model with env overrides; their engines stop at teardown."""
    from handler.worker import Worker

    made = []

    def make(**env):
        made.append(Worker(settings_for(tiny_llama_dir, **env)))
        return made[-1]

    yield make
    for w in made:
        loop.run_until_complete(w.aclose())


@pytest.fixture(scope="session")
def shared_worker(tiny_llama_dir, loop):
    """A worker whose engine is loaded once for the tests that only read results."""
    from handler.worker import Worker

    w = Worker(settings_for(tiny_llama_dir))
    loop.run_until_complete(sdk_like_run_job(w.handle, {"id": "warmup", "input": {"prompt": "hi"}}))
    return w


def run(loop, worker, job_input, job_id: str = "job-1") -> dict:
    """The job's end as /status shows it: COMPLETED with the item list, or FAILED with the error."""
    return loop.run_until_complete(sdk_like_run_job(worker.handle, {"id": job_id, "input": job_input}))


def error_of(result: dict) -> dict:
    """The parsed error object of a FAILED result (it must be JSON with code, message, retryable)."""
    assert result["status"] == "FAILED", result
    err = json.loads(result["error"])
    assert {"code", "message", "retryable"} <= set(err), err
    return err


def text_of(result: dict) -> str:
    assert result["status"] == "COMPLETED", result
    return "".join(item["text"] for item in result["output"])


def assert_free(worker) -> None:
    stats = worker.engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"], stats
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0, stats
