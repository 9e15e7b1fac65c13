"""Sampling from the last-position logits of each request: penalties,
min_tokens, temperature, top-k / top-p / min-p, per-request seeds, logprobs."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sequence import Sequence


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: float
    top_logprobs: dict[int, float] | None
    error: str | None = None  # set when this request's logits were unusable


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), device=logits.device, dtype=torch.long)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
        out = torch.tensor(seq.output_token_ids, device=logits.device, dtype=torch.long)
        counts = torch.bincount(out, minlength=logits.shape[-1]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _filter(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    logits = logits / p.temperature
    vocab = logits.shape[-1]
    if 0 < p.top_k < vocab:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, -1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, -1) > p.top_p  # keep the token that crosses top_p
        logits = logits.scatter(-1, idx, sorted_logits.masked_fill(drop, float("-inf")))
    if p.min_p > 0.0:
        probs = torch.softmax(logits, -1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    def __init__(self, eos_token_ids: set[int], seed: int = 0):
        self.eos_token_ids = set(eos_token_ids)
        self.generator = torch.Generator().manual_seed(seed)  # requests without their own seed

    def _banned(self, seq: Sequence) -> list[int]:
        if seq.num_output_tokens >= seq.params.min_tokens:
            return []
        return sorted(self.eos_token_ids | set(seq.params.stop_token_ids))

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        """logits [S, V] for S requests, in order. Greedy rows are decided in one
        batched argmax; only rows with penalties, bans or sampling take a row of work."""
        logits = logits.float()
        bad_rows = (~torch.isfinite(logits)).any(dim=-1).tolist()
        x = logits.clone()
        for row, seq in enumerate(seqs):
            p = seq.params
            if bad_rows[row]:
                continue
            if p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty:
                x[row] = _apply_penalties(x[row], seq)
            banned = self._banned(seq)
            if banned:
                x[row, torch.tensor(banned, device=x.device)] = float("-inf")
        tokens = x.argmax(dim=-1)
        for row, seq in enumerate(seqs):
            if seq.params.greedy or bad_rows[row]:
                continue
            probs = torch.softmax(_filter(x[row], seq), -1).cpu()
            if seq.generator is None and seq.params.seed is not None:
                seq.generator = torch.Generator().manual_seed(seq.params.seed)
            gen = seq.generator or self.generator
            tokens[row] = int(torch.multinomial(probs, 1, generator=gen))
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        token_list, chosen_list = tokens.tolist(), chosen.tolist()
        results = []
        for row, seq in enumerate(seqs):
            if bad_rows[row]:
                results.append(SampleResult(-1, 0.0, None, error="the model produced NaN or infinite logits"))
                continue
            token = token_list[row]
            top = None
            if seq.params.logprobs is not None:
                top = {token: chosen_list[row]}
                if seq.params.logprobs:
                    vals, ids = torch.topk(raw_logprobs[row], seq.params.logprobs)
                    top.update(zip(ids.tolist(), vals.tolist()))
            results.append(SampleResult(token, chosen_list[row], top))
        return results
