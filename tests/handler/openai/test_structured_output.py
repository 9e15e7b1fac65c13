"""Structured output end to end on the tiny random model, every object and chunk validated as
the `openai` package's types: a json_schema's output parses and follows the schema, json_object
gives an object, regex and choice outputs match, on chat, completions, /v1/responses and native
jobs, whole and streamed alike; a spec the grammar engine refuses fails invalid_input naming
the field as the client sent it; an output cut at max_tokens says "length"."""
import json
import re

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from openai.types.responses.response_stream_event import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.handler.conftest import error_of, run, text_of
from tests.handler.openai.structured_checks import SEEDS, check, chunks_of, sampling, start_worker
from tests.handler.sse import parse_sse
from tests.handler.tools.test_tools_and_reasoning import completion_chunk

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 99},
    "pet": {"type": "string", "enum": ["cat", "dog", "none"]},
    "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "age", "pet", "tags"], "additionalProperties": False}
USER = [{"role": "user", "content": "Describe a person."}]
EVENTS = TypeAdapter(ResponseStreamEvent)
REGEX = r"[a-z]{2,5}-[0-9]{2}"
BAD_SCHEMA = {"type": "foo"}


@pytest.fixture(scope="module")
def worker(tiny_llama_dir, loop):
    w = start_worker(tiny_llama_dir, loop)
    yield w
    loop.run_until_complete(w.aclose())


def chat(seed=None, **fields) -> dict:
    return {"openai_route": "/v1/chat/completions", "openai_input": {
        "model": "m", "messages": USER, "max_tokens": 200, **sampling(seed), **fields}}


def completion(seed=None, **fields) -> dict:
    return {"openai_route": "/v1/completions", "openai_input": {
        "model": "m", "prompt": "Once", "max_tokens": 200, **sampling(seed), **fields}}


def responses(seed=None, **fields) -> dict:
    return {"openai_route": "/v1/responses", "openai_input": {
        "model": "m", "input": "Describe a person.", "max_output_tokens": 200, **sampling(seed), **fields}}


def chat_choice(worker, loop, job):
    out = run(loop, worker, job)
    assert out["status"] == "COMPLETED", out
    return ChatCompletion.model_validate(out["output"][0]).choices[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_json_schema_output_parses_and_follows_the_schema(worker, loop, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    choice = chat_choice(worker, loop, chat(seed, response_format=fmt))
    assert choice.finish_reason == "stop", choice
    check(PERSON, json.loads(choice.message.content))
    # the same request streamed: the chunks join to the same text
    chunks = chunks_of(run(loop, worker, chat(seed, response_format=fmt, stream=True)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("fields", [
    {"guided_json": PERSON}, {"guided_json": json.dumps(PERSON)}, {"structured_outputs": {"json": PERSON}},
    {"guided_json": PERSON, "guided_whitespace_pattern": " ?", "guided_decoding_backend": "xgrammar"},
])
def test_vllms_json_fields_follow_the_schema_too(worker, loop, fields):
    choice = chat_choice(worker, loop, chat(3, **fields))
    check(PERSON, json.loads(choice.message.content))
    if "guided_whitespace_pattern" in fields:  # between tokens: one space at most, never a newline or tab
        outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', choice.message.content)
        assert not re.search(r"[\t\r\n]|  ", outside), choice.message.content


def test_json_object_output_is_an_object(worker, loop):
    objects = []
    for seed in (None, 5, 6, 7, 10):  # seeds whose objects end within 400 tokens on this random model
        choice = chat_choice(worker, loop, chat(seed, response_format={"type": "json_object"}, max_tokens=400))
        assert choice.finish_reason == "stop", choice
        objects.append(json.loads(choice.message.content))
        assert isinstance(objects[-1], dict)
    assert any(objects)  # not only {}


@pytest.mark.parametrize("seed", SEEDS)
def test_completions_regex_and_choice_match(worker, loop, seed):
    out = run(loop, worker, completion(seed, guided_regex=REGEX))
    text = Completion.model_validate(out["output"][0]).choices[0].text
    assert re.fullmatch(REGEX, text), text
    out = run(loop, worker, completion(seed, structured_outputs={"choice": ["yes", "no", "maybe"]}))
    assert Completion.model_validate(out["output"][0]).choices[0].text in ("yes", "no", "maybe")
    out = run(loop, worker, completion(seed, guided_choice=["left", "right"], stream=True))
    chunks = [completion_chunk(c) for item in out["output"] for c in parse_sse(item)]
    assert "".join(c.choices[0].text for c in chunks) in ("left", "right")
    out = run(loop, worker, completion(seed, guided_grammar='start: "x" ("y" | "z")+ "."', max_tokens=30))
    choice = Completion.model_validate(out["output"][0]).choices[0]
    assert re.fullmatch(r"x[yz]+\.", choice.text) or choice.finish_reason == "length" and re.fullmatch(
        r"x[yz]*", choice.text), choice


def test_completions_json_schema(worker, loop):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = run(loop, worker, completion(2, response_format=fmt))
    check(PERSON, json.loads(Completion.model_validate(out["output"][0]).choices[0].text))


@pytest.mark.parametrize("key", ["structured_outputs", "guided_decoding"])
def test_native_jobs(worker, loop, key):
    sp = {"max_tokens": 200, "seed": 4, key: {"json": PERSON, "backend": "guidance"}}
    whole = run(loop, worker, {"prompt": "Describe a person.", "sampling_params": sp})
    check(PERSON, json.loads(text_of(whole)))
    assert whole["output"][-1]["finish_reason"] == "stop"
    streamed = run(loop, worker, {"prompt": "Describe a person.", "sampling_params": sp, "stream": True,
                                  "max_batch_size": 2})
    assert len(streamed["output"]) > 2 and text_of(streamed) == text_of(whole)
    out = run(loop, worker, {"prompt": "Hi", "sampling_params": {"max_tokens": 20, key: {"regex": REGEX}}})
    assert re.fullmatch(REGEX, text_of(out))


def response(worker, loop, job) -> Response:
    out = run(loop, worker, job)
    assert out["status"] == "COMPLETED", out
    return Response.model_validate(out["output"][0])


@pytest.mark.parametrize("temperature", [0, 1, 1, 1.3])  # the Responses API has no seed: sampled runs vary
def test_responses_text_format(worker, loop, temperature):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    # (300 tokens: sampled, this schema's output took 74 to 131 tokens in 60 runs)
    resp = response(worker, loop, responses(text={"format": fmt}, temperature=temperature, max_output_tokens=300))
    assert resp.status == "completed" and [o.type for o in resp.output] == ["message"]
    check(PERSON, json.loads(resp.output_text))
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "person"
    assert resp.text.format.schema_ == PERSON
    out = run(loop, worker, responses(text={"format": fmt}, temperature=temperature, max_output_tokens=300,
                                      stream=True))
    events = [EVENTS.validate_python(e) for item in out["output"] for e in parse_sse(item)]
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].response.output_text == text
    check(PERSON, json.loads(text))
    if temperature == 0:
        assert text == resp.output_text
    obj = response(worker, loop, responses(text={"format": {"type": "json_object"}}, temperature=0))
    assert obj.status == "completed" and isinstance(json.loads(obj.output_text), dict)
    assert obj.text.format.type == "json_object"


def test_a_reasoning_parser_leaves_structured_output_alone(tiny_llama_dir, loop):
    """deepseek_r1 takes a message without </think> as all reasoning; a constrained output has
    no reasoning (the grammar holds from the first token): it is the content, whole."""
    w = start_worker(tiny_llama_dir, loop, REASONING_PARSER="deepseek_r1")
    try:
        message = chat_choice(w, loop, chat(1, response_format={"type": "json_object"}, max_tokens=400)).message
        assert isinstance(json.loads(message.content), dict) and getattr(message, "reasoning_content", None) is None
        plain = chat_choice(w, loop, chat(1, max_tokens=20)).message  # and the parser still runs otherwise
        assert not plain.content and plain.reasoning_content
    finally:
        loop.run_until_complete(w.aclose())


def test_an_output_cut_short_says_length(worker, loop):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    out = run(loop, worker, chat(1, response_format=fmt, max_tokens=4))
    resp = ChatCompletion.model_validate(out["output"][0])
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 4
    with pytest.raises(ValueError):
        json.loads(resp.choices[0].message.content)
    err = error_of(run(loop, worker, {**chat(1, response_format=fmt, max_tokens=4), "on_truncation": "error"}))
    assert err["code"] == "truncated" and err["partial_text"] == resp.choices[0].message.content


@pytest.mark.parametrize("job, field", [
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}),
     "openai_input.response_format"),
    (completion(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}),
     "openai_input.response_format"),
    (chat(guided_json=BAD_SCHEMA), "openai_input.guided_json"),
    (chat(guided_regex="(unclosed"), "openai_input.guided_regex"),
    (completion(guided_grammar="start: nothing_defined"), "openai_input.guided_grammar"),
    (chat(structured_outputs={"json": BAD_SCHEMA}), "openai_input.structured_outputs"),
    (chat(stream=True, structured_outputs={"json": BAD_SCHEMA}), "openai_input.structured_outputs"),
    (responses(text={"format": {"type": "json_schema", "name": "x", "schema": BAD_SCHEMA}}),
     "openai_input.text.format"),
    ({"prompt": "Hi", "sampling_params": {"structured_outputs": {"json": BAD_SCHEMA}}},
     "sampling_params.structured_outputs"),
    ({"prompt": "Hi", "sampling_params": {"guided_decoding": {"regex": "(unclosed"}}, "stream": True},
     "sampling_params.guided_decoding"),
])
def test_a_spec_the_grammar_engine_refuses_names_the_field_as_sent(worker, loop, job, field):
    err = error_of(run(loop, worker, job))
    assert err["code"] == "invalid_input" and err["field"] == field, err
    assert err["message"].startswith(field + ": ") and "cannot be compiled" in err["message"], err


def test_a_schema_too_complex_to_enforce_is_refused_before_it_runs_naming_response_format(worker, loop):
    from tests.engine.test_structured import BRANCHY

    job = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": BRANCHY}})
    err = error_of(run(loop, worker, job))
    assert err["code"] == "invalid_input" and err["field"] == "openai_input.response_format", err
    assert "too complex to enforce" in err["message"] and "partial_text" not in err, err
