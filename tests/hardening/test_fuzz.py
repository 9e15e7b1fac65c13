"""Fuzzing the job input with hypothesis through the worker's handler entry (the whole path:
schema, result cache, engine, streaming, errors), on the tiny model: wrong types, huge and
negative numbers, unknown fields, deep nesting, enormous strings, unpaired surrogates (a JSON
`\\ud800` escape: invalid UTF-8), every sampling parameter at and past its bounds. Each case
either runs (COMPLETED with text, or a contract failure of a valid job) or fails invalid_input
naming a field it has; none crashes, hangs or kills the engine. CI: 400 cases; HARDENING_FULL=1: 2,000."""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handler.job.fields import field_name
from handler.job.sampling import SAMPLING_NOOP
from handler.job.schema import TOP_LEVEL_KEYS
from handler.job_input import parse_job_input
from handler.local import run_job
from handler.settings import load_settings
from tests.hardening.conftest import FULL, size
from tests.hardening.outcomes import error_object, output_text

CASES = size(400, 2000)
CASE_TIMEOUT_S = 30.0
ENV = {"MAX_MODEL_LEN": "64", "NUM_KV_BLOCKS": "40", "BLOCK_SIZE": "16", "DEFAULT_MAX_TOKENS": "8",
       "DEFAULT_BATCH_SIZE": "4", "METRICS_LOG_INTERVAL_S": "0", "LOG_LEVEL": "error"}
# the codes a valid job may end with besides COMPLETED (the failure contract)
RAN = {"prompt_too_long", "kv_capacity", "empty_output", "truncated", "timeout"}
NAN, INF = float("nan"), float("inf")

SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udc80", "\ud83d", "\udbff\u0041"])
SHORT_TEXT = st.text(max_size=24)
TEXT = st.one_of(
    SHORT_TEXT, SHORT_TEXT, SHORT_TEXT,
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=6), SURROGATES, st.text(max_size=6)),
    st.integers(1_000, 120_000).map(lambda n: ("meeting notes " * (n // 14 + 1))[:n]),  # enormous
)
BIG = [0, -1, 1, 2**31, -(2**31), 2**63 - 1, 2**63, 2**64, -(2**63), 10**30, 10**400, -(10**400)]
INTS = st.one_of(st.integers(-5, 80), st.sampled_from(BIG))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, -0.0, 5e-324, 1e-308, 1e308, 1.0, 2.0, -2.0, 2.0000001, NAN, INF, -INF]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)
JSON = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=8)


def nest(depth: int, kind: str):
    value: object = "x"
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


DEEP = st.builds(nest, st.integers(20, 3000), st.sampled_from(["list", "dict"]))
ANY = st.one_of(JSON, JSON, JSON, DEEP)

# every sampling parameter at its bounds, just past them, and of the wrong type
BOUNDS = {
    "max_tokens": [1, 2, 8, 63, 64, 0, -1, 10**6, 2**63, 10**400, 1.5, "8"],
    "min_tokens": [0, 1, 8, 63, -1, 10**6, 2**63, 0.5],
    "temperature": [0, 0.0, 5e-324, 1e-308, 1e-3, 0.7, 1, 2, 100, 1e308, -1e-9, NAN, INF, 10**400, "hot"],
    "top_p": [1, 1.0, 5e-324, 1e-9, 0.5, 0, -0.0, 1.0000001, -1, NAN],
    "top_k": [-1, 0, 1, 2, 399, 400, 401, 2**31, 2**63, -2, 1.0],
    "min_p": [0, 0.0, 1, 1.0, 0.5, 5e-324, -1e-9, 1.0000001, NAN],
    "repetition_penalty": [1, 5e-324, 1e-308, 0.01, 2, 1e308, 0, -1, INF],
    "presence_penalty": [-2, -2.0, 2, 2.0, 0, -2.0000001, 2.0000001, 10**400],
    "frequency_penalty": [-2, 2, 0.5, -2.0000001, 2.0000001, NAN],
    "seed": [0, 1, 2**63 - 1, 2**63, -1, 2**64, 1.5, "1"],
    "stop": [[], ["a"], "a", [""], ["x" * 1000], [" "], ["\n"] * 50, [None], "e", ["\ud800"], [1]],
    "stop_token_ids": [[], [0], [1], [2], [399], [400], [2**63], [2**64], [-1], list(range(400)), [1.5], "2"],
    "ignore_eos": [True, False, 1, "true", None],
    "skip_special_tokens": [True, False, 0],
    "include_stop_str_in_output": [True, False, "no"],
    **{k: [v, 2, True, "x"] for k, v in SAMPLING_NOOP.items()},
}
SAMPLING = st.dictionaries(
    st.sampled_from(sorted(BOUNDS)) | st.sampled_from(["foo", "maxTokens", "logit_bias"]),
    st.one_of(*[st.sampled_from(v) for v in BOUNDS.values()], ANY), max_size=6,
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "bot", ""]) | ANY},
    optional={"content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)
              | ANY})
OPENAI_INPUT = st.fixed_dictionaries({}, optional={
    "messages": st.lists(MESSAGE, max_size=3) | ANY, "prompt": TEXT | st.lists(INTS, max_size=4) | ANY,
    "max_tokens": st.sampled_from(BOUNDS["max_tokens"]) | ANY, "temperature": st.sampled_from(BOUNDS["temperature"]),
    "stream": st.booleans() | ANY, "stream_options": st.just({"include_usage": True}) | ANY,
    "n": st.sampled_from([1, 2]), "logprobs": st.sampled_from([False, True, 0]), "echo": st.booleans(),
    "stop": st.sampled_from(BOUNDS["stop"]), "top_k": st.sampled_from(BOUNDS["top_k"]), "model": TEXT | ANY,
    "unknown_option": ANY,
})
FIELDS = {
    "prompt": TEXT | st.lists(st.integers(-2, 500) | st.sampled_from(BIG), max_size=6) | ANY,
    "messages": st.lists(MESSAGE, max_size=3) | ANY,
    "sampling_params": SAMPLING | SAMPLING | ANY,
    "stream": st.booleans() | ANY, "apply_chat_template": st.booleans() | ANY,
    "use_openai_format": st.booleans() | ANY,
    "max_batch_size": INTS | FLOATS, "min_batch_size": INTS | FLOATS, "batch_size_growth_factor": FLOATS | INTS,
    "openai_route": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/models", "/v2/x"]) | ANY,
    "openai_input": OPENAI_INPUT | ANY,
    "summarize": TEXT | st.fixed_dictionaries({"text": TEXT}, optional={"max_tokens": INTS, "x": ANY}) | ANY,
    "on_truncation": st.sampled_from(["flag", "error", "drop"]) | ANY,
    "request_id": st.sampled_from(["r1", "r2", "", "x" * 300]) | TEXT | ANY,
    "priority": INTS | FLOATS | ANY, "timeout_s": FLOATS | INTS | ANY,
    "cache_salt": TEXT | ANY, "tenant": TEXT | ANY,
}
UNKNOWN = st.text(min_size=1, max_size=10).filter(lambda k: k not in TOP_LEVEL_KEYS) | SURROGATES
# the values of each sampling parameter that are in bounds (its bounds included)
IN_BOUNDS = {
    "max_tokens": [1, 2, 8, 63, 64, 10**6], "min_tokens": [0, 1, 2],
    "temperature": [0, 5e-324, 1e-3, 0.7, 1, 100, 1e308], "top_p": [1, 5e-324, 0.5],
    "top_k": [-1, 0, 1, 399, 400, 2**63], "min_p": [0, 1, 0.5, 5e-324],
    "repetition_penalty": [1, 5e-324, 0.01, 2, 1e308], "presence_penalty": [-2, 2, 0], "frequency_penalty": [-2, 2, 0.5],
    "seed": [0, 2**63 - 1], "stop": [[], ["a"], "e", ["x" * 1000], ["\n"] * 50],
    "stop_token_ids": [[], [0], [2], [399], [400], [2**64], list(range(400))], "ignore_eos": [True, False],
    "skip_special_tokens": [True, False], "include_stop_str_in_output": [True, False], **SAMPLING_NOOP,
}
SAMPLING_OK = st.fixed_dictionaries({}, optional={k: st.sampled_from(v if isinstance(v, list) else [v])
                                                  for k, v in IN_BOUNDS.items()})
PROMPT_OK = st.text(min_size=1, max_size=30).filter(str.strip) | st.sampled_from(["Hi", "Meeting notes:", "회의록"])
VALID = st.one_of(  # well-formed jobs, parameters at their bounds, so that many cases really run
    st.fixed_dictionaries({"prompt": PROMPT_OK | TEXT}, optional={
        "sampling_params": SAMPLING_OK, "stream": st.booleans(), "max_batch_size": st.integers(1, 5),
        "priority": st.integers(-3, 3), "on_truncation": st.sampled_from(["flag", "error"]),
        "request_id": st.sampled_from(["r1", "r2", "r3"]), "timeout_s": st.sampled_from([5e-324, 0.001, 30])}),
    st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "system", "assistant"]), "content": PROMPT_OK}), min_size=1, max_size=3)},
        optional={"sampling_params": SAMPLING_OK, "stream": st.booleans()}),
    st.fixed_dictionaries({"openai_route": st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
                           "openai_input": st.fixed_dictionaries({
                               "messages": st.just([{"role": "user", "content": "Hi"}]), "prompt": PROMPT_OK},
                               optional={"max_tokens": st.sampled_from([1, 8, 64]), "stream": st.booleans(),
                                         "temperature": st.sampled_from([0, 1]),
                                         "stop": st.sampled_from(IN_BOUNDS["stop"])})}),
)
JOB_INPUT = st.one_of(
    VALID, VALID, VALID,
    st.fixed_dictionaries({}, optional=FIELDS),
    st.fixed_dictionaries({}, optional=FIELDS).flatmap(
        lambda d: st.dictionaries(UNKNOWN, ANY, min_size=1, max_size=2).map(lambda u: {**d, **u})),
    ANY,
)


def features(job_input) -> set[str]:
    """What a case holds of the hostile kinds (for the figures: the fuzzing reached them)."""
    found, stack = set(), [(job_input, 0)]
    if not isinstance(job_input, dict):
        found.add("not_an_object")
    elif set(job_input) - TOP_LEVEL_KEYS:
        found.add("unknown_field")
    if isinstance(job_input, dict) and isinstance(job_input.get("sampling_params"), dict):
        found.add("sampling_params")
    while stack:
        v, depth = stack.pop()
        if depth > 32:
            found.add("deep_nesting")
            continue
        if isinstance(v, str):
            found |= {"enormous_string"} if len(v) >= 1000 else set()
            found |= {"unpaired_surrogate"} if any("\ud800" <= c <= "\udfff" for c in v[:64]) else set()
        elif isinstance(v, bool):
            continue
        elif isinstance(v, int) and not -(2**63) <= v < 2**63:
            found.add("huge_int")
        elif isinstance(v, int) and v < 0:
            found.add("negative_number")
        elif isinstance(v, float) and v != v or v in (INF, -INF):
            found.add("nan_or_inf")
        elif isinstance(v, dict):
            stack.extend((x, depth + 1) for x in [*v.values(), *v.keys()])
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
    return found


def check_case(job_input, result: dict) -> str:
    """The failure contract on one case; returns its outcome."""
    if result["status"] == "COMPLETED":
        text = output_text(result["output"])
        assert text is not None and text.strip(), result
        return "completed"
    assert result["status"] == "FAILED", result
    err = error_object(result.get("error"))
    assert err is not None, result  # a JSON object with code, message and retryable
    assert err["code"] != "internal_error" and err["code"] != "engine_dead", err
    if err["code"] != "invalid_input":
        assert err["code"] in RAN, err
        parse_job_input(job_input, load_settings(ENV))  # it ran: the schema took the job
        return err["code"]
    field = err.get("field")
    assert isinstance(field, str) and field, err
    assert field in err["message"], err
    keys = {field_name(k) or '""' for k in job_input} if isinstance(job_input, dict) else {"input"}
    # a field of the input, or a known field it lacks (e.g. openai_input for an openai_route); the
    # engine calls a token-id prompt prompt_token_ids
    names = keys | TOP_LEVEL_KEYS | ({"prompt_token_ids"} if "prompt" in keys else set())
    assert any(field == k or field.startswith((k + ".", k + "[")) for k in names), (field, keys)
    return "invalid_input"


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    from handler.worker import Worker

    loop = asyncio.new_event_loop()
    w = Worker(load_settings({**ENV, "MODEL_NAME": tiny_llama_dir}))
    loop.run_until_complete(run_job(w.handle, {"id": "warmup", "input": {"prompt": "hi"}}))
    yield w, loop
    loop.run_until_complete(w.aclose())
    loop.close()


@pytest.mark.slow
def test_fuzzed_job_inputs_run_or_fail_invalid_input_naming_the_field(worker, figures):
    w, loop = worker
    ids = itertools.count()
    seen: Counter = Counter()
    kinds: Counter = Counter()
    slowest = [0.0]

    @settings(max_examples=CASES, deadline=None, derandomize=not FULL, database=None,
              suppress_health_check=list(HealthCheck))
    @given(JOB_INPUT)
    def case(job_input):
        job = {"id": f"fuzz-{next(ids)}", "input": job_input}
        t = time.monotonic()
        result = loop.run_until_complete(asyncio.wait_for(run_job(w.handle, job), CASE_TIMEOUT_S))
        slowest[0] = max(slowest[0], time.monotonic() - t)
        assert not w.engine.is_dead, job_input
        seen[check_case(job_input, result)] += 1
        kinds.update(features(job_input))
        json.dumps(result, ensure_ascii=False).encode("utf-8")  # what the SDK posts must encode

    t0 = time.monotonic()
    case()
    wall = time.monotonic() - t0
    stats = w.engine.stats()
    figures.set("fuzz", cases=sum(seen.values()), wall_s=round(wall, 1), slowest_case_s=round(slowest[0], 2),
                outcomes=dict(sorted(seen.items())), cases_with=dict(sorted(kinds.items())),
                kv_blocks_not_free=stats["kv_blocks_total"] - stats["kv_blocks_free"])
    assert sum(seen.values()) >= CASES * 0.9
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["num_streams"] == 0, stats
    assert seen["completed"] > CASES // 10 and seen["invalid_input"] > CASES // 10, seen  # both paths ran


@pytest.mark.parametrize("job_input,field", [  # what the fuzzing found (each crashed or killed the engine)
    ({"prompt": "hi", "timeout_s": 10**400}, "timeout_s"),
    ({"prompt": "hi", "sampling_params": {"temperature": 10**400}}, "sampling_params.temperature"),
    ({"openai_route": "/v1/chat/completions",
      "openai_input": {"messages": [{"role": "user", "content": "hi"}], "temperature": 10**400}},
     "openai_input.temperature"),
    ({"prompt": "hi\ud800"}, "prompt"), ({"prompt": "hi", "request_id": "a\udc80"}, "request_id"),
    ({"prompt": "hi", "sampling_params": {"stop": ["\ud800"]}}, "sampling_params.stop[0]"),
    ({"messages": [{"role": "user", "content": "x\ud800"}]}, "messages[0].content"),
    ({"prompt": "hi", "\ud800": 1}, "\\ud800"),
    ({"prompt": "hi", "sampling_params": {"stop": nest(5000, "list")}}, "sampling_params.stop"),
    ({"prompt": nest(5000, "dict")}, "prompt"),
])
def test_inputs_that_broke_the_worker_fail_invalid_input_naming_the_field(worker, job_input, field):
    w, loop = worker
    result = loop.run_until_complete(run_job(w.handle, {"id": "found", "input": job_input}))
    err = error_object(result.get("error"))
    assert err and err["code"] == "invalid_input" and err["field"].startswith(field), result
    json.dumps(result, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("job_input", [
    {"prompt": "hi", "sampling_params": {"stop_token_ids": [10**6], "min_tokens": 2, "max_tokens": 4}},  # past vocab
    {"prompt": "hi", "sampling_params": {"stop_token_ids": [2**64], "min_tokens": 2, "max_tokens": 4}},  # past int64
    {"prompt": "hi", "stream": True, "max_batch_size": 10**400, "sampling_params": {"max_tokens": 3}},  # float overflow
])
def test_values_that_crashed_the_job_or_killed_the_engine_now_run(worker, job_input):
    w, loop = worker
    result = loop.run_until_complete(run_job(w.handle, {"id": "found", "input": job_input}))
    assert check_case(job_input, result) in {"completed", "empty_output"}, result
    assert not w.engine.is_dead
