"""The real runpod SDK worker loop (`python -m handler` in a subprocess) against a fake
control plane on 127.0.0.1: many concurrent jobs of every shape, each ending as the
failure contract says; cancellation, SIGTERM, a dead engine, and every KV block freed."""
import json
import re
import signal
import time

import pytest

from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.handler.sse import parse_sse

SURE = {"ignore_eos": True}  # random weights may sample EOS first, and that job would rightly fail empty_output
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is the capital of France?"}]
LONG = {"max_tokens": 480, "ignore_eos": True}

# job id -> (input, expected: "ok" or the error code)
JOBS = {
    "prompt": ({"prompt": "The quick brown fox", "sampling_params": SURE}, "ok"),
    "prompt-stream": ({"prompt": "Meeting notes:", "stream": True, "max_batch_size": 3, "sampling_params": SURE},
                      "ok"),
    "chat": ({"messages": CHAT, "sampling_params": SURE}, "ok"),
    "chat-stream": ({"messages": CHAT, "stream": True, "max_batch_size": 2, "sampling_params": SURE}, "ok"),
    "template": ({"prompt": "What is the capital of France?", "apply_chat_template": True,
                  "sampling_params": SURE}, "ok"),
    "korean-stream": ({"prompt": "회의록: 오늘 회의에서 예산과 일정, 채용 계획을 논의했습니다.", "stream": True,
                       "max_batch_size": 2, "sampling_params": SURE}, "ok"),
    "korean-chat": ({"messages": [{"role": "user", "content": "결정 사항: 다음 주 금요일까지 보고서를 제출합니다."}],
                     "sampling_params": {"temperature": 0, "repetition_penalty": 1.2, **SURE}}, "ok"),
    "priority": ({"prompt": "Action items:", "priority": -5, "sampling_params": {"seed": 7, **SURE}}, "ok"),
    "openai-chat": ({"openai_route": "/v1/chat/completions", "openai_input": {
        "model": "tiny", "messages": CHAT, "max_tokens": 8, "temperature": 0, **SURE}}, "openai"),
    "openai-chat-stream": ({"openai_route": "/v1/chat/completions", "openai_input": {
        "model": "tiny", "messages": CHAT, "max_tokens": 8, "stream": True,
        "stream_options": {"include_usage": True}, **SURE}}, "openai"),
    "openai-completions": ({"openai_route": "/v1/completions", "openai_input": {
        "model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, **SURE}}, "openai"),
    "openai-completions-stream": ({"openai_route": "/v1/completions", "openai_input": {
        "model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "stream": True, **SURE}}, "openai"),
    "openai-models": ({"openai_route": "/v1/models"}, "openai"),
    "vllm-openai-format": ({"messages": CHAT, "use_openai_format": True,
                            "sampling_params": {"max_tokens": 5, **SURE}}, "openai"),
    "invalid-param": ({"prompt": "x", "sampling_params": {"foo": 1}}, "invalid_input"),
    "invalid-value": ({"prompt": "x", "sampling_params": {"temperature": -1}}, "invalid_input"),
    "invalid-key": ({"promt": "typo"}, "invalid_input"),
    "too-long": ({"prompt": "fox " * 600}, "prompt_too_long"),
    "truncated-flag": ({"prompt": "Hi", "sampling_params": {"max_tokens": 3, "ignore_eos": True}}, "ok"),
    "truncated-error": ({"prompt": "Hi", "on_truncation": "error", "stream": True, "max_batch_size": 1,
                         "sampling_params": {"max_tokens": 3, "ignore_eos": True}}, "truncated"),
    "empty": ({"prompt": "Hi", "sampling_params": {"stop_token_ids": list(range(400))}}, "empty_output"),
    "timeout": ({"prompt": "Hi", "timeout_s": 0.5, "sampling_params": LONG}, "timeout"),
    "rid-first": ({"prompt": "Alice sends the report", "request_id": "rid-x", "sampling_params": SURE}, "ok"),
    "rid-again": ({"prompt": "Alice sends the report", "request_id": "rid-x", "sampling_params": SURE}, "ok"),
    "rid-other": ({"prompt": "Bob reviews the contract", "request_id": "rid-x", "sampling_params": SURE},
                  "invalid_input"),
    "oom": ({"prompt": "Hi there", "stream": True, "max_batch_size": 1,
             "sampling_params": {"max_tokens": 16, "ignore_eos": True}}, "out_of_memory"),
    "cancel-me": ({"prompt": "Hi", "stream": True, "max_batch_size": 1, "sampling_params": LONG}, "cancelled"),
    "long": ({"prompt": "The roadmap", "stream": True, "sampling_params": LONG}, "ok"),
}
FIELDS = {"invalid-param": "sampling_params.foo", "invalid-value": "sampling_params.temperature",
          "invalid-key": "promt", "rid-other": "request_id"}

WORKER_ENV = {"MAX_MODEL_LEN": "512", "NUM_KV_BLOCKS": "256", "DEFAULT_MAX_TOKENS": "16", "JOB_KV_TOKENS": "64",
              "MAX_CONCURRENCY": "40", "DEFAULT_BATCH_SIZE": "8", "LOAD_PROGRESS_INTERVAL_S": "1",
              "METRICS_LOG_INTERVAL_S": "0",
              "DRAIN_TIMEOUT_S": "60"}  # "long", in flight at SIGTERM, must finish (the deadline: test_drain.py)
OOM_AT_STEP_5 = {"FAULT_INJECTION": json.dumps({"oom_at_step": 5, "oom_request_id": "oom"})}


def final_stats(proc: WorkerProcess) -> dict:
    line = proc.wait_for_line("worker exit: engine stats", 5)
    return json.loads(line.split("worker exit: engine stats ", 1)[1])


def check_completed(jid: str, job, kind: str):
    assert job.status == "COMPLETED", (jid, job.status_view())
    assert job.stream == job.output, jid  # what was streamed is what the job's output aggregates
    if kind == "openai":
        items = job.output
        if jid == "openai-models":
            assert items[0]["object"] == "list"
            return
        if isinstance(items[-1], str):  # a raw SSE stream
            assert items[-1].endswith("data: [DONE]\n\n")
            chunks = [c for it in items for c in parse_sse(it)]
            choices = [c["choices"][0] for c in chunks if c["choices"]]
            text = "".join(ch.get("delta", {}).get("content") or ch.get("text") or "" for ch in choices)
            assert choices[-1]["finish_reason"] in ("stop", "length"), jid
        else:
            assert len(items) == 1
            choice = items[0]["choices"][0]
            text = choice.get("message", {}).get("content") or choice.get("text")
            assert choice["finish_reason"] in ("stop", "length") and items[0]["usage"]["completion_tokens"] > 0
        assert text.strip(), jid
        return
    text = "".join(item["text"] for item in job.output)
    last = job.output[-1]
    assert text.strip(), jid
    assert last["finish_reason"] in ("stop", "length") and last["truncated"] == (last["finish_reason"] == "length")
    assert last["usage"]["prompt_tokens"] > 0 and last["usage"]["completion_tokens"] > 0
    assert {"queue_s", "first_token_s", "total_s"} <= set(last["timings"])
    if not JOBS[jid][0].get("stream"):
        assert len(job.output) == 1


@pytest.fixture
def fake():
    with FakeControlPlane() as plane:
        yield plane


def test_sdk_worker_loop_takes_concurrent_jobs_and_every_job_ends_per_contract(fake, tiny_llama_dir):
    for jid, (job_input, _) in JOBS.items():
        fake.submit(job_input, jid)
    proc = WorkerProcess({**fake.worker_env(), **WORKER_ENV, **OOM_AT_STEP_5, "MODEL_NAME": tiny_llama_dir})
    try:
        # the worker loads its model first, then takes every job at once (the free KV blocks hold them all)
        fake.wait_for(lambda: all(j.status != "IN_QUEUE" for j in fake.jobs.values()), 60, "all jobs taken")
        fake.wait_for(lambda: len(fake.jobs["cancel-me"].stream) >= 1, 60, "cancel-me streaming")
        fake.cancel("cancel-me")
        fake.wait_for(lambda: not fake.stops, 10, "the stop signal delivered")
        fake.wait_for(lambda: len(fake.jobs["long"].stream) >= 1, 60, "long streaming")
        assert fake.jobs["long"].status == "IN_PROGRESS"
        proc.proc.send_signal(signal.SIGTERM)  # stop taking jobs, finish those in flight, exit
        time.sleep(1.5)
        late = fake.submit({"prompt": "after SIGTERM"}, "late")
        rc = proc.wait(90)
    finally:
        proc.stop()
    out = proc.output
    assert rc == 0, out[-3000:]
    assert fake.violations == []
    assert "Traceback" not in out and "Uncaught exception" not in out and "Error handling job" not in out
    assert fake.jobs[late].status == "IN_QUEUE"  # not taken after SIGTERM
    assert fake.jobs["long"].status == "COMPLETED"  # in flight at SIGTERM, finished
    assert any(t["batch"] and int(t["batch_size"]) >= len(JOBS) for t in fake.takes)
    assert fake.pings and all(p["worker"] == "worker-1" for p in fake.pings)
    # MODEL_NAME: the model loaded before the first take, so no job waited for it
    assert "before taking jobs" in out and not any(j.progress for j in fake.jobs.values())

    for jid, (job_input, expected) in JOBS.items():
        job = fake.jobs[jid]
        if expected in ("ok", "openai"):
            check_completed(jid, job, expected)
        elif expected == "cancelled":
            assert job.status == "CANCELLED" and job.late_results == 0 and job.output is None
            assert re.search(rf"\[job {jid}\] cancelled", out)
        else:
            assert job.status == "FAILED", (jid, job.status_view())
            err = json.loads(job.error)
            assert err["code"] == expected and isinstance(err["message"], str) and "retryable" in err, err
            if jid in FIELDS:
                assert err["field"] == FIELDS[jid]
            streamed = "".join(i["text"] for i in job.stream if isinstance(i, dict) and "text" in i)
            if streamed:
                assert err["partial_text"] == streamed, jid
    too_long = json.loads(fake.jobs["too-long"].error)
    assert too_long["max_model_len"] == 512 and too_long["prompt_tokens"] >= 512
    assert json.loads(fake.jobs["truncated-error"].error)["partial_text"]
    assert fake.jobs["truncated-flag"].output[-1]["truncated"] is True
    assert fake.jobs["rid-again"].output[-1].get("cached") is True
    assert "".join(i["text"] for i in fake.jobs["rid-again"].output) == fake.jobs["rid-first"].output[0]["text"]
    oom = json.loads(fake.jobs["oom"].error)
    assert oom["retryable"] is True and oom["partial_text"]  # the others went on (checked above)
    korean = fake.jobs["korean-stream"]
    assert len(korean.stream) > 2

    stats = final_stats(proc)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == 256
    assert stats["num_running"] == stats["num_waiting"] == stats["num_streams"] == 0
    for jid in JOBS:  # every job's end is logged with its id
        assert f"[job {jid}] " in out, jid


def test_a_dead_engine_fails_the_jobs_and_the_worker_asks_to_be_replaced(fake, tiny_llama_dir):
    fake.submit({"prompt": "Hi", "stream": True, "sampling_params": LONG}, "a")
    fake.submit({"messages": CHAT, "sampling_params": LONG}, "b")
    proc = WorkerProcess({**fake.worker_env(), **WORKER_ENV, "MODEL_NAME": tiny_llama_dir}, dead_at_step=4)
    try:
        rc = proc.wait(90)  # exits by itself: the SDK stops the worker after the job (refresh_worker)
    finally:
        proc.stop()
    assert rc == 1, proc.output[-3000:]
    for jid in ("a", "b"):
        job = fake.jobs[jid]
        assert job.status == "FAILED" and job.stop_pod is True, job.status_view()
        err = json.loads(job.error)
        assert err["code"] == "engine_dead" and err["retryable"] is True
    assert fake.violations == []


def test_after_engine_dead_the_jobs_a_take_in_flight_returns_still_end_coded(tiny_llama_dir):
    """The SDK stops the worker after the engine_dead job (refresh_worker) while a job take is held
    open for the free slots: the jobs that take returns get a retryable failure, none is lost."""
    with FakeControlPlane(hold_s=20.0) as fake:  # a take stays open until a job comes
        fake.submit({"prompt": "Hi", "stream": True, "sampling_params": LONG}, "a")
        env = {**fake.worker_env(), **WORKER_ENV, "MAX_CONCURRENCY": "8", "MODEL_NAME": tiny_llama_dir}
        proc = WorkerProcess(env, dead_at_step=4)
        try:
            fake.wait_for(lambda: fake.jobs["a"].status == "FAILED", 90, "a failed engine_dead")
            time.sleep(0.5)  # the SDK has stopped the worker after a's result by now
            fake.wait_for(lambda: fake.takes_held >= 1, 10, "a job take still held open")
            late = [fake.submit({"prompt": "after the engine died"}, f"late-{i}") for i in range(2)]
            rc = proc.wait(90)
        finally:
            proc.stop()
    assert rc == 1, proc.output[-3000:]
    assert fake.violations == []
    assert json.loads(fake.jobs["a"].error)["code"] == "engine_dead"
    for jid in late:
        job = fake.jobs[jid]
        assert job.worker == "worker-1" and job.status == "FAILED", job.status_view()  # taken, then failed coded
        err = json.loads(job.error)
        assert err["code"] in ("engine_dead", "worker_shutdown") and err["retryable"] is True, err
        assert job.stop_pod is True, jid
