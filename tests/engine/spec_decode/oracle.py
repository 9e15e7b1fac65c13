"""Drafts for the tests: the continuation a run without speculation produced, with every
fifth token wrong, so verify steps accept runs of every length, reject at every offset and
take the bonus token (tiny random models rarely repeat themselves, so prompt lookup alone
would seldom draft)."""
from __future__ import annotations

from engine.spec_decode.speculator import Speculator


def wrong_every(tokens: list[int], first: int, every: int, vocab: int) -> list[int]:
    """tokens (output positions first, first + 1, ...) with positions p % every == every - 2 changed."""
    return [(t + 1) % vocab if (first + i) % every == every - 2 else t for i, t in enumerate(tokens)]


def use_oracle(monkeypatch, references: dict[tuple[int, ...], list[int]], vocab: int, every: int = 5):
    """Speculator.draft proposes from `references` (prompt ids -> output ids without speculation)."""
    def draft(self, seq, k):
        ref = references.get(tuple(seq.prompt_token_ids))
        if ref is None:
            return []
        m = seq.num_output_tokens
        if seq.output_token_ids != ref[:m]:
            return []  # diverged (it must not): no drafts, the comparison shows it
        tail = ref[m:m + k] + [(7 * i + 11) % vocab for i in range(k)]  # past the reference's end: junk
        return wrong_every(tail[:k], m, every, vocab)

    monkeypatch.setattr(Speculator, "draft", draft)
