"""Map-reduce planning with a stand-in model: chunks by tokens, rounds until the
rest fits, and the final prompt left to the caller."""
import asyncio

import pytest

from handler.summarize import core as sc


def words(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.split()]


class WordModel:
    """One token per word; a call 'summarizes' to its first max_tokens words of the part."""

    def __init__(self):
        self.calls = []
        self.vocab = {}

    def encode(self, text):
        ids = []
        for w in text.split():
            ids.append(self.vocab.setdefault(w, len(self.vocab)))
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        return " ".join(inv[i] for i in ids)

    def count(self, messages):
        return sum(len(m["content"].split()) for m in messages) + 4

    async def run(self, messages, max_tokens, tag):
        self.calls.append((tag, max_tokens))
        body = messages[-1]["content"].split("\n\n", 1)[1].split()
        return sc.Piece(" ".join(body[:max_tokens]), "length", self.count(messages), max_tokens)


def test_split_ids_overlaps_and_covers():
    chunks = sc.split_ids(list(range(100)), 40, overlap=8)
    assert [len(c) for c in chunks] == [40, 40, 36]
    assert chunks[1][0] == 32 and chunks[-1][-1] == 99


def test_short_text_needs_no_map_round():
    m = WordModel()
    plan = asyncio.run(sc.reduce_to_fit("a b c", count_tokens=m.count, encode=m.encode, decode=m.decode,
                                        run=m.run, context_tokens=100, summary_tokens=20))
    assert plan.rounds == 0 and plan.chunks == 1 and m.calls == []
    assert plan.messages[-1]["content"].endswith("a b c")


def test_long_text_maps_until_it_fits():
    m = WordModel()
    text = " ".join(f"w{i}" for i in range(2000))
    plan = asyncio.run(sc.reduce_to_fit(text, count_tokens=m.count, encode=m.encode, decode=m.decode,
                                        run=m.run, context_tokens=300, summary_tokens=40))
    assert plan.chunks > 5 and plan.rounds >= 1 and plan.truncated_parts == len(m.calls)
    assert m.count(plan.messages) + 40 <= 300
    assert plan.messages[-1]["content"].startswith(sc.COMBINE_INSTRUCTIONS)
    assert plan.completion_tokens == sum(t for _, t in m.calls)


def test_too_small_a_context_is_refused():
    m = WordModel()
    with pytest.raises(sc.SummarizeError):
        asyncio.run(sc.reduce_to_fit(" ".join(["x"] * 500), count_tokens=m.count, encode=m.encode,
                                     decode=m.decode, run=m.run, context_tokens=60, summary_tokens=40))


def test_a_failed_part_cancels_the_others():
    m = WordModel()
    started, cancelled = [], []

    async def run(messages, max_tokens, tag):
        started.append(tag)
        if tag.endswith("p1"):
            raise RuntimeError("part failed")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(tag)
            raise

    with pytest.raises(RuntimeError, match="part failed"):
        asyncio.run(sc.reduce_to_fit(" ".join(f"w{i}" for i in range(600)), count_tokens=m.count,
                                     encode=m.encode, decode=m.decode, run=run, context_tokens=300,
                                     summary_tokens=40))
    assert len(started) > 1 and sorted(cancelled) == sorted(t for t in started if not t.endswith("p1"))
