"""EMPTY_OUTPUT_RETRIES: a sampled request whose output is empty runs again with a fresh seed
before the job fails empty_output (retryable when a resubmission could sample otherwise);
greedy requests fail at once; each retry is counted in the job's finished line."""
from __future__ import annotations

import logging

import pytest

from handler.job.retry import retry_seed
from tests.handler.conftest import error_of, run, settings_for, text_of
from tests.handler.sse import parse_sse


def finished(caplog, job_id: str) -> dict:
    """The job's one finished record."""
    (record,) = [r.job_finished for r in caplog.records
                 if getattr(r, "job_id", None) == job_id and hasattr(r, "job_finished")]
    return record


@pytest.fixture(scope="module")
def shared_worker(tiny_llama_dir, loop):
    """A worker with the default EMPTY_OUTPUT_RETRIES (1): what these tests count."""
    from handler.settings import SETTINGS_BY_NAME
    from handler.worker import Worker

    w = Worker(settings_for(tiny_llama_dir, EMPTY_OUTPUT_RETRIES=SETTINGS_BY_NAME["EMPTY_OUTPUT_RETRIES"].default))
    run(loop, w, {"prompt": "hi"}, "warmup")  # the engine loads (its ending does not matter here)
    yield w
    loop.run_until_complete(w.aclose())


def always_empty(worker, **sampling) -> dict:
    """Every token is a stop token: the output is empty whatever is sampled."""
    return {"prompt": "Hi", "sampling_params": {"stop_token_ids": list(range(len(worker.engine.tokenizer))),
                                                **sampling}}


@pytest.mark.parametrize("sampling, retries, retryable", [
    ({}, 1, True),  # sampled, no seed: a resubmission samples otherwise
    ({"temperature": 0}, 0, False),  # greedy: the same again, so no retry
    ({"top_k": 1}, 0, False),  # greedy too
    ({"seed": 5}, 1, False),  # seeded: retried (with seeds derived from it), a resubmission gives the same
])
def test_an_empty_output_is_retried_only_when_sampling_could_change_it(loop, shared_worker, caplog, sampling,
                                                                        retries, retryable):
    caplog.set_level(logging.INFO, logger="handler")
    jid = f"empty-{sorted(sampling)}"
    err = error_of(run(loop, shared_worker, always_empty(shared_worker, **sampling), jid))
    assert err["code"] == "empty_output" and err["retryable"] is retryable and err["finish_reason"] == "stop"
    line = finished(caplog, jid)
    assert line["empty_output_retries"] == retries and line["code"] == "empty_output"
    one = len(shared_worker.engine.tokenizer.encode("Hi"))
    assert line["prompt_tokens"] == one * (retries + 1)  # each attempt ran in the engine
    notes = [r.getMessage() for r in caplog.records if getattr(r, "job_id", None) == jid]
    assert sum("empty output: retry" in n for n in notes) == retries


def test_the_setting_sets_the_number_of_retries(loop, make_worker, caplog):
    caplog.set_level(logging.INFO, logger="handler")
    for n in (0, 3):
        w = make_worker(EMPTY_OUTPUT_RETRIES=str(n))
        run(loop, w, {"prompt": "Hi", "sampling_params": {"max_tokens": 1, "ignore_eos": True}}, "load")
        before = w.metrics.summary().get("empty_output_retries", 0)  # the load job may have retried too
        err = error_of(run(loop, w, always_empty(w), f"n-{n}"))
        assert err["code"] == "empty_output" and err["retryable"] is True
        assert finished(caplog, f"n-{n}")["empty_output_retries"] == n
        assert w.metrics.summary().get("empty_output_retries", 0) - before == n  # the metric counts them too


SAMPLING = {"max_tokens": 3, "temperature": 1.5}
CHAT = [{"role": "user", "content": "Hi"}]


def rescue(loop, worker, request: dict, caplog) -> int:
    """A seed whose first attempt at `request` is empty and whose first retry is not: half the
    vocabulary stops, so about one seed in four (found, then fixed: seeds are deterministic)."""
    for seed in range(200):
        jid = f"search-{len(caplog.records)}"
        r = run(loop, worker, {**request, "sampling_params": {**half_stops(worker), "seed": seed}}, jid)
        if r["status"] == "COMPLETED" and finished(caplog, jid)["empty_output_retries"] == 1:
            return seed
    pytest.fail("no seed gave an empty first attempt and a retry with text")


def half_stops(worker) -> dict:
    return {**SAMPLING, "stop_token_ids": list(range(0, len(worker.engine.tokenizer), 2))}


def test_a_retry_with_a_fresh_seed_rescues_the_job(loop, shared_worker, caplog):
    caplog.set_level(logging.INFO, logger="handler")
    sampling = half_stops(shared_worker)
    seed = rescue(loop, shared_worker, {"prompt": "Hi"}, caplog)
    saved = run(loop, shared_worker, {"prompt": "Hi", "sampling_params": {**sampling, "seed": seed}}, "saved")
    assert finished(caplog, "saved")["empty_output_retries"] == 1
    # the retry's output is the derived seed's own
    direct = run(loop, shared_worker, {"prompt": "Hi", "sampling_params": {**sampling, "seed": retry_seed(seed, 1)}},
                 "direct")
    assert finished(caplog, "direct")["empty_output_retries"] == 0
    assert text_of(saved) == text_of(direct) and text_of(saved).strip()
    assert saved["output"][-1]["usage"] == direct["output"][-1]["usage"]  # the answer's usage, not the sum
    # streamed: the failed attempt left nothing in the stream
    streamed = run(loop, shared_worker, {"prompt": "Hi", "stream": True, "max_batch_size": 1,
                                         "sampling_params": {**sampling, "seed": seed}}, "saved-stream")
    assert text_of(streamed) == text_of(direct) and finished(caplog, "saved-stream")["empty_output_retries"] == 1


def test_a_rescued_openai_stream_has_one_head_chunk(loop, shared_worker, caplog):
    caplog.set_level(logging.INFO, logger="handler")
    seed = rescue(loop, shared_worker, {"messages": CHAT}, caplog)
    sampling = half_stops(shared_worker)
    r = run(loop, shared_worker, {"openai_route": "/v1/chat/completions", "openai_input": {
        "messages": CHAT, "stream": True, **sampling, "seed": seed}}, "saved-chat")
    assert r["status"] == "COMPLETED", r
    chunks = [c for item in r["output"] for c in parse_sse(item)]
    assert sum("role" in c["choices"][0]["delta"] for c in chunks) == 1
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks).strip()
    assert finished(caplog, "saved-chat")["empty_output_retries"] == 1


def test_retry_seeds_are_fresh_and_follow_a_given_seed():
    assert retry_seed(5, 1) == retry_seed(5, 1) != retry_seed(5, 2) != 5
    assert all(0 <= retry_seed(s, a) < 2**63 for s in (0, 2**63 - 1) for a in (1, 2, 10))
    assert retry_seed(None, 1) != retry_seed(None, 1)  # no seed given: a random one each time


def test_a_retry_reseeds_any_request_with_params():
    """EngineRequest or a request still to be processed (a prompt with its SamplingParams): the
    retry replaces its params' seed and keeps everything else."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from engine import SamplingParams
    from engine.input_processor import EngineRequest
    from handler.errors import JobError
    from handler.job.requests import Completion
    from handler.job.retry import EmptyOutputRetry

    @dataclass(slots=True)
    class Pending:
        prompt: str
        params: SamplingParams

    def empty(run):
        raise JobError("empty_output", "nothing")

    ctx = SimpleNamespace(empty_output_retries=0, log=logging.getLogger("handler.test"))
    run_ = SimpleNamespace(settings=SimpleNamespace(empty_output_retries=2), ctx=ctx, check=empty)
    comp = Completion("", "stop", 2, 1, 0, {})
    for request in (EngineRequest("Hi", [5, 6], SamplingParams(max_tokens=4, seed=9), 4),
                    Pending("Hi" * 5000, SamplingParams(max_tokens=4, seed=9))):
        retry = EmptyOutputRetry(run_, request, "job-1")
        assert retry.request is request and retry.request_id == "job-1"
        assert retry.again(comp, streamed=False) and retry.request_id == "job-1:retry1"
        assert type(retry.request) is type(request) and retry.request.prompt == request.prompt
        assert retry.request.params.seed == retry_seed(9, 1) and retry.request.params.max_tokens == 4
        assert retry.again(comp, streamed=False) and retry.request.params.seed == retry_seed(9, 2)
        with pytest.raises(JobError) as info:
            retry.again(comp, streamed=False)
        assert info.value.retryable is False and "3 attempts" in info.value.message  # seeded: the same again
    assert ctx.empty_output_retries == 4
    with pytest.raises(JobError):  # some text already streamed: no retry
        EmptyOutputRetry(run_, request, "job-2").again(comp, streamed=True)


def choices_of(result: dict) -> list[dict]:
    assert result["status"] == "COMPLETED", result
    return result["output"][-1]["choices"]


def test_every_choice_of_n_has_text_an_empty_one_is_resampled(loop, make_worker, caplog):
    """n = 8 with half the vocabulary stopping: about half the choices come out empty at first.
    Each returned choice has text (the empty ones sampled again, with seeds derived from the
    job's), or the job fails empty_output naming the empty choices; never COMPLETED with one empty."""
    caplog.set_level(logging.INFO, logger="handler")
    w = make_worker(EMPTY_OUTPUT_RETRIES="8")
    run(loop, w, {"prompt": "Hi", "sampling_params": {"max_tokens": 1, "ignore_eos": True}}, "load")
    job = {"prompt": "Hi", "sampling_params": {**half_stops(w), "n": 8, "seed": 11}}
    r = run(loop, w, job, "n8")
    assert all(c["text"].strip() for c in choices_of(r)), choices_of(r)
    assert [c["index"] for c in choices_of(r)] == list(range(8))
    assert finished(caplog, "n8")["empty_output_retries"] >= 1  # some choice was empty at first
    assert r["output"][-1]["usage"]["completion_tokens"] >= 8  # the returned choices' tokens
    again = run(loop, w, job, "n8-again")  # a seeded job: the same choices again
    assert [c["text"] for c in choices_of(again)] == [c["text"] for c in choices_of(r)]

    none = make_worker(EMPTY_OUTPUT_RETRIES="0")
    run(loop, none, {"prompt": "Hi", "sampling_params": {"max_tokens": 1, "ignore_eos": True}}, "load")
    for seed in range(20):
        r = run(loop, none, {"prompt": "Hi", "sampling_params": {**half_stops(none), "n": 8, "seed": seed}},
                f"n8-none-{seed}")
        if r["status"] == "COMPLETED":
            assert all(c["text"].strip() for c in choices_of(r)), choices_of(r)
            continue
        err = error_of(r)
        assert err["code"] == "empty_output" and err["empty_choices"] and "of 8 choices" in err["message"], err
        break
    else:
        pytest.fail("no seed gave an empty choice among 8")


def test_an_openai_choice_among_n_is_never_empty(loop, make_worker):
    w = make_worker(EMPTY_OUTPUT_RETRIES="8")
    run(loop, w, {"prompt": "Hi", "sampling_params": {"max_tokens": 1, "ignore_eos": True}}, "load")
    sampling = half_stops(w)
    r = run(loop, w, {"openai_route": "/v1/completions", "openai_input": {
        "prompt": "Hi", "n": 6, "seed": 4, "max_tokens": sampling["max_tokens"], "temperature": 1.5,
        "stop_token_ids": sampling["stop_token_ids"]}}, "openai-n")
    assert r["status"] == "COMPLETED", r
    choices = r["output"][-1]["choices"]
    assert len(choices) == 6 and all(c["text"].strip() for c in choices), choices


def test_an_empty_raw_prompt_to_a_chat_model_says_to_send_messages(loop, shared_worker):
    """worker-vllm's Hub test job sends a raw `prompt` to an instruct model, whose first token is
    then often its end token: the failure tells the user what to do."""
    err = error_of(run(loop, shared_worker, always_empty(shared_worker, temperature=0), "raw-empty"))
    assert err["code"] == "empty_output" and "chat template" in err["message"], err
    assert '"apply_chat_template": true' in err["message"] and "messages" in err["message"]
    chat = {"messages": CHAT, "sampling_params": always_empty(shared_worker, temperature=0)["sampling_params"]}
    err = error_of(run(loop, shared_worker, chat, "chat-empty"))
    assert err["code"] == "empty_output" and "apply_chat_template" not in err["message"]
    completions = {"openai_route": "/v1/completions", "openai_input": {
        "prompt": "Hi", "temperature": 0, "stop_token_ids": list(range(len(shared_worker.engine.tokenizer)))}}
    err = error_of(run(loop, shared_worker, completions, "completions-empty"))
    assert "/v1/chat/completions" in err["message"], err
