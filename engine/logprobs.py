"""Logprobs in vLLM's shape: per position a dict token id -> Logprob(logprob, rank,
decoded_token). They are vLLM V1's default `raw_logprobs`: the log-softmax of the model's
logits before any penalty, ban, bias, allowed-token mask or temperature. Reduced on the
device (one gather of the rows that asked) and read back in the step's one transfer."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1: the most likely token (ties count as above)
    decoded_token: str | None = None  # the token alone through the tokenizer (set by the engine)


PositionLogprobs = dict[int, Logprob]


@dataclass(slots=True)
class PromptRows:
    """The rows of a step's logits (after the sampling rows) that predict prompt tokens, for
    requests with prompt_logprobs: per entry (request, index of its first target token, count).
    The sampler fills `results`: per entry, one PositionLogprobs per target token."""

    entries: list[tuple[object, int, int]]
    results: list[list[PositionLogprobs]] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return sum(count for _, _, count in self.entries)


def device_parts(raw: torch.Tensor, targets: torch.Tensor, k: int) -> list[torch.Tensor]:
    """For rows of raw logprobs [R, V] and their target tokens [R]: the target's logprob, its
    rank, and the top-k values and ids (float64, flattened): read back with the step's others."""
    chosen = raw.gather(1, targets.unsqueeze(1))
    rank = (raw >= chosen).sum(-1)  # vLLM's batched_count_greater_than
    vals, ids = torch.topk(raw, k, dim=-1) if k else (raw[:, :0], raw[:, :0])
    return [chosen.squeeze(1).double(), rank.double(), vals.double().flatten(), ids.double().flatten()]


def read_parts(host: list[float], at: int, targets: list[int], ks: list[int], k: int) -> tuple[list, int]:
    """The PositionLogprobs of rows whose device_parts start at host[at]: row i keeps its own
    ks[i] top tokens (of the k computed) and its target. Returns them and the next offset."""
    r = len(targets)
    chosen, rank = host[at : at + r], host[at + r : at + 2 * r]
    vals, ids = host[at + 2 * r : at + 2 * r + r * k], host[at + 2 * r + r * k : at + 2 * r + 2 * r * k]
    out = []
    for i, target in enumerate(targets):
        lp = {int(target): Logprob(chosen[i], int(rank[i]))}
        for j in range(ks[i]):
            tok = int(ids[i * k + j])
            if tok not in lp:
                lp[tok] = Logprob(vals[i * k + j], j + 1)
        out.append(lp)
    return out, at + 2 * r + 2 * r * k


class TokenDecoder:
    """Each token's text alone (Logprob.decoded_token), as vLLM decodes them: the token through
    the tokenizer by itself, special tokens kept; remembered per id (a vocabulary's worth at most)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.cache[token_id] = self.tokenizer.decode([token_id])
        return text

    def fill(self, positions) -> None:
        for lp in positions:
            if lp is None:
                continue
            for tok, entry in lp.items():
                if entry.decoded_token is None:
                    entry.decoded_token = self(tok)


def prompt_rows(scheduled) -> tuple[PromptRows | None, list[tuple[int, int, int]]]:
    """The prompt positions of this step whose logits give prompt_logprobs not yet taken:
    (PromptRows for the sampler, (scheduled index, offset in the chunk, count) for the runner).
    A recomputed prompt (preemption) takes none twice."""
    entries, rows = [], []
    for i, (seq, n) in enumerate(scheduled):
        if seq.prompt_logprobs is None:
            continue
        start = seq.num_computed_tokens
        first = max(len(seq.prompt_logprobs), start + 1)  # the first prompt token to score
        last = min(start + n, seq.num_prompt_tokens - 1)  # position p predicts token p + 1
        if last >= first:
            entries.append((seq, first, last - first + 1))
            rows.append((i, first - 1 - start, last - first + 1))
    return (PromptRows(entries) if entries else None), rows
