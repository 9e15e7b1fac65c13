"""Input limits (MAX_INPUT_CHARS, MAX_MESSAGES, MAX_OUTPUT_TOKENS, MAX_STOP_STRINGS, MAX_STOP_CHARS,
MAX_STOP_TOKEN_IDS): at the limit a job runs, one past it fails invalid_input naming the field, the
limit and its setting, before the engine sees it."""
import json

import pytest

from handler.errors import JobError
from handler.job_input import parse_job_input
from handler.setting_error import SettingsError
from handler.settings import load_settings
from tests.handler.conftest import error_of, run

SMALL = load_settings({"MAX_INPUT_CHARS": "40", "MAX_MESSAGES": "3", "MAX_OUTPUT_TOKENS": "100",
                       "MAX_STOP_STRINGS": "3", "MAX_STOP_CHARS": "12", "MAX_STOP_TOKEN_IDS": "4"})


def msgs(n: int, content: str = "hi") -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": content} for i in range(n)]


def refusal(job_input: dict, settings=SMALL) -> dict:
    with pytest.raises(JobError) as info:
        parse_job_input(job_input, settings)
    err = info.value.to_dict()
    assert err["code"] == "invalid_input" and err["retryable"] is False
    return err


# (input at the limit, input one past it, field, setting)
CASES = {
    "prompt": ({"prompt": "x" * 40}, {"prompt": "x" * 41}, "prompt", "MAX_INPUT_CHARS"),
    "token ids": ({"prompt": [5] * 40}, {"prompt": [5] * 41}, "prompt", "MAX_INPUT_CHARS"),
    "template": ({"prompt": "x" * 40, "apply_chat_template": True},
                 {"prompt": "x" * 41, "apply_chat_template": True}, "prompt", "MAX_INPUT_CHARS"),
    "message chars": ({"messages": msgs(2, "x" * 20)}, {"messages": msgs(2, "x" * 20) + msgs(1, "y")},
                      "messages", "MAX_INPUT_CHARS"),
    "content parts": ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40}]}]},
                      {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 20},
                                                                 {"type": "text", "text": "x" * 20}]}]},
                      "messages", "MAX_INPUT_CHARS"),  # parts are joined with a newline: 41
    "messages": ({"messages": msgs(3)}, {"messages": msgs(4)}, "messages", "MAX_MESSAGES"),
    "openai messages": (
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": msgs(3)}},
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": msgs(4)}},
        "openai_input.messages", "MAX_MESSAGES"),
    "openai prompt": ({"openai_route": "/v1/completions", "openai_input": {"prompt": "x" * 40}},
                      {"openai_route": "/v1/completions", "openai_input": {"prompt": "x" * 41}},
                      "openai_input.prompt", "MAX_INPUT_CHARS"),
    "summarize": ({"summarize": "x" * 40}, {"summarize": "x" * 41}, "summarize.text", "MAX_INPUT_CHARS"),
    "max_tokens": ({"prompt": "Hi", "sampling_params": {"max_tokens": 100}},
                   {"prompt": "Hi", "sampling_params": {"max_tokens": 101}},
                   "sampling_params.max_tokens", "MAX_OUTPUT_TOKENS"),
    "openai max_tokens": (
        {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "max_tokens": 100}},
        {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "max_tokens": 101}},
        "openai_input.max_tokens", "MAX_OUTPUT_TOKENS"),
    "openai max_completion_tokens": (
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": msgs(1), "max_completion_tokens": 100}},
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": msgs(1), "max_completion_tokens": 101}},
        "openai_input.max_completion_tokens", "MAX_OUTPUT_TOKENS"),
    "summarize max_tokens": ({"summarize": {"text": "doc", "max_tokens": 100}},
                             {"summarize": {"text": "doc", "max_tokens": 101}}, "summarize.max_tokens",
                             "MAX_OUTPUT_TOKENS"),
    "stop strings": ({"prompt": "Hi", "sampling_params": {"stop": ["a", "b", "c"]}},
                     {"prompt": "Hi", "sampling_params": {"stop": ["a", "b", "c", "d"]}},
                     "sampling_params.stop", "MAX_STOP_STRINGS"),
    "stop characters": ({"prompt": "Hi", "sampling_params": {"stop": ["abcdef", "ghijkl"]}},
                        {"prompt": "Hi", "sampling_params": {"stop": ["abcdef", "ghijklm"]}},
                        "sampling_params.stop", "MAX_STOP_CHARS"),
    "one stop string": ({"prompt": "Hi", "sampling_params": {"stop": "x" * 12}},
                        {"prompt": "Hi", "sampling_params": {"stop": "x" * 13}}, "sampling_params.stop",
                        "MAX_STOP_CHARS"),
    "stop token ids": ({"prompt": "Hi", "sampling_params": {"stop_token_ids": [1, 2, 3, 4]}},
                       {"prompt": "Hi", "sampling_params": {"stop_token_ids": [1, 2, 3, 4, 5]}},
                       "sampling_params.stop_token_ids", "MAX_STOP_TOKEN_IDS"),
    "openai stop": ({"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "stop": ["a", "b", "c"]}},
                    {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "stop": list("abcd")}},
                    "openai_input.stop", "MAX_STOP_STRINGS"),
    "openai stop characters": (
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": msgs(1), "stop": "y" * 12}},
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": msgs(1), "stop": "y" * 13}},
        "openai_input.stop", "MAX_STOP_CHARS"),
    "openai stop token ids": (
        {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "stop_token_ids": [1, 2, 3, 4]}},
        {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "stop_token_ids": [1, 2, 3, 4, 5]}},
        "openai_input.stop_token_ids", "MAX_STOP_TOKEN_IDS"),
    "summarize stop": ({"summarize": "doc", "sampling_params": {"stop": ["a", "b", "c"]}},
                       {"summarize": "doc", "sampling_params": {"stop": list("abcd")}},
                       "sampling_params.stop", "MAX_STOP_STRINGS"),
}


@pytest.mark.parametrize("case", CASES)
def test_at_the_limit_runs_one_past_fails_naming_field_and_limit(case):
    ok, over, field, setting = CASES[case]
    parse_job_input(ok, SMALL)
    err = refusal(over)
    limit = getattr(SMALL, setting.lower())
    assert err["field"] == field and err["limit"] == limit and err["setting"] == setting
    assert err["message"].startswith(f"{field}: ") and setting in err["message"]
    assert f"at most {limit:,}" in err["message"]


def test_the_defaults_are_caps_too():
    s = load_settings({})
    assert (s.max_input_chars, s.max_messages, s.max_output_tokens) == (1_000_000, 1000, 32768)
    parse_job_input({"prompt": "x" * s.max_input_chars, "sampling_params": {"max_tokens": s.max_output_tokens}}, s)
    assert refusal({"prompt": "x" * (s.max_input_chars + 1)}, s)["field"] == "prompt"
    assert refusal({"messages": msgs(s.max_messages + 1)}, s)["setting"] == "MAX_MESSAGES"
    assert refusal({"prompt": "x", "sampling_params": {"max_tokens": s.max_output_tokens + 1}}, s)["limit"] == 32768


def test_the_stop_list_caps_default_to_what_real_clients_send():
    """OpenAI allows 4 stop strings; lists of a few dozen (and a few hundred special-token ids) are
    common. At the defaults a stop list costs no other job anything (tests/hardening)."""
    s = load_settings({})
    assert (s.max_stop_strings, s.max_stop_chars, s.max_stop_token_ids) == (256, 16384, 1024)
    stops = [f"{i:064d}" for i in range(256)]  # 16,384 characters
    parse_job_input({"prompt": "x", "sampling_params": {"stop": stops, "stop_token_ids": list(range(1024))}}, s)
    assert refusal({"prompt": "x", "sampling_params": {"stop": stops + ["z"]}}, s)["setting"] == "MAX_STOP_STRINGS"
    assert refusal({"prompt": "x", "sampling_params": {"stop": stops[:-1] + ["z" * 65]}}, s)["limit"] == 16384
    assert refusal({"prompt": "x", "sampling_params": {"stop_token_ids": list(range(1025))}}, s)["limit"] == 1024
    # a million ids is refused by its count, not after a walk over every id
    assert refusal({"prompt": "x", "sampling_params": {"stop_token_ids": list(range(10**6))}}, s)["field"] == (
        "sampling_params.stop_token_ids")


def test_a_job_over_a_limit_fails_before_the_engine_runs(loop, make_worker):
    w = make_worker(MAX_INPUT_CHARS=30, MAX_OUTPUT_TOKENS=5, DEFAULT_MAX_TOKENS=12)
    assert run(loop, w, {"prompt": "warm up", "sampling_params": {"max_tokens": 2}})["status"] == "COMPLETED"
    steps = w.engine.stats()["num_steps"]
    err = error_of(run(loop, w, {"prompt": "fox " * 8}))
    assert err["code"] == "invalid_input" and err["field"] == "prompt" and err["limit"] == 30
    err = error_of(run(loop, w, {"prompt": "Hi", "sampling_params": {"max_tokens": 6}}))
    assert err["field"] == "sampling_params.max_tokens" and "MAX_OUTPUT_TOKENS" in err["message"]
    assert w.engine.stats()["num_steps"] == steps  # refused before any engine step
    # no max_tokens: DEFAULT_MAX_TOKENS (12) capped by MAX_OUTPUT_TOKENS (5)
    r = run(loop, w, {"prompt": "Hi", "sampling_params": {"ignore_eos": True}})
    assert r["output"][-1]["usage"]["completion_tokens"] == 5 and r["output"][-1]["truncated"] is True


def _chat(messages, **extra) -> dict:
    return {"openai_route": "/v1/chat/completions", "openai_input": {"messages": messages, **extra}}


def _tool(description: str) -> dict:
    return {"type": "function", "function": {"name": "f", "description": description,
                                             "parameters": {"type": "object"}}}


def _called(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]


def test_tool_definitions_tool_calls_and_bad_words_count_toward_the_input_cap():
    """Every field a client sizes counts toward MAX_INPUT_CHARS, not message text alone: the tool
    definitions and calls by their JSON's strings and keys (the tool below: 56 + its description)."""
    cap = load_settings({"MAX_INPUT_CHARS": "100"})
    parse_job_input(_chat(msgs(1), tools=[_tool("x" * 42)]), cap)  # 2 + 56 + 42
    err = refusal(_chat(msgs(1), tools=[_tool("x" * 43)]), cap)
    assert err["field"] == "openai_input.tools" and err["setting"] == "MAX_INPUT_CHARS" and err["limit"] == 100
    assert "101 characters of the input together (99 in openai_input.tools)" in err["message"]
    parse_job_input(_chat(_called('{"a": "xy"}')), cap)
    err = refusal(_chat(_called(json.dumps({"a": "x" * 100}))), cap)
    assert err["field"] == "openai_input.messages[1].tool_calls" and err["setting"] == "MAX_INPUT_CHARS"
    parse_job_input({"prompt": "Hi", "sampling_params": {"bad_words": ["abc", "def"]}}, SMALL)
    err = refusal({"prompt": "Hi", "sampling_params": {"bad_words": ["x" * 50]}})
    assert err["field"] == "sampling_params.bad_words" and err["setting"] == "MAX_INPUT_CHARS"
    err = refusal({"prompt": "x" * 30, "sampling_params": {"bad_words": ["y" * 11]}})  # 41 together
    assert err["setting"] == "MAX_INPUT_CHARS" and err["limit"] == 40


def test_bad_words_have_a_cap_of_their_own():
    s = load_settings({"MAX_BAD_WORDS": "3"})
    parse_job_input({"prompt": "Hi", "sampling_params": {"bad_words": ["a", "b", "c"]}}, s)
    err = refusal({"prompt": "Hi", "sampling_params": {"bad_words": ["a", "b", "c", "d"]}}, s)
    assert err["field"] == "sampling_params.bad_words" and err["setting"] == "MAX_BAD_WORDS" and err["limit"] == 3
    assert load_settings({}).max_bad_words == 256
    err = refusal({"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "bad_words": ["w"] * 257}},
                  load_settings({}))
    assert err["field"] == "openai_input.bad_words" and err["setting"] == "MAX_BAD_WORDS"


def test_tool_call_arguments_nested_deep_are_invalid_input_not_an_internal_error():
    deep = "[" * 5000 + "]" * 5000
    for arguments in ('{"a": ' + deep + "}", '{"a": ' + "[" * 40 + "]" * 40 + "}"):
        err = refusal(_chat(_called(arguments)), load_settings({}))
        assert err["field"] == "openai_input.messages[1].tool_calls[0].function.arguments", err
        assert "deeper than" in err["message"]


def test_a_jobs_choices_have_a_cap():
    """MAX_CHOICES (32 unless set, 128 at most: the engine's limit) caps n, or best_of when given."""
    s = load_settings({})
    assert s.max_choices == 32
    parse_job_input({"prompt": "Hi", "sampling_params": {"n": 32, "max_tokens": 4}}, s)
    err = refusal({"prompt": "Hi", "sampling_params": {"n": 33, "max_tokens": 4}}, s)
    assert err["field"] == "sampling_params.n" and err["setting"] == "MAX_CHOICES" and err["limit"] == 32, err
    err = refusal({"prompt": "Hi", "sampling_params": {"n": 2, "best_of": 40}}, s)
    assert err["field"] == "sampling_params.best_of" and "40 choices" in err["message"], err
    err = refusal({"openai_route": "/v1/chat/completions", "openai_input": {
        "messages": [{"role": "user", "content": "Hi"}], "n": 64}}, s)
    assert err["field"] == "openai_input.n" and err["setting"] == "MAX_CHOICES", err
    raised = load_settings({"MAX_CHOICES": "128"})
    parse_job_input({"prompt": "Hi", "sampling_params": {"n": 128, "max_tokens": 4}}, raised)
    with pytest.raises(SettingsError, match="MAX_CHOICES"):
        load_settings({"MAX_CHOICES": "129"})


def test_a_jobs_output_tokens_across_its_choices_have_a_cap():
    s = load_settings({"MAX_JOB_TOKENS": "100", "MAX_CHOICES": "128"})
    parse_job_input({"prompt": "Hi", "sampling_params": {"n": 4, "max_tokens": 25}}, s)
    err = refusal({"prompt": "Hi", "sampling_params": {"n": 4, "max_tokens": 26}}, s)
    assert err["field"] == "sampling_params.n" and err["setting"] == "MAX_JOB_TOKENS" and err["limit"] == 100
    err = refusal({"prompt": "Hi", "sampling_params": {"n": 2, "best_of": 5, "max_tokens": 21}}, s)
    assert err["field"] == "sampling_params.best_of", err
    err = refusal({"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", "n": 128, "max_tokens": 8}}, s)
    assert err["field"] == "openai_input.n" and "128 choices" in err["message"]
    assert load_settings({}).max_job_tokens == 65536


def test_a_jobs_response_size_has_a_cap_estimated_before_it_runs():
    s = load_settings({"MAX_RESPONSE_MB": "0.01"})  # 10,485 bytes
    parse_job_input({"prompt": "Hi", "sampling_params": {"max_tokens": 100}}, s)  # 1,600 bytes of text
    err = refusal({"prompt": "Hi", "sampling_params": {"max_tokens": 10, "logprobs": 20}}, s)
    assert err["field"] == "sampling_params.logprobs" and err["setting"] == "MAX_RESPONSE_MB", err
    err = refusal(_chat(msgs(1), logprobs=True, top_logprobs=20, max_tokens=10), s)
    assert err["field"] == "openai_input.top_logprobs", err
    err = refusal({"prompt": "Hi", "sampling_params": {"n": 8, "max_tokens": 100}}, s)
    assert err["field"] == "sampling_params.n" and err["setting"] == "MAX_RESPONSE_MB", err
    err = refusal({"openai_route": "/v1/completions", "openai_input": {"prompt": "x" * 3000, "echo": True, "n": 2,
                                                                      "max_tokens": 1}}, s)
    assert err["setting"] == "MAX_RESPONSE_MB", err  # the echoed prompt, once a choice
    assert load_settings({}).max_response_mb == 16


def test_a_job_without_max_tokens_gets_what_its_cost_caps_allow(loop, make_worker):
    w = make_worker(MAX_JOB_TOKENS=12, DEFAULT_MAX_TOKENS=12)
    r = run(loop, w, {"prompt": "Hi", "sampling_params": {"n": 4, "ignore_eos": True, "temperature": 1.0, "seed": 3}})
    assert r["status"] == "COMPLETED", r
    last = r["output"][-1]
    assert last["usage"]["completion_tokens"] == 12 and all(c["finish_reason"] == "length" for c in last["choices"])
