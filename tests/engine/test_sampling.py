"""Sampling: validation names the field, seeds reproduce, stop strings are
trimmed exactly (also across tokens), min_tokens, penalties, logprobs."""
import math

import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidInputError


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, block_size=16)


@pytest.mark.parametrize("field,value", [
    ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("min_p", 2), ("max_tokens", 0),
    ("repetition_penalty", 0), ("presence_penalty", 3), ("frequency_penalty", -3), ("seed", -1),
    ("stop", [""]), ("stop_token_ids", [-1]), ("logprobs", 2000), ("min_tokens", -1), ("temperature", float("nan")),
    ("max_tokens", "10"), ("ignore_eos", "yes"),
    # every field's type: a string "false" is not false, a dict is not a list, 1.0 is not 1
    ("skip_special_tokens", "no"), ("skip_special_tokens", 0), ("include_stop_str_in_output", "false"),
    ("include_stop_str_in_output", 1), ("detokenize", None), ("stop", {"a": 1}), ("stop", 5), ("stop", ["a", 1]),
    ("stop", [["a"]]), ("stop_token_ids", 5), ("stop_token_ids", {"1": 2}), ("stop_token_ids", [1.0]),
    ("stop_token_ids", [True]), ("stop_token_ids", "12"), ("seed", 1.0), ("top_k", 2.0), ("min_tokens", True),
    ("logprobs", 1.5), ("temperature", "0"), ("top_p", None), ("max_tokens", 2.0),
])
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(InvalidInputError) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field and field in str(err.value) and err.value.code == "invalid_input"


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(InvalidInputError) as err:
        SamplingParams(max_tokens=2, min_tokens=5)
    assert err.value.field == "min_tokens"


def test_seeded_sampling_is_reproducible(llm):
    prompt = "Meeting notes: the team"
    sample = lambda seed: llm.generate(
        [prompt] * 3, SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=seed, ignore_eos=True)
    )
    a, b, c = sample(7), sample(7), sample(8)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert len({tuple(o.outputs[0].token_ids) for o in a}) == 1  # same seed, same request in one batch
    assert a[0].outputs[0].token_ids != c[0].outputs[0].token_ids


def test_unseeded_sampling_varies(llm):
    outs = llm.generate(["Hello"] * 4, SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True))
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) > 1


def test_stop_string_trimmed_exactly_across_tokens(llm):
    tok = llm.get_tokenizer()
    free = llm.generate(["The quick"], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))[0].outputs[0]
    text = free.text
    # pick a stop string that spans a token border of the free-running output
    pieces = [tok.decode(free.token_ids[: i + 1]) for i in range(len(free.token_ids))]
    cut = next(i for i in range(3, len(pieces)) if len(pieces[i]) - len(pieces[i - 1]) >= 1 and len(pieces[i - 1]) >= 2)
    stop = text[len(pieces[cut - 1]) - 1 : len(pieces[cut - 1]) + 1]
    assert len(stop) == 2
    out = llm.generate(["The quick"], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    assert stop not in out.text
    kept = llm.generate(["The quick"], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True, stop=[stop],
                                                       include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == text[: text.index(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(llm):
    free = llm.generate(["Hello world"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].outputs[0]
    target = free.token_ids[3]
    first = free.token_ids.index(target)
    out = llm.generate(["Hello world"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                       stop_token_ids=[target]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == target
    assert out.token_ids == free.token_ids[: first + 1]
    late = llm.generate(["Hello world"], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                        stop_token_ids=[target], min_tokens=first + 2))[0].outputs[0]
    assert len(late.token_ids) >= first + 2 and target not in late.token_ids[: first + 2]


def test_max_tokens_gives_length_and_default_fills_context(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, num_kv_blocks=64, block_size=16, max_model_len=40)
    out = llm.generate([{"prompt_token_ids": list(range(5, 35))}], SamplingParams(temperature=0, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.outputs[0].token_ids) == 40  # not 16 tokens


def test_repetition_penalty_reduces_repeats(llm):
    base = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    plain = llm.generate(["The"], base)[0].outputs[0].token_ids
    pen = llm.generate(["The"], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                                               repetition_penalty=3.0))[0].outputs[0].token_ids
    assert len(set(pen)) > len(set(plain))
    freq = llm.generate(["The"], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True,
                                                frequency_penalty=2.0))[0].outputs[0].token_ids
    assert len(set(freq)) > len(set(plain))


def test_logprobs_are_normalized_and_include_sampled(llm):
    out = llm.generate(["Hello"], SamplingParams(max_tokens=5, temperature=0, logprobs=3, ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == 5
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert tok in lp and len(lp) in (3, 4)
        assert max(v.logprob for v in lp.values()) == lp[tok].logprob and lp[tok].rank == 1  # greedy: the top one
        assert all(v.logprob <= 0 for v in lp.values())
    assert math.isclose(out.cumulative_logprob, sum(lp[t].logprob for t, lp in zip(out.token_ids, out.logprobs)), rel_tol=1e-5)


def test_chat_applies_the_template(llm):
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    tok = llm.get_tokenizer()
    chat = llm.chat([conv], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    assert chat.prompt_token_ids == tok.encode(prompt)
    plain = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert chat.outputs[0].token_ids == plain.outputs[0].token_ids


def test_chat_rejects_malformed_messages(llm):
    with pytest.raises(InvalidInputError) as err:
        llm.chat([[{"role": "user"}]], SamplingParams(max_tokens=2))
    assert err.value.field == "messages[0]"
