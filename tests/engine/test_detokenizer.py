"""The finish rule of a request, token by token: EOS and stop token ids first,
then stop strings (only past min_tokens), then the token limit or the context."""
import pytest

from engine.detokenizer import Detokenizer
from engine.sampling_params import SamplingParams
from tests import models


@pytest.fixture(scope="module")
def tok():
    return models.make_tokenizer()


def feed(tok, text: str, params: SamplingParams, eos=(2,), max_tokens=100, max_model_len=1000, prompt=(5,)):
    """Feed text's tokens; (finish, stop_reason, the visible text, tokens fed)."""
    d = Detokenizer(tok, list(prompt), params, set(eos), max_tokens, max_model_len)
    ids = tok.encode(text)
    for i, t in enumerate(ids, 1):
        end = d.update(t, i)
        if end is not None:
            return end, d.output_text(True), i
    return None, d.output_text(False), len(ids)


def test_eos_and_stop_token_ids_stop_without_their_text(tok):
    d = Detokenizer(tok, [5], SamplingParams(stop_token_ids=[9]), {2}, 100, 1000)
    assert d.update(tok.encode("Hi")[0], 1) is None
    assert d.update(2, 2) == ("stop", None)
    d = Detokenizer(tok, [5], SamplingParams(stop_token_ids=[9]), {2}, 100, 1000)
    assert d.update(9, 1) == ("stop", 9) and d.text == ""
    d = Detokenizer(tok, [5], SamplingParams(ignore_eos=True), {2}, 100, 1000)
    assert d.update(2, 1) is None


def test_a_stop_string_cuts_the_text_and_wins_over_length(tok):
    text = "the cat sat on the mat"
    n = len(tok.encode(text))
    (reason, hit), visible, fed = feed(tok, text, SamplingParams(stop=["sat"]))
    assert (reason, hit) == ("stop", "sat") and visible == "the cat " and fed < n
    # the stop string arrives on the last allowed token: "stop" with the string, not "length"
    upto = len(tok.encode("the cat sat"))
    (reason, hit), visible, _ = feed(tok, text, SamplingParams(stop=["sat"]), max_tokens=upto)
    assert (reason, hit) == ("stop", "sat")
    (reason, hit), visible, _ = feed(tok, text, SamplingParams(stop=["sat"], include_stop_str_in_output=True))
    assert visible == "the cat sat"


def test_stop_strings_wait_for_min_tokens(tok):
    """One that came before min_tokens never stops the request later (vLLM's rule)."""
    text = "sat down and sat again"
    (reason, hit), visible, fed = feed(tok, text, SamplingParams(stop=["sat"], min_tokens=3))
    assert hit == "sat" and visible == "sat down and "
    end, visible, _ = feed(tok, "sat down and up", SamplingParams(stop=["sat"], min_tokens=3))
    assert end is None and visible.startswith("sat down")


def test_the_limit_and_the_context_end_with_length(tok):
    text = "one two three four five six"
    (reason, hit), visible, fed = feed(tok, text, SamplingParams(), max_tokens=3)
    assert (reason, fed) == ("length", 3)
    (reason, hit), _, fed = feed(tok, text, SamplingParams(), max_model_len=5, prompt=(5, 6))
    assert (reason, fed) == ("length", 3)  # 2 prompt + 3 output tokens fill the context


def test_streaming_holds_back_a_possible_stop_string(tok):
    d = Detokenizer(tok, [5], SamplingParams(stop=["STOP"]), {2}, 100, 1000)
    for i, t in enumerate(tok.encode("go ST"), 1):
        assert d.update(t, i) is None
    assert not d.output_text(False).endswith("ST") and d.output_text(True) == "go ST"
