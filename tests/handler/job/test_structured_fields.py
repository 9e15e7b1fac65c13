"""Structured output as jobs ask for it, read into the engine's structured_outputs at parse
time: OpenAI's response_format, vLLM's structured_outputs and guided_* (chat and completions),
native sampling_params' structured_outputs / guided_decoding, the Responses API's text.format,
and a forced tool_choice's schema (vLLM's shape). Each refusal is invalid_input naming the
field as the client sent it; a second source is refused naming the second."""
import pytest

from handler.errors import JobError
from handler.job_input import parse_job_input
from handler.settings import load_settings

S = load_settings({})
USER = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"],
    "$defs": {"city": {"type": "string", "enum": ["Paris", "Seoul"]}}}}}
TIME = {"type": "function", "function": {"name": "time"}}  # no parameters: it takes none


def chat(**fields) -> dict:
    return {"openai_route": "/v1/chat/completions", "openai_input": {"messages": USER, **fields}}


def completion(**fields) -> dict:
    return {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hi", **fields}}


def responses(**fields) -> dict:
    return {"openai_route": "/v1/responses", "openai_input": {"input": "Hi", **fields}}


def refused(job_input) -> dict:
    with pytest.raises(JobError) as info:
        parse_job_input(job_input, S)
    err = info.value.to_dict()
    assert err["code"] == "invalid_input" and err["message"].startswith(err["field"] + ": "), err
    return err


@pytest.mark.parametrize("make", [chat, completion])
@pytest.mark.parametrize("fields, engine, field", [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a_b-1", "schema": SCHEMA, "strict": True,
                                                                 "description": "d"}}},
     {"json": SCHEMA}, "response_format"),
    ({"structured_outputs": {"regex": "[a-z]+", "backend": "xgrammar", "disable_fallback": True}},
     {"regex": "[a-z]+"}, "structured_outputs"),
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": " ?", "guided_decoding_backend": "outlines"},
     {"json": SCHEMA, "whitespace_pattern": " ?"}, "guided_json"),
    ({"guided_json": '{"type": "object"}'}, {"json": '{"type": "object"}'}, "guided_json"),
    ({"guided_regex": "\\d+"}, {"regex": "\\d+"}, "guided_regex"),
    ({"guided_choice": ["yes", "no"]}, {"choice": ["yes", "no"]}, "guided_choice"),
    ({"guided_grammar": 'start: "a"'}, {"grammar": 'start: "a"'}, "guided_grammar"),
])
def test_openai_sources_map_to_the_engine_field_and_name_themselves(make, fields, engine, field):
    spec = parse_job_input(make(**fields), S)
    assert spec.sampling["structured_outputs"] == engine
    assert spec.field("structured_outputs") == "openai_input." + field  # what an engine refusal names


@pytest.mark.parametrize("make", [chat, completion])
def test_text_format_and_nothing_are_no_structured_output(make):
    for fields in ({}, {"response_format": {"type": "text"}}, {"guided_decoding_backend": "auto"}):
        assert "structured_outputs" not in parse_job_input(make(**fields), S).sampling


@pytest.mark.parametrize("key", ["structured_outputs", "guided_decoding"])
def test_native_sampling_params(key):
    spec = parse_job_input({"prompt": "Hi", "sampling_params": {key: {"choice": ["a", "b"], "backend": "guidance"}}}, S)
    assert spec.sampling["structured_outputs"] == {"choice": ["a", "b"]}
    assert spec.field("structured_outputs") == "sampling_params." + key


def test_responses_text_format():
    fmt = {"type": "json_schema", "name": "p", "schema": SCHEMA, "strict": True}
    spec = parse_job_input(responses(text={"format": fmt, "verbosity": "low"}), S)
    assert spec.sampling["structured_outputs"] == {"json": SCHEMA}
    assert spec.field("structured_outputs") == "openai_input.text.format"
    assert spec.chat.request["text"] == {"format": fmt}  # the Response echoes it
    spec = parse_job_input(responses(text={"format": {"type": "json_object"}}), S)
    assert spec.sampling["structured_outputs"] == {"json_object": True}
    assert "structured_outputs" not in parse_job_input(responses(text={"format": {"type": "text"}}), S).sampling


def test_required_tool_choice_is_vllms_array_of_calls():
    spec = parse_job_input(chat(tools=[WEATHER, TIME], tool_choice="required"), S)
    schema = spec.sampling["structured_outputs"]["json"]
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    weather, time = schema["items"]["anyOf"]
    assert weather["properties"]["name"] == {"type": "string", "enum": ["weather"]}
    assert weather["properties"]["parameters"]["properties"] == {"city": {"$ref": "#/$defs/city"}}
    assert weather["required"] == ["name", "parameters"] and weather["additionalProperties"] is False
    assert schema["$defs"] == {"city": {"type": "string", "enum": ["Paris", "Seoul"]}}  # lifted to the root
    assert "$defs" in WEATHER["function"]["parameters"]  # the request's own tool is left as sent
    assert time["properties"]["parameters"] == {"type": "object", "properties": {}, "additionalProperties": False}
    assert spec.field("structured_outputs") == "openai_input.tools"
    assert spec.chat.forced and spec.chat.constrained and spec.chat.tools[0]["function"]["name"] == "weather"
    one = parse_job_input(chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False), S)
    assert one.sampling["structured_outputs"]["json"]["maxItems"] == 1


def test_named_tool_choice_is_its_parameters():
    named = {"type": "function", "function": {"name": "weather"}}
    spec = parse_job_input(chat(tools=[TIME, WEATHER], tool_choice=named), S)
    assert spec.sampling["structured_outputs"] == {"json": WEATHER["function"]["parameters"]}
    assert spec.field("structured_outputs") == "openai_input.tools[1].function.parameters"
    assert spec.chat.tool_name == "weather"
    flat = [{"type": "function", **t["function"]} for t in (TIME, WEATHER)]
    spec = parse_job_input(responses(tools=flat, tool_choice={"type": "function", "name": "time"}), S)
    assert spec.sampling["structured_outputs"]["json"]["properties"] == {}
    assert spec.field("structured_outputs") == "openai_input.tools[0].parameters"


def test_strict_tools_need_a_forced_choice():
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    assert parse_job_input(chat(tools=[strict], tool_choice="required"), S).chat.forced
    assert refused(chat(tools=[strict], tool_choice="auto"))["field"] == "openai_input.tools[0].function.strict"


@pytest.mark.parametrize("job, field", [
    # two sources: the second one sent is named
    (chat(guided_json=SCHEMA, response_format={"type": "json_object"}), "openai_input.response_format"),
    (chat(response_format={"type": "json_object"}, guided_json=SCHEMA), "openai_input.guided_json"),
    (completion(structured_outputs={"regex": "a"}, guided_choice=["a"]), "openai_input.guided_choice"),
    (chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}),
     "openai_input.response_format"),
    (chat(tools=[WEATHER], guided_regex="a", tool_choice={"type": "function", "function": {"name": "weather"}}),
     "openai_input.tool_choice"),
    (responses(text={"format": {"type": "json_object"}}, tools=[{"type": "function", "name": "f"}],
               tool_choice="required"), "openai_input.tool_choice"),
    ({"prompt": "Hi", "sampling_params": {"guided_decoding": {"regex": "a"}, "structured_outputs": {"regex": "b"}}},
     "sampling_params.structured_outputs"),
    # the shapes
    (chat(response_format={"type": "xml"}), "openai_input.response_format.type"),
    (chat(response_format={"type": "structural_tag", "structures": []}), "openai_input.response_format.type"),
    (chat(response_format="json"), "openai_input.response_format"),
    (chat(response_format={"type": "json_object", "schema": SCHEMA}), "openai_input.response_format.schema"),
    (chat(response_format={"type": "json_schema"}), "openai_input.response_format.json_schema"),
    (chat(response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}),
     "openai_input.response_format.json_schema.name"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": SCHEMA}}),
     "openai_input.response_format.json_schema.name"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "p"}}),
     "openai_input.response_format.json_schema.schema"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "strict": "yes"}}),
     "openai_input.response_format.json_schema.strict"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA, "x": 1}}),
     "openai_input.response_format.json_schema.x"),
    (responses(text={"format": {"type": "json_schema", "schema": SCHEMA}}), "openai_input.text.format.name"),
    (responses(text="json"), "openai_input.text"),
    (chat(structured_outputs="a+"), "openai_input.structured_outputs"),
    (chat(structured_outputs={"regex": "a", "frob": 1}), "openai_input.structured_outputs"),
    (chat(structured_outputs={"regex": "a", "json": SCHEMA}), "openai_input.structured_outputs"),
    (chat(guided_choice=[]), "openai_input.guided_choice"),
    (chat(guided_json=["a"]), "openai_input.guided_json"),
    (chat(guided_regex=5), "openai_input.guided_regex"),
    (chat(guided_json="{not json"), "openai_input.guided_json"),
    ({"prompt": "Hi", "sampling_params": {"guided_decoding": {"regex": ""}}}, "sampling_params.guided_decoding"),
    ({"prompt": "Hi", "sampling_params": {"guided_decoding": "a+"}}, "sampling_params.guided_decoding"),
    ({"summarize": "A text.", "sampling_params": {"structured_outputs": {"json_object": True}}},
     "sampling_params.structured_outputs"),
    # the options
    (chat(guided_regex="a", guided_decoding_backend="vllm-magic"), "openai_input.guided_decoding_backend"),
    (chat(structured_outputs={"regex": "a", "backend": "xgrammar2"}), "openai_input.structured_outputs.backend"),
    ({"prompt": "Hi", "sampling_params": {"guided_decoding": {"regex": "a", "backend": "lmfe"}}},
     "sampling_params.guided_decoding.backend"),
    (chat(structured_outputs={"regex": "a", "disable_fallback": "no"}),
     "openai_input.structured_outputs.disable_fallback"),
    (chat(guided_whitespace_pattern=" "), "openai_input.guided_whitespace_pattern"),
    (chat(guided_json=SCHEMA, guided_whitespace_pattern=5), "openai_input.guided_whitespace_pattern"),
    (chat(structured_outputs={"json": SCHEMA, "whitespace_pattern": " "}, guided_whitespace_pattern=" "),
     "openai_input.guided_whitespace_pattern"),
    # forced tool choices
    (chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "openai_input.tool_choice"),
    (chat(tool_choice="required"), "openai_input.tool_choice"),
    (chat(tool_choice={"type": "function", "function": {"name": "weather"}}), "openai_input.tool_choice"),
    (chat(tools=[WEATHER], tool_choice={"type": "function"}), "openai_input.tool_choice"),
    (chat(tools=[WEATHER], tool_choice="always"), "openai_input.tool_choice"),
    (responses(tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}),
     "openai_input.tool_choice"),
    (responses(tool_choice="required"), "openai_input.tool_choice"),
])
def test_refusals_name_the_field_as_sent(job, field):
    assert refused(job)["field"] == field


def test_a_forced_choice_with_clashing_defs_names_the_tool():
    other = {"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "properties": {"c": {"$ref": "#/$defs/city"}}, "$defs": {"city": {"type": "integer"}}}}}
    err = refused(chat(tools=[WEATHER, other], tool_choice="required"))
    assert err["field"] == "openai_input.tools[1].function.parameters.$defs"
    # the named function alone has no clash
    parse_job_input(chat(tools=[WEATHER, other], tool_choice={"type": "function", "function": {"name": "other"}}), S)
