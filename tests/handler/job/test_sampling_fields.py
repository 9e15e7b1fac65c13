"""Every sampling value a job gives is type-checked and any refusal names the field as the job
sent it: under sampling_params, or under openai_input with OpenAI's names (max_completion_tokens);
a string "false" is never taken as true, a dict never as a list, 1.0 or true never as 1."""
import pytest

from handler.errors import JobError
from handler.job_input import parse_job_input
from handler.settings import load_settings
from tests.handler.conftest import error_of, run, text_of

S = load_settings({})

WRONG = [  # (field, a value of the wrong type or range)
    ("max_tokens", "10"), ("max_tokens", 2.5), ("max_tokens", True), ("max_tokens", -1), ("min_tokens", "1"),
    ("min_tokens", 1.0), ("temperature", "0.5"), ("temperature", True), ("temperature", [0]), ("top_p", "1"),
    ("top_k", 2.5), ("top_k", False), ("min_p", []), ("repetition_penalty", {}), ("presence_penalty", "0"),
    ("frequency_penalty", False), ("seed", 1.5), ("seed", "7"), ("seed", True),
    ("stop", 5), ("stop", {"a": 1}), ("stop", ["a", 5]), ("stop", [""]), ("stop", True), ("stop", ""),
    ("stop", [["a"]]), ("stop_token_ids", 5), ("stop_token_ids", [1.5]), ("stop_token_ids", "12"),
    ("stop_token_ids", [True]), ("stop_token_ids", {"1": 2}), ("stop_token_ids", [-1]),
    ("ignore_eos", "false"), ("ignore_eos", 0), ("skip_special_tokens", "no"), ("skip_special_tokens", 1),
    ("include_stop_str_in_output", "false"), ("include_stop_str_in_output", 0),
]


def refused(job_input) -> dict:
    with pytest.raises(JobError) as info:
        parse_job_input(job_input, S)
    err = info.value.to_dict()
    assert err["code"] == "invalid_input" and err["retryable"] is False, err
    return err


@pytest.mark.parametrize("field,value", WRONG)
def test_native_sampling_params_name_the_field(field, value):
    err = refused({"prompt": "Hi", "sampling_params": {field: value}})
    assert err["field"] == f"sampling_params.{field}", err
    assert err["message"].startswith(f"sampling_params.{field}: "), err
    assert "object is not" not in err["message"]  # a Python error is not a message


@pytest.mark.parametrize("field,value", WRONG)
def test_openai_input_names_the_field(field, value):
    for route, body in (("/v1/completions", {"prompt": "Hi"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        err = refused({"openai_route": route, "openai_input": {**body, field: value}})
        assert err["field"] == f"openai_input.{field}", err
        assert err["message"].startswith(f"openai_input.{field}: "), err


@pytest.mark.parametrize("value", ["10", 2.5, True, -1, 0])
def test_max_completion_tokens_is_named_as_sent(value):
    err = refused({"openai_route": "/v1/chat/completions", "openai_input": {
        "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": value}})
    assert err["field"] == "openai_input.max_completion_tokens", err
    assert "max_tokens" not in err["message"].removeprefix("openai_input.max_completion_tokens"), err


def test_max_completion_tokens_wins_over_max_tokens_as_in_vllm():
    """Both given: max_completion_tokens is the one used (vLLM, OpenAI), in either order, and a
    refusal of it (a bad value, over MAX_OUTPUT_TOKENS) names it."""
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    for oi in ({**chat, "max_tokens": 9, "max_completion_tokens": 5}, {**chat, "max_completion_tokens": 5,
                                                                       "max_tokens": 9}):
        spec = parse_job_input({"openai_route": "/v1/chat/completions", "openai_input": oi}, S)
        assert spec.sampling["max_tokens"] == 5
    for oi in ({**chat, "max_tokens": 9, "max_completion_tokens": -5}, {**chat, "max_completion_tokens": 10**6,
                                                                        "max_tokens": 9}):
        assert refused({"openai_route": "/v1/chat/completions", "openai_input": oi})["field"] == (
            "openai_input.max_completion_tokens")
    err = refused({"openai_route": "/v1/chat/completions", "openai_input": {**chat, "max_tokens": 10**6}})
    assert err["field"] == "openai_input.max_tokens" and err["setting"] == "MAX_OUTPUT_TOKENS"


@pytest.mark.parametrize("key,value", [("n", True), ("n", 1.0), ("best_of", True), ("use_beam_search", 0),
                                       ("n", "1")])
def test_no_op_values_are_type_checked_too(key, value):
    """n: true is not n: 1, use_beam_search: 0 is not false."""
    assert refused({"prompt": "Hi", "sampling_params": {key: value}})["field"] == f"sampling_params.{key}"
    if key in ("n", "best_of"):
        err = refused({"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", key: value}})
        assert err["field"] == f"openai_input.{key}"


def test_right_types_pass_as_given():
    spec = parse_job_input({"prompt": "Hi", "sampling_params": {
        "max_tokens": 5, "temperature": 0, "top_p": 1, "stop": "END", "stop_token_ids": [7],
        "skip_special_tokens": False, "include_stop_str_in_output": True, "n": 1, "use_beam_search": False}}, S)
    assert spec.sampling == {"max_tokens": 5, "temperature": 0, "top_p": 1, "stop": "END", "stop_token_ids": [7],
                             "skip_special_tokens": False, "include_stop_str_in_output": True, "n": 1}


@pytest.mark.parametrize("field,value", [("skip_special_tokens", "no"), ("include_stop_str_in_output", "false"),
                                         ("stop", {"a": 1}), ("stop", 5)])
def test_through_the_worker_a_wrong_type_is_invalid_input_never_internal_error(loop, shared_worker, field, value):
    err = error_of(run(loop, shared_worker, {"prompt": "Hi", "sampling_params": {field: value}}))
    assert err["code"] == "invalid_input" and err["field"] == f"sampling_params.{field}", err
    oi = {"prompt": "Hi", field: value}
    err = error_of(run(loop, shared_worker, {"openai_route": "/v1/completions", "openai_input": oi}))
    assert err["code"] == "invalid_input" and err["field"] == f"openai_input.{field}", err


def test_through_the_worker_skip_special_tokens_false_runs(loop, shared_worker):
    r = run(loop, shared_worker, {"prompt": "Hi", "sampling_params": {
        "skip_special_tokens": False, "include_stop_str_in_output": False, "max_tokens": 4, "ignore_eos": True}})
    assert text_of(r)
