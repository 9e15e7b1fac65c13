"""RunPod's OpenAI-compatible routes on the local endpoint (/v2/<id>/openai/v1/...): each
request runs as an openai_route job on the real worker; chat and completions, whole and
streamed as server-sent events; /models; a failing request answers an OpenAI error."""
from __future__ import annotations

import json

CHAT = {"model": "any", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}


def check_chat_completion(body: dict) -> str:
    """The body as the `openai` package reads it (its types when installed); the message text."""
    try:
        from openai.types.chat import ChatCompletion
    except ImportError:  # not in this venv: the fields its type requires
        assert body["object"] == "chat.completion" and body["id"] and isinstance(body["created"], int)
        assert body["model"] and body["choices"][0]["index"] == 0
        return body["choices"][0]["message"]["content"]
    return ChatCompletion.model_validate(body).choices[0].message.content


def check_chunk(chunk: dict) -> dict:
    try:
        from openai.types.chat import ChatCompletionChunk
    except ImportError:
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] and chunk["model"]
        assert all(c["index"] == 0 and isinstance(c["delta"], dict) for c in chunk["choices"])
        return chunk
    return ChatCompletionChunk.model_validate(chunk).model_dump()


def events(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    out = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert all(line == "" or line.startswith("data: ") for line in text.split("\n")), text
    return out


def test_chat_completions_answers_the_completion_object(http):
    async def body(h):
        return await h.post("/v2/some-endpoint/openai/v1/chat/completions", CHAT)

    code, completion = http(body)
    assert code == 200, completion
    assert check_chat_completion(completion).strip()
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert completion["choices"][0]["message"]["role"] == "assistant"
    assert completion["usage"]["completion_tokens"] > 0 and completion["usage"]["prompt_tokens"] > 0


def test_streamed_chat_completions_are_server_sent_events_ending_done(http):
    async def body(h):
        return await h.text("POST", "/v2/ep/openai/v1/chat/completions",
                            {**CHAT, "stream": True, "stream_options": {"include_usage": True}})

    code, ctype, text = http(body)
    assert code == 200 and ctype.startswith("text/event-stream")
    data = events(text)
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    chunks = [check_chunk(json.loads(d)) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text_out = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text_out.strip()
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert len({c["id"] for c in chunks}) == 1


def test_completions_and_models(http):
    async def body(h):
        return (await h.post("/v2/ep/openai/v1/completions", {"model": "m", "prompt": "Once upon", "max_tokens": 4}),
                await h.get("/v2/ep/openai/v1/models"))

    (c1, completion), (c2, models) = http(body)
    assert c1 == 200 and completion["object"] == "text_completion" and completion["choices"][0]["text"].strip()
    assert completion["usage"]["completion_tokens"] <= 4
    assert c2 == 200 and models["object"] == "list" and models["data"][0]["object"] == "model"
    assert models["data"][0]["id"]


def test_a_failing_request_answers_an_openai_error_streamed_or_not(http):
    bad = {**CHAT, "top_p": 7}

    async def body(h):
        return (await h.post("/v2/ep/openai/v1/chat/completions", bad),
                await h.post("/v2/ep/openai/v1/chat/completions", {**bad, "stream": True}),
                await h.post("/v2/ep/openai/v1/completions", {"prompt": "word " * 400, "max_tokens": 4}))

    results = http(body)
    for code, answer in results[:2]:
        assert code == 400, answer
        err = answer["error"]
        assert err["code"] == "invalid_input" and err["type"] == "invalid_request_error"
        assert err["param"] == "openai_input.top_p" and "top_p" in err["message"] and err["retryable"] is False
    code, answer = results[2]
    assert code == 400 and answer["error"]["code"] == "prompt_too_long"


def test_chunk_lists_become_one_event_each_and_any_error_an_openai_error():
    from handler.http.jobs import Job
    from handler.http.openai_routes import error_object, sse

    assert sse("data: {\"a\": 1}\n\n") == "data: {\"a\": 1}\n\n"  # RAW_OPENAI_OUTPUT: worker-vllm's SSE text
    assert events(sse([{"a": 1}, {"b": "é"}])) == ['{"a": 1}', '{"b": "é"}']  # RAW_OPENAI_OUTPUT false
    raised = Job("j", {}, status="FAILED", error="handler: boom \ntraceback: ...")  # not our JSON: still coded
    err = error_object(raised)["error"]
    assert err["code"] == "internal_error" and "boom" in err["message"]
    overloaded = Job("j", {}, status="FAILED", error=json.dumps({"code": "overloaded", "message": "m",
                                                                  "retryable": True}))
    assert error_object(overloaded)["error"] == {"code": "overloaded", "message": "m", "retryable": True,
                                                 "type": "server_error", "param": None}
