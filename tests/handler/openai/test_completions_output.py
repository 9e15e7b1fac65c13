"""OpenAI response objects and stream chunks in OpenAI's shapes (as worker-vllm streams them)."""
from handler.openai.completions_output import OpenAIFormatter, models_response
from tests.handler.sse import parse_sse


def test_chat_response_and_chunks():
    f = OpenAIFormatter("/v1/chat/completions", "job-9", "my-model")
    usage = f.usage(5, 3, cached_tokens=2)
    r = f.response("Hi!", "stop", usage)
    assert r["object"] == "chat.completion" and r["id"] == "chatcmpl-job-9" and r["model"] == "my-model"
    assert r["choices"][0]["message"] == {"role": "assistant", "content": "Hi!"}
    assert r["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                          "prompt_tokens_details": {"cached_tokens": 2}}
    item = f.pack([f.chunk("", first=True), f.chunk("Hi"), f.chunk(None, "stop"), f.usage_chunk(usage)], done=True)
    assert item.endswith("data: [DONE]\n\n")
    chunks = parse_sse(item)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 4
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hi"}
    assert chunks[2]["choices"][0]["finish_reason"] == "stop" and chunks[3]["choices"] == []


def test_completion_chunks_as_lists_when_not_raw():
    f = OpenAIFormatter("/v1/completions", "j", "m", raw=False)
    assert f.pack([f.chunk("a")]) == [f.chunk("a")]
    assert f.response("abc", "length", f.usage(1, 2))["choices"][0]["text"] == "abc"
    assert f.chunk("a")["object"] == "text_completion"


def test_models_list():
    r = models_response("my-model", 512)
    assert r["object"] == "list" and r["data"][0]["id"] == "my-model" and r["data"][0]["max_model_len"] == 512
