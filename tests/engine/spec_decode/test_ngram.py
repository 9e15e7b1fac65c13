"""Prompt lookup: the longest n-gram first, its latest earlier occurrence, never the suffix
itself; the index grown token by token proposes what one built at once does."""
import random

from engine.spec_decode.ngram import NgramIndex


def brute(tokens, k, n_min, n_max):
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        tail = tokens[-n:]
        for p in range(len(tokens) - 1, n - 1, -1):  # latest occurrence followed by a token
            if tokens[p - n:p] == tail:
                return tokens[p:p + k]
    return []


def test_longest_then_latest_match():
    ix = NgramIndex(1, 3)
    assert ix.propose([1, 2, 3, 9, 2, 3, 8, 1, 2, 3], 2) == [9, 2]  # (1, 2, 3) beats the later (2, 3)
    ix = NgramIndex(1, 3)
    assert ix.propose([5, 6, 7, 5, 6, 1, 5, 6], 3) == [1, 5, 6]  # the latest (5, 6)
    assert NgramIndex(2, 3).propose([4, 4], 3) == []  # the suffix never matches itself
    assert NgramIndex(1, 1).propose([4, 4], 3) == [4]


def test_incremental_index_matches_a_scan():
    rng = random.Random(0)
    for n_min, n_max in ((1, 3), (2, 4), (3, 3)):
        tokens = [rng.randrange(6) for _ in range(30)]
        ix = NgramIndex(n_min, n_max)
        for _ in range(200):
            assert ix.propose(tokens, 4) == brute(tokens, 4, n_min, n_max)
            tokens += [rng.randrange(6) for _ in range(rng.randrange(1, 6))]
