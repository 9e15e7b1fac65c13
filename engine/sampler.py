"""Sampling from the last-position logits of each request, on the logits'
device: penalties, min_tokens bans, temperature, top-k / top-p / min-p,
per-request seeds, logprobs. Every row's result reaches the host in one
transfer, the only host synchronisation of a step."""
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


def _ids(values, device) -> torch.Tensor:
    """Host ints to the device without waiting for it (an asynchronous copy)."""
    t = torch.tensor(values, dtype=torch.long)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def _apply_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = _ids(sorted(set(seq.token_ids)), logits.device)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and seq.num_output_tokens:
        counts = torch.zeros_like(logits).index_add_(  # bincount would wait for the GPU to size its output
            0, _ids(seq.output_token_ids, logits.device), torch.ones(seq.num_output_tokens, device=logits.device))
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def _filter(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    p = seq.params
    logits = (logits - logits.max()) / p.temperature  # max first: a tiny temperature gives -inf, never inf - inf
    vocab = logits.shape[-1]
    if 0 < p.top_k < vocab:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, -1)
        drop = probs.cumsum(-1) - probs > p.top_p  # keep the token that crosses top_p
        logits = logits.scatter(-1, idx, sorted_logits.masked_fill(drop, float("-inf")))
    if p.min_p > 0.0:
        probs = torch.softmax(logits, -1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


class Sampler:
    def __init__(self, eos_token_ids: set[int], seed: int = 0):
        self.eos_token_ids = set(eos_token_ids)
        self.seed = seed
        self._generators: dict = {}  # device -> generator of the requests without their own seed

    def _banned(self, seq: Sequence) -> list[int]:
        if seq.num_output_tokens >= seq.params.min_tokens:
            return []
        return sorted(self.eos_token_ids | set(seq.params.stop_token_ids))

    def _generator(self, seq: Sequence, device: torch.device) -> torch.Generator:
        if seq.params.seed is not None:
            if seq.generator is None or seq.generator.device != device:
                seq.generator = torch.Generator(device=device).manual_seed(seq.params.seed)
            return seq.generator
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return gen

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        """logits [S, V] for S requests, in order. Greedy rows are decided in one
        batched argmax; only rows with penalties, bans or sampling take a row of work.
        A sampled token is argmax(probs / E) with E ~ Exp(1) drawn from the
        request's generator: a draw from probs without a host round trip."""
        logits = logits.float()
        dev = logits.device
        x = logits
        edited = False
        for row, seq in enumerate(seqs):
            p = seq.params
            penalties = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
            banned = [t for t in self._banned(seq) if t < logits.shape[-1]]  # ids past the vocab never come
            if (penalties or banned) and not edited:
                x, edited = logits.clone(), True
            if penalties:
                x[row] = _apply_penalties(x[row], seq)
            if banned:
                x[row].index_fill_(0, _ids(banned, dev), float("-inf"))  # a scalar: no host-to-device copy
        tokens = x.argmax(dim=-1)
        for row, seq in enumerate(seqs):
            if seq.params.greedy:
                continue
            probs = torch.softmax(_filter(x[row], seq), -1)
            noise = torch.empty_like(probs).exponential_(generator=self._generator(seq, dev))
            tokens[row] = (probs / noise).argmax()
        raw = torch.log_softmax(logits, dim=-1)
        chosen = raw.gather(1, tokens.unsqueeze(1)).squeeze(1)
        finite = torch.isfinite(logits).all(dim=-1)
        parts = [tokens.to(torch.float64), chosen.double(), finite.double()]
        for row, seq in enumerate(seqs):
            if seq.params.logprobs:
                vals, ids = torch.topk(raw[row], seq.params.logprobs)
                parts += [vals.double(), ids.double()]
        host = torch.cat(parts).tolist()  # the step's one synchronisation
        n = len(seqs)
        token_list, chosen_list, finite_list = host[:n], host[n : 2 * n], host[2 * n : 3 * n]
        at = 3 * n
        results = []
        for row, seq in enumerate(seqs):
            k = seq.params.logprobs or 0
            top_vals, top_ids = host[at : at + k], host[at + k : at + 2 * k]
            at += 2 * k
            if not finite_list[row]:
                results.append(SampleResult(-1, 0.0, None, error="the model produced NaN or infinite logits"))
                continue
            token = int(token_list[row])
            top = None
            if seq.params.logprobs is not None:
                top = {token: chosen_list[row]}
                top.update(zip((int(i) for i in top_ids), top_vals))
            results.append(SampleResult(token, chosen_list[row], top))
        return results
