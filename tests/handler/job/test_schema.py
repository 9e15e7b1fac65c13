"""Job input parsing: worker-vllm's shapes run unchanged, ours are checked, and
every refusal is invalid_input naming the field."""
import json

import pytest

from handler.errors import JobError, error_item
from handler.job.schema import JobSpec
from handler.job_input import parse_job_input
from handler.settings import load_settings

S = load_settings({})


def refused(job_input) -> dict:
    with pytest.raises(JobError) as info:
        parse_job_input(job_input, S)
    assert info.value.code == "invalid_input"
    return info.value.to_dict()


def test_worker_vllm_prompt_shape():
    spec = parse_job_input({"prompt": "Hi", "sampling_params": {"max_tokens": 5, "temperature": 0, "n": 1},
                            "stream": True, "max_batch_size": 8, "min_batch_size": 2,
                            "batch_size_growth_factor": 2}, S)
    assert spec.route == "generate" and spec.prompt == "Hi" and spec.stream
    assert spec.sampling == {"max_tokens": 5, "temperature": 0, "n": 1}
    sizes = spec.batching.sizes()
    assert [next(sizes) for _ in range(5)] == [2, 4, 8, 8, 8]


def test_worker_vllm_messages_and_apply_chat_template():
    spec = parse_job_input({"messages": [{"role": "developer", "content": "be brief"},
                                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}]}, S)
    assert spec.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"}]
    spec = parse_job_input({"prompt": "Hi", "apply_chat_template": True}, S)
    assert spec.prompt is None and spec.messages == [{"role": "user", "content": "Hi"}]
    spec = parse_job_input({"messages": [{"role": "user", "content": "x"}], "use_openai_format": True}, S)
    assert spec.route == "/v1/chat/completions"


def test_max_tokens_stays_unset_when_missing():
    assert "max_tokens" not in parse_job_input({"prompt": "Hi"}, S).sampling


def test_openai_routes():
    spec = parse_job_input({"openai_route": "/v1/chat/completions", "openai_input": {
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7,
        "stop": "END", "stream": True, "stream_options": {"include_usage": True}, "user": "u", "n": 1}}, S)
    assert spec.route == "/v1/chat/completions" and spec.stream and spec.include_usage
    assert spec.sampling == {"max_tokens": 7, "stop": ["END"], "n": 1}
    assert spec.notes == []
    spec = parse_job_input({"openai_route": "/v1/completions", "openai_input": {"prompt": ["Once"]}}, S)
    assert spec.prompt == "Once" and not spec.stream
    assert parse_job_input({"openai_route": "/v1/models"}, S).route == "/v1/models"


def test_our_keys():
    spec = parse_job_input({"summarize": "A long text.", "on_truncation": "error", "request_id": "r-1",
                            "priority": -2, "timeout_s": 3, "cache_salt": "tenant-a"}, S)
    assert spec.route == "summarize" and spec.summarize.text == "A long text."
    assert (spec.on_truncation, spec.idempotency_key, spec.priority, spec.timeout_s) == ("error", "r-1", -2, 3.0)
    assert spec.cache_salt.startswith("salt:") and "tenant-a" not in spec.cache_salt  # hashed, in its own namespace


def test_fingerprint_ignores_request_id_only():
    a = parse_job_input({"prompt": "Hi", "request_id": "a"}, S).fingerprint
    assert a == parse_job_input({"request_id": "b", "prompt": "Hi"}, S).fingerprint
    assert a != parse_job_input({"prompt": "Hi", "stream": True}, S).fingerprint


@pytest.mark.parametrize("job_input,field", [
    ("just a string", "input"),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "messages"),
    ({"prompt": "a", "max_token": 5}, "max_token"),
    ({"prompt": "a", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"prompt": "a", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"prompt": "a", "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
    ({"prompt": "a", "sampling_params": {"n": 3, "best_of": 2}}, "sampling_params.best_of"),
    ({"prompt": "a", "sampling_params": {"logit_bias": {"1": 101}}}, "sampling_params.logit_bias"),
    ({"prompt": "a", "sampling_params": "hot"}, "sampling_params"),
    ({"prompt": "a", "stream": "yes"}, "stream"),
    ({"prompt": "a", "on_truncation": "ignore"}, "on_truncation"),
    ({"prompt": "a", "priority": 1.5}, "priority"),
    ({"prompt": "a", "timeout_s": 0}, "timeout_s"),
    ({"prompt": "a", "request_id": ""}, "request_id"),
    ({"prompt": "a", "max_batch_size": 0}, "max_batch_size"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ({"summarize": {"text": "x", "style": "short"}}, "summarize.style"),
    ({"summarize": "  "}, "summarize.text"),
    ({"openai_route": "/v1/embeddings", "openai_input": {}}, "openai_route"),
    ({"openai_route": "/v1/chat/completions", "openai_input": {}}, "openai_input.messages"),
    ({"openai_route": "/v1/chat/completions", "prompt": "x", "openai_input": {}}, "prompt"),
    ({"openai_route": "/v1/chat/completions", "openai_input": {"messages": [{"role": "user", "content": "x"}],
                                                               "n": 0}}, "openai_input.n"),
    ({"openai_route": "/v1/chat/completions", "openai_input": {"messages": [{"role": "user", "content": "x"}],
                                                               "tools": [{"type": "function"}]}}, "openai_input.tools[0].function"),
    ({"openai_route": "/v1/chat/completions", "openai_input": {"messages": [{"role": "user", "content": "x"}],
                                                               "frobnicate": 3}}, "openai_input.frobnicate"),
    ({"openai_route": "/v1/completions", "openai_input": {"prompt": ["a", "b"]}}, "openai_input.prompt"),
    ({"openai_route": "/v1/completions", "openai_input": {"prompt": "a", "temperature": "hot"}},
     "openai_input.temperature"),
])
def test_refusals_name_the_field(job_input, field):
    err = refused(job_input)
    assert err["field"] == field, err
    assert err["retryable"] is False and field in err["message"]


def test_error_item_is_a_json_string_the_sdk_passes_through():
    item = error_item(JobError("timeout", "too slow", partial_text="Hel"))
    assert str(item["error"]) == item["error"]  # what rp_job does to it
    assert json.loads(item["error"]) == {"code": "timeout", "message": "too slow", "retryable": True,
                                         "partial_text": "Hel"}


def test_engine_errors_map_onto_job_errors():
    from engine.errors import KVCapacityError, OutOfMemoryError, PromptTooLongError

    err = JobError.from_exception(PromptTooLongError(600, 512)).to_dict()
    assert err["code"] == "prompt_too_long" and err["prompt_tokens"] == 600 and err["max_model_len"] == 512
    err = JobError.from_exception(KVCapacityError(900, 800)).to_dict()
    assert (err["code"], err["needed_tokens"], err["capacity_tokens"]) == ("kv_capacity", 900, 800)
    assert JobError.from_exception(OutOfMemoryError("oom", partial_text="ab")).to_dict()["retryable"] is True
    assert JobError.from_exception(RuntimeError("boom")).code == "internal_error"


def test_spec_defaults():
    spec = JobSpec(route="generate")
    assert spec.on_truncation == "flag" and spec.priority == 0 and not spec.stream


@pytest.mark.parametrize("job_input,engine_field,job_field", [
    ({"prompt": "Hi"}, "temperature", "sampling_params.temperature"),
    ({"prompt": [5, 6]}, "prompt_token_ids", "prompt"),
    ({"prompt": "Hi"}, None, "sampling_params"),
    ({"messages": [{"role": "user", "content": "Hi"}]}, "messages[0]", "messages[0]"),
    ({"prompt": "Hi", "apply_chat_template": True}, "messages", "prompt"),
    ({"messages": [{"role": "user", "content": "Hi"}], "use_openai_format": True}, "min_tokens",
     "sampling_params.min_tokens"),
    ({"openai_route": "/v1/completions", "openai_input": {"prompt": [5]}}, "prompt_token_ids", "openai_input.prompt"),
    ({"openai_route": "/v1/chat/completions", "openai_input": {"messages": [{"role": "user", "content": "x"}]}},
     "messages", "openai_input.messages"),
    ({"openai_route": "/v1/completions", "openai_input": {"prompt": "x"}}, "min_tokens", "openai_input.min_tokens"),
    ({"openai_route": "/v1/completions", "openai_input": {"prompt": "x"}}, None, "openai_input"),
    ({"summarize": "A text."}, "messages", "summarize.text"),
    ({"summarize": "A text."}, "top_p", "sampling_params.top_p"),
])
def test_engine_fields_map_to_the_jobs_own(job_input, engine_field, job_field):
    """An engine error names its own field (prompt_token_ids, messages, a sampling name);
    the job's error names where the job gave it."""
    assert parse_job_input(job_input, S).field(engine_field) == job_field
