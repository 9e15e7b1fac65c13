"""vLLM's logits edits on the device: logit_bias, allowed_token_ids, bad_words (and
min_p, stop_token_ids, skip_special_tokens, spaces_between_special_tokens passed through);
the input processor refuses token ids outside the vocabulary, naming the field."""
import pytest

from engine import LLM, SamplingParams
from engine.errors import InvalidInputError
from engine.input_processor import bad_words_token_ids
from engine.logits_processors import banned_by_bad_words
from engine.sequence import Sequence

PROMPT = "The quick brown fox"
GREEDY = dict(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(tiny_llama_dir, num_kv_blocks=256, block_size=16)


def _tokens(llm, **kw):
    return llm.generate([PROMPT], SamplingParams(**{**GREEDY, **kw}))[0].outputs[0].token_ids


def test_logit_bias_forces_and_bans(llm):
    free = _tokens(llm)
    assert set(_tokens(llm, logit_bias={"42": 100})) == {42}  # JSON's string keys are token ids
    banned = _tokens(llm, logit_bias={free[0]: -100})
    assert banned[0] != free[0]


def test_allowed_token_ids_only(llm):
    allowed = [40, 41, 300]
    out = _tokens(llm, allowed_token_ids=allowed)
    assert set(out) <= set(allowed) and len(out) == 10
    sampled = llm.generate([PROMPT], SamplingParams(max_tokens=20, temperature=1.5, seed=1, ignore_eos=True,
                                                    allowed_token_ids=allowed))[0].outputs[0].token_ids
    assert set(sampled) <= set(allowed)


def test_bad_words_never_appear(llm):
    tok = llm.get_tokenizer()
    free = llm.generate([PROMPT], SamplingParams(**GREEDY))[0].outputs[0]
    ids = free.token_ids
    # a two-token word the model writes (its text encodes back to the same two tokens)
    word = next(w for i in range(len(ids) - 1) if (w := tok.decode(ids[i : i + 2])) == w.strip() and w
                and tok.encode(w, add_special_tokens=False) == ids[i : i + 2])
    out = llm.generate([PROMPT], SamplingParams(**GREEDY, bad_words=[word]))[0].outputs[0]
    for ids in bad_words_token_ids(tok, [word]):
        assert all(out.token_ids[i : i + len(ids)] != ids for i in range(len(out.token_ids)))
    assert out.token_ids != free.token_ids


def test_bad_words_rule_bans_the_last_token_after_the_rest():
    seq = Sequence("r", None, [1, 2], SamplingParams(), 10)
    seq.params.bad_words_token_ids = [[7], [5, 6], [8, 9, 10]]
    assert banned_by_bad_words(seq) == [7]
    seq.token_ids += [3, 5]
    assert banned_by_bad_words(seq) == [7, 6]
    seq.token_ids += [8, 9]
    assert banned_by_bad_words(seq) == [7, 10]


def test_min_p_one_is_greedy(llm):
    assert _tokens(llm, temperature=1.0, seed=3, min_p=1.0) == _tokens(llm)


def test_stop_token_ids_and_special_tokens(llm):
    free = _tokens(llm)
    out = llm.generate([PROMPT], SamplingParams(**GREEDY, stop_token_ids=[free[2]]))[0].outputs[0]
    assert out.token_ids == free[: free.index(free[2]) + 1] and out.stop_reason == free[2]
    special = 3  # <|im_start|>: kept or skipped in the text
    kept = llm.generate([PROMPT], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True,
                                                 logit_bias={special: 100}, skip_special_tokens=False,
                                                 spaces_between_special_tokens=False))[0].outputs[0]
    assert kept.text == "<|im_start|>" * 3
    skipped = llm.generate([PROMPT], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True,
                                                    logit_bias={special: 100}))[0].outputs[0]
    assert skipped.text == ""


@pytest.mark.parametrize("field,value", [("logit_bias", {10**6: 1.0}), ("allowed_token_ids", [10**6])])
def test_token_ids_outside_the_vocabulary_are_refused(llm, field, value):
    with pytest.raises(InvalidInputError) as err:
        llm.generate([PROMPT], SamplingParams(max_tokens=1, **{field: value}))
    assert err.value.field == field


@pytest.mark.parametrize("field,value", [
    ("logit_bias", {"x": 1}), ("logit_bias", {1: 200}), ("logit_bias", [1]), ("allowed_token_ids", []),
    ("allowed_token_ids", [-1]), ("bad_words", [""]), ("bad_words", "word"), ("n", 0), ("n", 1.0),
    ("best_of", 0), ("prompt_logprobs", -1), ("spaces_between_special_tokens", "no"),
])
def test_bad_values_name_the_field(field, value):
    kw = {"n": 2, field: value} if field == "best_of" else {field: value}
    with pytest.raises(InvalidInputError) as err:
        SamplingParams(**kw)
    assert err.value.field == field
