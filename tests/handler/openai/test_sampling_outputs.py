"""OpenAI and native jobs with logprobs, n > 1, echo and the logits fields on the real worker
loop (tiny model): every response and chunk validates as the `openai` package's types;
logprobs match the engine's; usage counts every choice's tokens, the prompt once."""
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.handler.conftest import error_of, run
from tests.handler.sse import parse_sse

MESSAGES = [{"role": "user", "content": "Tell me about the roadmap"}]
PROMPT = "Meeting notes: the team agreed"


def _chat(loop, worker, **fields):
    return run(loop, worker, {"openai_route": "/v1/chat/completions",
                              "openai_input": {"messages": MESSAGES, "max_tokens": 6, "ignore_eos": True, **fields}})


def _completion(loop, worker, **fields):
    return run(loop, worker, {"openai_route": "/v1/completions",
                              "openai_input": {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, **fields}})


def completion_chunk(chunk: dict) -> Completion:
    """A text_completion stream chunk as openai's Completion (the SDK streams that type, unvalidated):
    OpenAI's own stream sends finish_reason null until a choice ends, which the type (made for the
    whole response) has no value for, so a null one is checked as "stop"; the rest as it is."""
    choices = [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]]
    obj = Completion.model_validate({**chunk, "choices": choices})
    for ch, raw in zip(obj.choices, chunk["choices"]):
        ch.finish_reason = raw["finish_reason"]
    return obj


def _chunks(result) -> list[dict]:
    assert result["status"] == "COMPLETED", result
    return [c for item in result["output"] for c in parse_sse(item)]


def test_chat_logprobs_and_top_logprobs(loop, shared_worker):
    r = _chat(loop, shared_worker, temperature=0, logprobs=True, top_logprobs=3)
    obj = ChatCompletion.model_validate(r["output"][0])
    content = obj.choices[0].logprobs.content
    assert len(content) == obj.usage.completion_tokens == 6
    tok = shared_worker.engine.tokenizer
    ids = tok.encode(obj.choices[0].message.content, add_special_tokens=False)
    assert all("\ufffd" in t.token or t.token in obj.choices[0].message.content for t in content)
    assert ids  # (the random model writes broken bytes: a token's text alone may be U+FFFD)
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob
        assert t.logprob == t.top_logprobs[0].logprob  # greedy: the sampled token is the most likely
        assert t.bytes == list(t.token.encode("utf-8", errors="replace")) and t.logprob <= 0
    plain = ChatCompletion.model_validate(_chat(loop, shared_worker, temperature=0)["output"][0])
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == obj.choices[0].message.content


def test_chat_stream_chunks_carry_their_tokens_logprobs(loop, shared_worker):
    chunks = _chunks(_chat(loop, shared_worker, temperature=0, logprobs=True, top_logprobs=2, stream=True,
                           stream_options={"include_usage": True}))
    objs = [ChatCompletionChunk.model_validate(c) for c in chunks]
    tokens = [t for o in objs for ch in o.choices if ch.logprobs for t in ch.logprobs.content]
    assert len(tokens) == 6 and objs[-1].usage.completion_tokens == 6
    text = "".join(ch.delta.content or "" for o in objs for ch in o.choices)
    assert all("\ufffd" in t.token or t.token in text for t in tokens)


def test_completions_logprobs_text_offset_and_echo(loop, shared_worker):
    r = _completion(loop, shared_worker, temperature=0, logprobs=2)
    obj = Completion.model_validate(r["output"][0])
    lp = obj.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in lp.top_logprobs)
    echo = Completion.model_validate(_completion(loop, shared_worker, temperature=0, echo=True)["output"][0])
    assert echo.choices[0].text == PROMPT + obj.choices[0].text
    both = _completion(loop, shared_worker, temperature=0, echo=True, logprobs=1)["output"][0]
    lp = both["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["tokens"]) == both["usage"]["prompt_tokens"] + 6
    assert all(v is not None and v <= 0 for v in lp["token_logprobs"][1:])


def test_n2_chat_indexed_seeded_and_usage_counts_all(loop, shared_worker):
    fields = dict(n=2, temperature=1.0, seed=7)
    a = ChatCompletion.model_validate(_chat(loop, shared_worker, **fields)["output"][0])
    b = ChatCompletion.model_validate(_chat(loop, shared_worker, **fields)["output"][0])
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]  # reproducible
    assert a.usage.completion_tokens == 12 and a.usage.prompt_tokens == b.usage.prompt_tokens
    one = ChatCompletion.model_validate(_chat(loop, shared_worker, temperature=1.0, seed=8)["output"][0])
    assert one.choices[0].message.content == a.choices[1].message.content  # choice 1: seed + 1


def test_n2_streams_interleave_choices_by_index(loop, shared_worker):
    chunks = _chunks(_completion(loop, shared_worker, n=2, temperature=1.0, seed=3, stream=True,
                                 stream_options={"include_usage": True}))
    objs = [completion_chunk(c) for c in chunks]
    indexes = [ch.index for o in objs for ch in o.choices]
    assert set(indexes) == {0, 1} and indexes != sorted(indexes)  # interleaved, not one after the other
    assert sum(1 for o in objs for ch in o.choices if ch.finish_reason == "length") == 2
    assert objs[-1].usage.completion_tokens == 12
    whole = Completion.model_validate(_completion(loop, shared_worker, n=2, temperature=1.0, seed=3)["output"][0])
    for c in whole.choices:
        assert "".join(ch.text for o in objs for ch in o.choices if ch.index == c.index) == c.text
    chat = [ChatCompletionChunk.model_validate(c) for c in _chunks(_chat(loop, shared_worker, n=2, stream=True))]
    roles = [ch.index for o in chat for ch in o.choices if ch.delta.role == "assistant"]
    assert roles == [0, 1]


def test_best_of_and_logit_bias(loop, shared_worker):
    r = _completion(loop, shared_worker, n=1, best_of=3, temperature=1.0, seed=1, logprobs=0)
    obj = Completion.model_validate(r["output"][0])
    assert len(obj.choices) == 1 and obj.usage.completion_tokens == 6  # the choices returned (as vLLM)
    forced = Completion.model_validate(_completion(loop, shared_worker, temperature=0, logprobs=0,
                                                   logit_bias={"42": 100})["output"][0])
    assert len(set(forced.choices[0].logprobs.tokens)) == 1


def test_native_logprobs_prompt_logprobs_and_n(loop, shared_worker):
    r = run(loop, shared_worker, {"prompt": PROMPT, "sampling_params": {
        "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 2, "prompt_logprobs": 1}})
    item = r["output"][-1]
    assert len(item["logprobs"]) == 4 and item["prompt_logprobs"][0] is None
    assert len(item["prompt_logprobs"]) == item["usage"]["prompt_tokens"]
    for pos in item["logprobs"]:
        assert all({"logprob", "rank", "decoded_token"} == set(v) for v in pos.values())
        assert min(v["rank"] for v in pos.values()) == 1
    many = run(loop, shared_worker, {"prompt": PROMPT, "stream": True, "sampling_params": {
        "max_tokens": 5, "n": 3, "temperature": 1.0, "seed": 4, "ignore_eos": True}})
    assert many["status"] == "COMPLETED"
    texts = {i: "" for i in range(3)}
    for it in many["output"]:
        for ch in it["choices"]:
            texts[ch["index"]] += ch["text"]
    final = many["output"][-1]
    assert [c["finish_reason"] for c in final["choices"]] == ["length"] * 3
    assert final["usage"]["completion_tokens"] == 15 and all(texts.values())


@pytest.mark.parametrize("fields,field", [
    ({"logprobs": 2}, "openai_input.logprobs"), ({"logprobs": True, "top_logprobs": 21}, "openai_input.top_logprobs"),
    ({"top_logprobs": 2}, "openai_input.top_logprobs"), ({"n": 0}, "openai_input.n"),
    ({"logit_bias": {"x": 1}}, "openai_input.logit_bias"), ({"logit_bias": {"1": 500}}, "openai_input.logit_bias"),
    ({"n": 2, "best_of": 3, "stream": True}, "openai_input.best_of"),
    ({"allowed_token_ids": []}, "openai_input.allowed_token_ids"), ({"bad_words": [""]}, "openai_input.bad_words"),
    ({"logprobs": True, "top_logprobs": 2, "prompt_logprobs": 99}, "openai_input.prompt_logprobs"),
])
def test_bad_values_fail_invalid_input_naming_the_field(loop, shared_worker, fields, field):
    err = error_of(_chat(loop, shared_worker, **fields))
    assert err["code"] == "invalid_input" and field in err["message"], err


def test_native_bad_values_name_the_field(loop, shared_worker):
    for values, field in (({"logprobs": 21}, "logprobs"), ({"n": 1.5}, "n"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
                          ({"best_of": 1, "n": 2}, "best_of"), ({"use_beam_search": True}, "use_beam_search")):
        err = error_of(run(loop, shared_worker, {"prompt": PROMPT, "sampling_params": values}))
        assert err["code"] == "invalid_input" and f"sampling_params.{field}" in err["message"], (values, err)
