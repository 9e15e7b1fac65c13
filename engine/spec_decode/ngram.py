"""Prompt lookup ("ngram" drafts): the tokens that followed the latest earlier occurrence
of the sequence's last n tokens (n from prompt_lookup_max down to prompt_lookup_min), in
its prompt and what it generated so far. One index per sequence, grown as tokens arrive:
a proposal costs a few dictionary look-ups, however long the sequence."""
from __future__ import annotations


class NgramIndex:
    """For each n in [n_min, n_max]: n-gram -> the position right after its latest occurrence
    that has a token following it (so the sequence's own last n-gram never finds itself)."""

    __slots__ = ("n_min", "n_max", "maps", "indexed")

    def __init__(self, n_min: int, n_max: int):
        assert 1 <= n_min <= n_max
        self.n_min, self.n_max = n_min, n_max
        self.maps: list[dict[tuple[int, ...], int]] = [{} for _ in range(n_max - n_min + 1)]
        self.indexed = 0  # positions p < indexed have their n-grams ending just before p entered

    def _extend(self, tokens: list[int]) -> None:
        """Index the n-grams followed by a token: those ending before position len(tokens) - 1."""
        end = len(tokens) - 1  # the last token has no follower yet
        lo = self.n_min
        for p in range(max(self.indexed, lo), end + 1):
            for i, m in enumerate(self.maps):
                n = lo + i
                if p >= n:
                    m[tuple(tokens[p - n:p])] = p
        self.indexed = max(self.indexed, end + 1)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k drafted tokens continuing `tokens` (empty: no n-gram matched)."""
        if len(tokens) <= self.n_min:
            return []
        self._extend(tokens)
        p = self.latest(tokens)
        return [] if p is None else tokens[p:p + k]

    def latest(self, tokens: list[int]) -> int | None:
        """The position after the latest indexed occurrence of tokens' longest matching tail
        (n from n_max down to n_min), or None."""
        for n in range(min(self.n_max, len(tokens) - 1), self.n_min - 1, -1):
            p = self.maps[n - self.n_min].get(tuple(tokens[-n:]))
            if p is not None:
                return p
        return None
