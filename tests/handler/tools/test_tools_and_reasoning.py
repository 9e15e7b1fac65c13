"""Tools, reasoning and /v1/responses on the tiny model, end to end through the worker: a
Hermes-style chat template (CUSTOM_CHAT_TEMPLATE) renders the tools, the sampler is forced
to write a tool call, and every object and chunk validates as the `openai` package's types."""
import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response
from openai.types.responses.response_stream_event import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.handler.conftest import error_of, run
from tests.handler.sse import parse_sse

TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL_TEXT = 'Checking.<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
USER = [{"role": "user", "content": "Weather in Paris?"}]
EVENTS = TypeAdapter(ResponseStreamEvent)


def force(worker, text: str) -> list[str]:
    """The sampler writes `text` then EOS; returns the list the engine's prompts are recorded in."""
    from engine.sampler import SampleResult

    engine = worker.engine.engine
    target = engine.tokenizer.encode(text, add_special_tokens=False) + [engine.tokenizer.eos_token_id]
    engine.ahead = None  # the scripted samples reach the host only: every step synchronous
    engine.sampler.sample = lambda logits, seqs, *a, **k: [
        SampleResult(target[min(s.num_output_tokens, len(target) - 1)], 0.0, None) for s in seqs]
    return record_prompts(worker)


def record_prompts(worker) -> list[str]:
    """The list that the rendered prompt of every request the worker's engine processes is added to."""
    prompts, process = [], worker.engine.input_processor.process

    def recording(prompt, *args, **kwargs):
        req = process(prompt, *args, **kwargs)
        prompts.append(req.prompt)
        return req

    worker.engine.input_processor.process = recording
    return prompts


@pytest.fixture
def tool_worker(make_worker, loop):
    worker = make_worker(CUSTOM_CHAT_TEMPLATE=TOOL_TEMPLATE, REASONING_PARSER="qwen3", DEFAULT_MAX_TOKENS="200",
                         MAX_MODEL_LEN="512", NUM_KV_BLOCKS="128")
    run(loop, worker, {"prompt": "warm up", "sampling_params": {"max_tokens": 2}})
    return worker


def chat(messages, **extra):
    return {"openai_route": "/v1/chat/completions",
            "openai_input": {"model": "m", "messages": messages, "max_tokens": 100, **extra}}


def test_tool_round_trip(tool_worker, loop):
    prompts = force(tool_worker, CALL_TEXT)
    out = run(loop, tool_worker, chat(USER, tools=TOOLS))
    assert out["status"] == "COMPLETED", out
    resp = ChatCompletion.model_validate(out["output"][0])
    assert "<tools>" in prompts[-1] and '"weather"' in prompts[-1]  # the template rendered the tools
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    call = choice.message.tool_calls[0]
    assert call.function.name == "weather" and json.loads(call.function.arguments) == {"city": "Paris"}

    # streamed: the text before the call, then the call as one delta, finish_reason tool_calls
    out = run(loop, tool_worker, chat(USER, tools=TOOLS, stream=True, stream_options={"include_usage": True}))
    chunks = [ChatCompletionChunk.model_validate(c) for item in out["output"] for c in parse_sse(item)]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Checking."
    assert not any("<tool" in (d.content or "") for d in deltas)
    streamed = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in streamed] == \
        [(0, "weather", {"city": "Paris"})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    # the assistant's call and the tool's answer fed back through the template
    force(tool_worker, "It is sunny.")
    history = USER + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}]
    out = run(loop, tool_worker, chat(history, tools=TOOLS))
    resp = ChatCompletion.model_validate(out["output"][0])
    assert resp.choices[0].message.content == "It is sunny." and resp.choices[0].finish_reason == "stop"
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>' in prompts[-1]
    assert "<tool_response>sunny, 21C</tool_response>" in prompts[-1]


def test_reasoning_split_and_template_kwargs(tool_worker, loop):
    prompts = force(tool_worker, "<think>The user asks.</think>Hello!")
    out = run(loop, tool_worker, chat(USER, chat_template_kwargs={"enable_thinking": False}))
    message = ChatCompletion.model_validate(out["output"][0]).choices[0].message
    assert message.content == "Hello!" and message.reasoning_content == "The user asks."
    assert prompts[-1].endswith("<think>\n\n</think>\n\n")  # enable_thinking reached the template
    out = run(loop, tool_worker, chat(USER, stream=True))
    deltas = [ChatCompletionChunk.model_validate(c).choices[0].delta for i in out["output"] for c in parse_sse(i)]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "The user asks."
    assert "".join(d.content or "" for d in deltas) == "Hello!"


def test_completions_validate(tool_worker, loop):
    force(tool_worker, "Once upon")
    job = {"openai_route": "/v1/completions", "openai_input": {"model": "m", "prompt": "Tell", "max_tokens": 30}}
    assert Completion.model_validate(run(loop, tool_worker, job)["output"][0]).choices[0].text == "Once upon"
    job["openai_input"]["stream"] = True
    out = run(loop, tool_worker, job)
    chunks = [completion_chunk(c) for i in out["output"] for c in parse_sse(i)]
    assert "".join(c.choices[0].text for c in chunks) == "Once upon" and chunks[-1].choices[0].finish_reason == "stop"


def completion_chunk(chunk: dict) -> Completion:
    """A streamed text_completion chunk as Completion: the type has no null finish_reason, which
    OpenAI's own stream sends before the last chunk (the client builds chunks without validating)."""
    assert all(c["finish_reason"] in (None, "stop", "length") for c in chunk["choices"])
    Completion.model_validate({**chunk, "choices": [{**c, "finish_reason": c["finish_reason"] or "stop"}
                                                    for c in chunk["choices"]]})
    return Completion.construct(**{**chunk, "choices": [type("C", (), c) for c in chunk["choices"]]})


def test_responses_route(tool_worker, loop):
    force(tool_worker, "<think>Paris weather.</think>" + CALL_TEXT)
    job = {"openai_route": "/v1/responses", "openai_input": {
        "model": "m", "input": "Weather in Paris?", "instructions": "Be brief.", "max_output_tokens": 100,
        "tools": [{"type": "function", **TOOLS[0]["function"]}]}}
    resp = Response.model_validate(run(loop, tool_worker, job)["output"][0])
    assert resp.status == "completed" and [o.type for o in resp.output] == ["reasoning", "message", "function_call"]
    assert resp.output[0].content[0].text == "Paris weather." and resp.output_text == "Checking."
    call = resp.output[2]
    assert call.name == "weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert resp.usage.output_tokens > resp.usage.output_tokens_details.reasoning_tokens > 0

    job["openai_input"]["stream"] = True
    out = run(loop, tool_worker, job)
    events = [EVENTS.validate_python(e) for item in out["output"] for e in parse_sse(item)]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Checking."
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Paris weather."
    assert [o.type for o in events[-1].response.output] == ["reasoning", "message", "function_call"]

    # the call and its output sent back as input items
    force(tool_worker, "Sunny.")
    job = {"openai_route": "/v1/responses", "openai_input": {"model": "m", "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": "weather", "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        "tools": [{"type": "function", **TOOLS[0]["function"]}]}}
    assert Response.model_validate(run(loop, tool_worker, job)["output"][0]).output_text == "Sunny."


def test_route_body_form(tool_worker, loop):
    force(tool_worker, "Hi there")
    out = run(loop, tool_worker, {"route": "/v1/chat/completions", "method": "POST",
                                  "body": {"model": "m", "messages": USER, "max_tokens": 30}})
    assert ChatCompletion.model_validate(out["output"][0]).choices[0].message.content == "Hi there"
    assert run(loop, tool_worker, {"route": "/v1/models"})["output"][0]["object"] == "list"
    err = error_of(run(loop, tool_worker, {"route": "/v1/chat/completions", "body": {"messages": "x"}}))
    assert err["field"] == "body.messages" and err["message"].startswith("body.messages")


@pytest.mark.parametrize("extra, field", [  # (structured output and forced tool choices: test_forced_tools.py)
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "openai_input.tool_choice"),
    ({"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": "no"}, "openai_input.parallel_tool_calls"),
    ({"response_format": {"type": "xml"}}, "openai_input.response_format.type"),
    ({"frobnicate": 1}, "openai_input.frobnicate"),
])
def test_unimplemented_fields_fail_naming_them(tool_worker, loop, extra, field):
    err = error_of(run(loop, tool_worker, chat(USER, **extra)))
    assert err["code"] == "invalid_input" and err["field"] == field, err


def test_safe_fields_are_ignored(tool_worker, loop):
    force(tool_worker, "Fine")
    out = run(loop, tool_worker, chat(USER, user="u1", metadata={"k": "v"}, store=False, service_tier="auto"))
    assert ChatCompletion.model_validate(out["output"][0]).choices[0].message.content == "Fine"


def test_tools_need_a_template_that_renders_them(make_worker, loop):
    worker = make_worker()  # the tiny model's own template ignores tools
    err = error_of(run(loop, worker, chat(USER, tools=TOOLS, tool_choice="auto")))
    assert err["field"] == "openai_input.tools" and "CUSTOM_CHAT_TEMPLATE" in err["message"]
