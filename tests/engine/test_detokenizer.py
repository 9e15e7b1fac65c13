"""The finish rule of a request, token by token: EOS and stop token ids first,
then stop strings (only past min_tokens), then the token limit or the context; stop checks
cost the same however long the lists are."""
import random
import time

import pytest

from engine.detokenizer import Detokenizer, StopChecker
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


def reference_stop(text: str, chunks: list[int], stops: list[str], skipped: int = 0):
    """vLLM's rule, by brute force: text arrives in chunks (lengths); a stop string counts when it
    ends inside a checked chunk (the first `skipped` chunks come before min_tokens); the match
    that starts first wins, then the one listed first. (stop string, cut index) or None."""
    end = 0
    for n, size in enumerate(chunks):
        new_from, end = end, end + size
        if n < skipped:
            continue
        found = [(i, k, s) for k, s in enumerate(stops) for i in range(end - len(s) + 1)
                 if i >= 0 and text.startswith(s, i) and i + len(s) > new_from]
        if found:
            i, _, s = min(found)
            return s, i
    return None


def run_checker(text: str, chunks: list[int], stops: list[str], skipped: int = 0):
    checker = StopChecker(stops)
    end = 0
    for n, size in enumerate(chunks):
        end += size
        if n < skipped:
            checker.skip(text[:end])
            continue
        hit = checker.check(text[:end])
        if hit is not None:
            return hit, checker.cut
    return None


def test_stop_matching_agrees_with_a_plain_search():
    """Random texts over a small alphabet (many partial matches), random stop lists (overlapping,
    nested, repeated) and random chunkings: the same stop string and cut as the brute force."""
    rng = random.Random(21)
    for _ in range(3000):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(1, 30)))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))]
        chunks, left = [], len(text)
        while left:
            chunks.append(min(left, rng.randint(1, 4)))
            left -= chunks[-1]
        skipped = rng.randint(0, 2)
        assert run_checker(text, chunks, stops, skipped) == reference_stop(text, chunks, stops, skipped), (
            text, chunks, stops, skipped)


def test_a_stop_string_wholly_before_min_tokens_never_stops_later():
    """Even one lying in the last characters of the skipped text (where a longer stop string
    could still be arriving): only stop strings that end in text past min_tokens count."""
    stops = ["cat", "xxxxxxxxxx"]
    assert run_checker("the cat sat", [7, 4], stops, skipped=1) is None
    assert run_checker("the cat", [5, 2], stops, skipped=1) == ("cat", 4)  # began before, ends after: counts


def time_checks(stops: list[str], text: str, step: int = 4) -> float:
    """Seconds to check `text` as it grows `step` characters at a time (best of three)."""
    best = float("inf")
    for _ in range(3):
        checker = StopChecker(stops)
        checker.check("")  # whatever is built once per request is built here
        t0 = time.perf_counter()
        for end in range(step, len(text) + 1, step):
            assert checker.check(text[:end]) is None
        best = min(best, time.perf_counter() - t0)
    return best


def test_stop_string_checks_cost_the_same_for_one_or_thousands():
    """A check reads only the new characters: 20,000 stop strings (overlapping the text's own
    words) cost about what one does, per token."""
    text = ("the quick brown fox jumps over the lazy dog " * 40)[:1600]
    many = [w + f"#{i}" for i, w in enumerate(text.split() * 500)][:20_000]
    one, lots = time_checks(["#0"], text), time_checks(many, text)
    assert lots < 3 * one + 0.002, (one, lots)


def test_stop_token_ids_cost_the_same_for_one_or_a_hundred_thousand(tok):
    ids = tok.encode("the quick brown fox jumps over the lazy dog " * 20)

    def cost(stop_token_ids) -> float:
        best = float("inf")
        for _ in range(3):
            d = Detokenizer(tok, [5], SamplingParams(stop_token_ids=stop_token_ids), set(), 10_000, 100_000)
            t0 = time.perf_counter()
            for i, t in enumerate(ids, 1):
                assert d.update(t, i) is None
            best = min(best, time.perf_counter() - t0)
        return best

    big = list(range(1000, 101_000))
    assert cost(big) < 2 * cost([999]) + 0.002
