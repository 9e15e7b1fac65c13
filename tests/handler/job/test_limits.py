"""Input limits (MAX_INPUT_CHARS, MAX_MESSAGES, MAX_OUTPUT_TOKENS): at the limit a job runs, one
past it fails invalid_input naming the field, the limit and its setting, before the engine sees it."""
import pytest

from handler.errors import JobError
from handler.job.schema import parse_job_input
from handler.settings import load_settings
from tests.handler.conftest import error_of, run

SMALL = load_settings({"MAX_INPUT_CHARS": "40", "MAX_MESSAGES": "3", "MAX_OUTPUT_TOKENS": "100"})


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
