"""The handler on the real engine (tiny random Llama, CPU), consumed as the runpod
SDK consumes it: outputs, the failure contract code by code, OOM, cancellation,
the shared lazy load, request_id results and the concurrency modifier."""
import asyncio
import inspect
import json
import subprocess
import sys
import time

import pytest

from handler.engine_setup import build_engine
from handler.worker import Worker
from tests.handler.conftest import assert_free, error_of, run, settings_for, text_of
from tests.handler.sse import parse_sse

GREEDY = {"temperature": 0}
SURE = {"sampling_params": {"ignore_eos": True}}  # random weights may sample EOS first: empty_output


def test_importing_handler_loads_nothing():
    code = ("import sys, handler, handler.settings, handler.job.schema, handler.errors, handler.summarize.core, "
            "handler.worker; print(sorted(m for m in ('torch', 'engine.llm_engine', 'runpod', 'transformers') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_sdk_hooks(make_worker):
    w = make_worker()
    cfg = w.runpod_config()
    assert inspect.isasyncgenfunction(cfg["handler"]) and cfg["return_aggregate_stream"] is True
    assert cfg["concurrency_modifier"](1) == w.settings.max_concurrency  # before the load: take jobs to share it


def test_prompt_job_gives_one_item_with_everything(loop, shared_worker):
    r = run(loop, shared_worker, {"prompt": "The quick brown fox", "sampling_params": {**GREEDY, "max_tokens": 5,
                                                                                       "ignore_eos": True}})
    assert r["status"] == "COMPLETED" and len(r["output"]) == 1
    item = r["output"][0]
    assert item["text"].strip() and item["finish_reason"] == "length" and item["truncated"] is True
    assert item["usage"]["completion_tokens"] == 5 and item["usage"]["prompt_tokens"] > 0
    assert {"queue_s", "first_token_s", "total_s"} <= set(item["timings"])
    assert item["timings"]["first_token_s"] <= item["timings"]["total_s"]
    assert_free(shared_worker)


@pytest.mark.parametrize("job_input", [
    {"prompt": "Meeting notes: the team discussed"},
    {"prompt": "회의록: 오늘 회의에서 예산과 일정"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "감사합니다! What is"}]},
])
def test_streamed_items_join_to_the_unstreamed_text(loop, shared_worker, job_input):
    sp = {**GREEDY, "max_tokens": 10, "ignore_eos": True}
    whole = run(loop, shared_worker, {**job_input, "sampling_params": sp})
    streamed = run(loop, shared_worker, {**job_input, "sampling_params": sp, "stream": True, "max_batch_size": 2,
                                         "min_batch_size": 1})
    assert len(streamed["output"]) > 2
    assert text_of(streamed) == text_of(whole) == whole["output"][0]["text"]
    last = streamed["output"][-1]
    usage = whole["output"][0]["usage"]
    assert last["finish_reason"] == "length"
    assert (last["usage"]["prompt_tokens"], last["usage"]["completion_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])
    assert all(set(i) == {"text"} for i in streamed["output"][:-1])


def test_missing_max_tokens_is_what_fits_capped_by_the_setting(loop, shared_worker):
    r = run(loop, shared_worker, {"prompt": "Hi", "sampling_params": {"ignore_eos": True}})
    assert r["output"][0]["usage"]["completion_tokens"] == 12  # DEFAULT_MAX_TOKENS, never 16
    long_prompt = list(range(5, 250))  # 245 tokens of a 256-token context: 11 fit
    r = run(loop, shared_worker, {"prompt": long_prompt, "sampling_params": {"ignore_eos": True}})
    item = r["output"][0]
    assert item["usage"]["completion_tokens"] == 11 and item["truncated"] is True


def test_openai_routes_give_openai_objects(loop, shared_worker):
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    oi = {"model": "x", "messages": msgs, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = run(loop, shared_worker, {"openai_route": "/v1/chat/completions", "openai_input": oi})
    resp = r["output"][0]
    assert resp["object"] == "chat.completion" and resp["usage"]["completion_tokens"] == 6
    content = resp["choices"][0]["message"]["content"]
    r = run(loop, shared_worker, {"openai_route": "/v1/chat/completions", "openai_input": {
        **oi, "stream": True, "stream_options": {"include_usage": True}}, "max_batch_size": 2})
    chunks = [c for item in r["output"] for c in parse_sse(item)]
    assert r["output"][-1].endswith("data: [DONE]\n\n")
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == content
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 6
    r = run(loop, shared_worker, {"openai_route": "/v1/completions", "openai_input": {
        "prompt": "Once", "max_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert r["output"][0]["object"] == "text_completion" and r["output"][0]["choices"][0]["text"]
    r = run(loop, shared_worker, {"openai_route": "/v1/models"})
    assert r["output"][0]["data"][0]["id"] == shared_worker.settings.model_name


# -- the failure contract, code by code ------------------------------------------------------
def test_invalid_input_names_the_field(loop, shared_worker):
    err = error_of(run(loop, shared_worker, {"prompt": "x", "sampling_params": {"top_k": -5}}))
    assert err["code"] == "invalid_input" and err["field"] == "sampling_params.top_k"
    err = error_of(run(loop, shared_worker, {"messages": [{"role": "user", "content": "x"}],
                                             "sampling_params": {"stop_token_ids": [-1]}}))
    assert err["field"] == "sampling_params.stop_token_ids"
    err = error_of(run(loop, shared_worker, {"prompt": [5, 10**6, 7, 10**7]}))
    assert err["code"] == "invalid_input" and "vocabulary" in err["message"]
    assert err["field"] == "prompt" and "1000000" in err["message"] and "10000000" in err["message"]
    err = error_of(run(loop, shared_worker, {"openai_route": "/v1/completions",
                                             "openai_input": {"prompt": [5, 10**6]}}))
    assert err["field"] == "openai_input.prompt" and "vocabulary" in err["message"]


def test_prompt_too_long_gives_both_numbers(loop, shared_worker):
    err = error_of(run(loop, shared_worker, {"prompt": "fox " * 400}))
    assert err["code"] == "prompt_too_long" and err["max_model_len"] == 256 and err["prompt_tokens"] >= 256
    assert str(err["prompt_tokens"]) in err["message"] and "256" in err["message"]


def test_kv_capacity(loop, make_worker):
    w = make_worker(NUM_KV_BLOCKS=8)  # 128 KV slots, a 256-token context
    err = error_of(run(loop, w, {"prompt": "Hi", "sampling_params": {"max_tokens": 200}}))
    assert err["code"] == "kv_capacity" and err["capacity_tokens"] == 128 and err["needed_tokens"] > 128
    r = run(loop, w, {"prompt": "Hi", "sampling_params": {"ignore_eos": True}})  # the default fits the cache
    assert r["status"] == "COMPLETED"


def test_truncated_under_both_policies(loop, shared_worker):
    job = {"prompt": "Action items:", "sampling_params": {**GREEDY, "max_tokens": 3, "ignore_eos": True}}
    flagged = run(loop, shared_worker, job)
    assert flagged["output"][-1]["truncated"] is True and flagged["output"][-1]["finish_reason"] == "length"
    err = error_of(run(loop, shared_worker, {**job, "on_truncation": "error", "stream": True}))
    assert err["code"] == "truncated" and err["partial_text"] == text_of(flagged)
    assert err["usage"]["completion_tokens"] == 3 and err["retryable"] is False


def test_empty_output_is_never_success(loop, shared_worker):
    vocab = len(shared_worker.engine.tokenizer)
    err = error_of(run(loop, shared_worker, {"prompt": "Hi", "sampling_params": {
        "stop_token_ids": list(range(vocab))}}))
    assert err["code"] == "empty_output" and err["finish_reason"] == "stop" and "partial_text" not in err
    assert_free(shared_worker)


def test_timeout_keeps_the_partial_text(loop, shared_worker):
    err = error_of(run(loop, shared_worker, {"prompt": "Hi", "timeout_s": 0.3, "stream": True,
                                             "sampling_params": {"max_tokens": 240, "ignore_eos": True}}))
    assert err["code"] == "timeout" and err["retryable"] is True and err["timeout_s"] == 0.3
    assert err.get("partial_text", "x")  # when text came, it is there
    assert_free(shared_worker)


def test_out_of_memory_fails_only_its_job(loop, make_worker):
    sp = {**GREEDY, "max_tokens": 8, "ignore_eos": True}
    prompts = {"oom-a": "The quick brown fox", "oom-b": "Meeting notes: the team", "oom-c": "회의록: 오늘 회의에서"}

    def run_all(w):
        async def main():
            from handler.local import run_job
            return await asyncio.gather(*(run_job(w.handle, {"id": jid, "input": {"prompt": p, "sampling_params": sp}})
                                          for jid, p in prompts.items()))
        return dict(zip(prompts, loop.run_until_complete(main())))

    clean = run_all(make_worker())
    faulty_worker = make_worker(FAULT_INJECTION=json.dumps({"oom_at_step": 3, "oom_request_id": "oom-b"}))
    faulty = run_all(faulty_worker)
    err = error_of(faulty["oom-b"])
    assert err["code"] == "out_of_memory" and err["retryable"] is True and err["partial_text"]
    assert text_of(clean["oom-b"]).startswith(err["partial_text"])
    for jid in ("oom-a", "oom-c"):
        assert faulty[jid]["status"] == "COMPLETED"
        assert text_of(faulty[jid]) == text_of(clean[jid])
    assert_free(faulty_worker)
    assert run(loop, faulty_worker, {"prompt": "still up", **SURE})["status"] == "COMPLETED"  # the engine stays up


def test_engine_dead_fails_the_job_and_asks_for_a_new_worker(loop, make_worker):
    w = make_worker()
    cfg = w.runpod_config()
    assert run(loop, w, {"prompt": "Hi", **SURE})["status"] == "COMPLETED"

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    w.engine.engine.runner.execute = broken
    err = error_of(run(loop, w, {"prompt": "Hi", "stream": True}))
    assert err["code"] == "engine_dead"
    assert cfg["refresh_worker"] is True  # the SDK adds stopPod and stops taking jobs
    t0 = time.monotonic()
    assert error_of(run(loop, w, {"prompt": "again"}, "job-2"))["code"] == "engine_dead"
    assert time.monotonic() - t0 < 1


def test_model_load_failed_shared_by_the_jobs_waiting(loop, tiny_llama_dir):
    calls = []

    def factory(settings, on_progress=None):
        calls.append(1)
        return build_engine(settings, on_progress)

    w = Worker(settings_for("/nonexistent/model-dir"), engine_factory=factory)
    cfg = w.runpod_config()

    async def main():
        from handler.local import run_job
        return await asyncio.gather(*(run_job(w.handle, {"id": f"j{i}", "input": {"prompt": "Hi"}})
                                      for i in range(3)))

    results = loop.run_until_complete(main())
    for r in results:
        err = error_of(r)
        assert err["code"] == "model_load_failed" and "/nonexistent/model-dir" in err["message"]
    assert error_of(run(loop, w, {"prompt": "later"}))["code"] == "model_load_failed"
    assert len(calls) == 1 and cfg["refresh_worker"] is True


def test_jobs_arriving_during_the_load_wait_for_that_one_load(loop, tiny_llama_dir):
    calls, progress = [], []

    def slow_factory(settings, on_progress):
        calls.append(1)
        on_progress("preparing")
        time.sleep(0.5)
        return build_engine(settings, on_progress)

    w = Worker(settings_for(tiny_llama_dir, LOAD_PROGRESS_INTERVAL_S="0.1"), engine_factory=slow_factory,
               progress=lambda job, p: progress.append((job["id"], p["status"], p.get("stage"))))

    async def main():
        from handler.local import run_job
        return await asyncio.gather(*(run_job(w.handle, {"id": f"j{i}", "input": {"prompt": "Hi", **SURE}})
                                      for i in range(4)))

    results = loop.run_until_complete(main())
    assert all(r["status"] == "COMPLETED" for r in results) and len(calls) == 1
    assert {jid for jid, _, _ in progress} == {"j0", "j1", "j2", "j3"}
    assert all(s == "loading model" for _, s, _ in progress) and len(progress) >= 8
    assert progress[-1][2] == "preparing"  # the preparation's steps reach the waiting jobs
    assert all(r["output"][-1]["timings"]["model_load_wait_s"] > 0.3 for r in results)
    loop.run_until_complete(w.aclose())


def test_cancellation_aborts_the_request_and_frees_its_blocks(loop, shared_worker):
    async def main():
        first = asyncio.Event()
        items = []

        async def consume():
            async for item in shared_worker.handle({"id": "stop-me", "input": {
                    "prompt": "Hi", "stream": True, "max_batch_size": 1,
                    "sampling_params": {"max_tokens": 240, "ignore_eos": True}}}):
                items.append(item)
                first.set()

        task = asyncio.ensure_future(consume())
        await first.wait()
        assert shared_worker.engine.stats()["num_running"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return items

    items = loop.run_until_complete(main())
    assert items and "finish_reason" not in items[-1]
    assert_free(shared_worker)
    assert shared_worker.engine.stats()["num_streams"] == 0 and shared_worker.in_flight == 0


def test_abort_from_the_engine_side_is_cancelled(loop, make_worker):
    w = make_worker()
    assert run(loop, w, {"prompt": "Hi", **SURE})["status"] == "COMPLETED"

    async def main():
        from handler.local import run_job
        job = asyncio.ensure_future(run_job(w.handle, {"id": "ab-1", "input": {
            "prompt": "Hi", "sampling_params": {"max_tokens": 240, "ignore_eos": True}}}))
        while not w.engine.stats()["num_running"]:
            await asyncio.sleep(0.005)
        await w.engine.abort("ab-1")
        return await asyncio.wait_for(job, 5)

    err = error_of(loop.run_until_complete(main()))
    assert err["code"] == "cancelled" and err["retryable"] is False
    assert_free(w)


def test_request_id_returns_the_stored_result_or_refuses_other_input(loop, shared_worker):
    job = {"prompt": "The quick brown fox", "request_id": "rid-1", "sampling_params": {"max_tokens": 6,
                                                                                        "ignore_eos": True}}
    first = run(loop, shared_worker, job, "job-a")
    steps = shared_worker.engine.stats()["num_steps"]
    again = run(loop, shared_worker, job, "job-b")
    assert shared_worker.engine.stats()["num_steps"] == steps  # nothing recomputed
    assert text_of(again) == text_of(first) and again["output"][-1]["cached"] is True
    err = error_of(run(loop, shared_worker, {**job, "prompt": "another"}, "job-c"))
    assert err["code"] == "invalid_input" and err["field"] == "request_id"


def test_concurrency_follows_the_free_kv_blocks(loop, make_worker):
    w = make_worker(MAX_CONCURRENCY=30, JOB_KV_TOKENS=64)
    assert w.concurrency_modifier(1) == 30  # not loaded yet
    run(loop, w, {"prompt": "Hi"})
    assert w.concurrency_modifier(30) == 16  # 64 free blocks, 4 per job
    w = make_worker(MAX_CONCURRENCY=30)  # JOB_KV_TOKENS=0: a full 256-token context each
    run(loop, w, {"prompt": "Hi"})
    assert w.concurrency_modifier(30) == 4
    w = make_worker(MAX_CONCURRENCY=3, JOB_KV_TOKENS=64)
    run(loop, w, {"prompt": "Hi"})
    assert w.concurrency_modifier(1) == 3

    class Busy:  # the engine short of blocks while jobs run: drop, so the SDK takes no more
        max_model_len, kv_capacity_tokens, max_request_tokens, request_kv_tokens = 256, 1024, 256, 256

        def stats(self):
            return {"kv_blocks_free": 4, "kv_blocks_total": 64, "kv_block_size": 16, "num_waiting": 2,
                    "num_running": 5}

    w.loader.engine, w.in_flight = Busy(), 5
    w.settings = settings_for("x", MAX_CONCURRENCY=30, JOB_KV_TOKENS=64)
    assert w.concurrency_modifier(16) == 6


def test_summarize_maps_and_reduces_a_long_document(loop, make_worker):
    w = make_worker(MAX_MODEL_LEN=512, NUM_KV_BLOCKS=256)
    doc = " ".join(["Meeting notes: the team discussed the budget, the roadmap and hiring plans.",
                    "Action items: Alice sends the report on Friday; Bob reviews the contract."] * 40)
    r = run(loop, w, {"summarize": {"text": doc, "max_tokens": 8}, "stream": True, "max_batch_size": 2})
    assert r["status"] == "COMPLETED", r
    last = r["output"][-1]
    assert last["summarize"]["chunks"] >= 3 and last["summarize"]["rounds"] >= 1
    assert last["usage"]["prompt_tokens"] > len(w.engine.tokenizer.encode(doc))  # map calls counted
    assert text_of(r).strip()
    assert_free(w)
    short = run(loop, w, {"summarize": "Alice sends the report on Friday."})
    assert short["status"] in ("COMPLETED", "FAILED")
    if short["status"] == "COMPLETED":
        assert short["output"][-1]["summarize"] == {"chunks": 1, "rounds": 0, "truncated_parts": 0}


def test_no_model_name_serves_the_default_model_prepared_lazily(loop, tiny_llama_dir, monkeypatch, tmp_path):
    import types

    import handler.prepare

    calls = []
    fake = types.ModuleType("handler.prepare.default_model")
    fake.ensure_default_model = lambda base_path=None, on_progress=None: calls.append(base_path) or tiny_llama_dir
    fake.SUMMARIZE_SAMPLING = {"temperature": 0.0, "repetition_penalty": 1.3, "max_tokens": 5}
    fake.chat_template = lambda: "{{ messages[0]['content'] }}!"  # the default model's own template
    monkeypatch.setitem(sys.modules, "handler.prepare.default_model", fake)
    monkeypatch.setattr(handler.prepare, "default_model", fake, raising=False)
    settings = settings_for("", BASE_PATH=str(tmp_path))
    assert settings.model_name is None
    w = Worker(settings)
    assert calls == []  # nothing prepared before the first job
    r = run(loop, w, {"openai_route": "/v1/models"})
    assert r["output"][0]["data"][0]["id"] == "SmolLM2-135M-Instruct-AWQ" and calls == []
    assert run(loop, w, {"prompt": "Hi", **SURE})["status"] == "COMPLETED"
    assert calls == [str(tmp_path)]
    assert w.engine.tokenizer.chat_template == "{{ messages[0]['content'] }}!"
    from handler.summarize.job import summary_defaults
    assert summary_defaults(settings) == fake.SUMMARIZE_SAMPLING  # its tuned summarize sampling
    loop.run_until_complete(w.aclose())


def test_metrics_are_served_for_prometheus(loop, shared_worker):
    import socket
    import urllib.request

    run(loop, shared_worker, {"prompt": "Hi"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shared_worker.metrics.start_server(port)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'worker_jobs_total{code="ok",status="completed"}' in body and "worker_kv_blocks_free" in body
    summary = shared_worker.metrics.summary()
    assert summary["jobs"]["completed"] >= 1 and summary["tokens"]["completion"] > 0
