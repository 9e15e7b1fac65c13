"""Summarization by map-reduce over token chunks, independent of where the model
runs: the worker plugs in its engine, a batch client its own runner."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from handler.job.choices import is_truncated

DEFAULT_INSTRUCTIONS = (
    "Summarize the following text. Keep the key facts, decisions and action items; do not add anything new."
)
PART_INSTRUCTIONS = "This is part {index} of {total} of a longer text. " + DEFAULT_INSTRUCTIONS
COMBINE_INSTRUCTIONS = (
    "These are summaries of consecutive parts of one text. Combine them into one summary of the whole text, "
    "keeping the key facts, decisions and action items."
)
SYSTEM = "You are a careful assistant that writes concise, faithful summaries."
# Greedy with a mild repetition penalty: small models loop without it.
SUMMARY_SAMPLING = {"temperature": 0.0, "repetition_penalty": 1.1}
SUMMARY_MAX_TOKENS = 256
CHUNK_OVERLAP_TOKENS = 32
MAX_ROUNDS = 6


@dataclass(slots=True)
class Piece:
    """One model call's result."""

    text: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class Plan:
    """What is left after the map rounds: the final call's prompt, and what it took."""

    messages: list[dict]
    chunks: int = 1  # chunks of the document in the first map round (1: no map round)
    rounds: int = 0  # map rounds run
    prompt_tokens: int = 0  # used by the map calls
    completion_tokens: int = 0
    truncated_parts: int = 0  # map summaries cut at their token limit


class SummarizeError(ValueError):
    pass


def summary_messages(text: str, instructions: str | None = None) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{instructions or DEFAULT_INSTRUCTIONS}\n\n{text}"}]


def part_messages(text: str, index: int, total: int, instructions: str | None = None) -> list[dict]:
    head = (f"This is part {index} of {total} of a longer text. {instructions}" if instructions
            else PART_INSTRUCTIONS.format(index=index, total=total))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{head}\n\n{text}"}]


def combine_messages(summaries: list[str], instructions: str | None = None) -> list[dict]:
    body = "\n\n".join(f"Part {i}: {s}" for i, s in enumerate(summaries, 1))
    head = COMBINE_INSTRUCTIONS + (f" {instructions}" if instructions else "")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{head}\n\n{body}"}]


def plain_prompt(messages: list[dict]) -> str:
    """A prompt for models without a chat template."""
    user = "\n\n".join(m["content"] for m in messages if m["role"] != "system")
    return f"{user}\n\nSummary:"


def split_ids(ids: list[int], size: int, overlap: int = CHUNK_OVERLAP_TOKENS) -> list[list[int]]:
    """Consecutive chunks of at most `size` tokens, each repeating the previous one's last `overlap`."""
    assert size > 0
    overlap = max(0, min(overlap, size // 4))
    chunks, start = [], 0
    while start < len(ids):
        chunks.append(ids[start:start + size])
        if start + size >= len(ids):
            break
        start += size - overlap
    return chunks


async def reduce_to_fit(
    text: str,
    *,
    count_tokens: Callable[[list[dict]], int],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    run: Callable[[list[dict], int, str], Awaitable[Piece]],
    context_tokens: int,
    summary_tokens: int,
    instructions: str | None = None,
    concurrency: int = 8,
    max_rounds: int = MAX_ROUNDS,
) -> Plan:
    """Map rounds until what is left fits one prompt with room for `summary_tokens`.

    `count_tokens(messages)` is the prompt length of a call; `run(messages, max_tokens, tag)`
    makes one call. Returns the final call's messages: the caller runs it (streamed or not)."""
    plan = Plan(messages=summary_messages(text, instructions))
    summaries: list[str] | None = None
    while True:
        # a long document is tokenized in a thread: other jobs keep streaming meanwhile
        if await asyncio.to_thread(count_tokens, plan.messages) + summary_tokens <= context_tokens:
            return plan
        if plan.rounds >= max_rounds:
            raise SummarizeError(f"the document did not fit the context after {max_rounds} map rounds")
        source = text if summaries is None else "\n\n".join(summaries)
        overhead = count_tokens(part_messages("", 99, 99, instructions)) + 8
        avail = context_tokens - overhead
        map_tokens = min(summary_tokens, avail // 4)
        chunk_tokens = avail - map_tokens
        if map_tokens < 8 or chunk_tokens < 2 * map_tokens:
            raise SummarizeError(f"a context of {context_tokens} tokens is too small to summarize in parts")
        chunks = await asyncio.to_thread(
            lambda: [decode(c).strip("\ufffd") for c in split_ids(encode(source), chunk_tokens)])
        if plan.rounds == 0:
            plan.chunks = len(chunks)
        gate = asyncio.Semaphore(max(1, concurrency))
        rnd = plan.rounds + 1

        async def one(i: int, chunk: str) -> Piece:
            async with gate:
                return await run(part_messages(chunk, i + 1, len(chunks), instructions), map_tokens,
                                 f"r{rnd}p{i + 1}")

        pieces = await _all_or_nothing([one(i, c) for i, c in enumerate(chunks)])
        plan.rounds = rnd
        for p in pieces:
            plan.prompt_tokens += p.prompt_tokens
            plan.completion_tokens += p.completion_tokens
            plan.truncated_parts += is_truncated(p.finish_reason)
        summaries = [p.text.strip() for p in pieces if p.text.strip()] or [p.text for p in pieces]
        plan.messages = combine_messages(summaries, instructions)


async def _all_or_nothing(coros) -> list:
    """Results of all coroutines; on the first failure (or our cancellation) the rest are cancelled."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()
    return [t.result() for t in tasks]
