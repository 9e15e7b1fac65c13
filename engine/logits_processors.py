"""The per-request logits edits of vLLM's SamplingParams, on the logits' device, in vLLM
V1's order: allowed_token_ids, bad_words, then logit_bias (penalties and min_tokens bans
follow in the sampler). A request that sets none of them costs one attribute check;
its device tensors are made once and kept on the Sequence."""
from __future__ import annotations

import torch

from engine.sequence import Sequence


def needs_edits(seq: Sequence) -> bool:
    p = seq.params
    return bool(p.allowed_token_ids or p.bad_words_token_ids or p.logit_bias)


def _cached(seq: Sequence, key: str, make, device: torch.device) -> torch.Tensor:
    cache = seq.device_tensors
    if cache is None:
        cache = seq.device_tensors = {}
    t = cache.get(key)
    if t is None or t.device != device:
        t = make()
        t = t if device.type == "cpu" else t.to(device, non_blocking=True)
        cache[key] = t
    return t


def banned_by_bad_words(seq: Sequence) -> list[int]:
    """vLLM's rule: a bad word's last token is banned when the output so far ends with the
    word's other tokens (a one-token word always)."""
    out = seq.output_token_ids
    banned = []
    for ids in seq.params.bad_words_token_ids or ():
        head = ids[:-1]
        if len(head) <= len(out) and (not head or out[len(out) - len(head):] == head):
            banned.append(ids[-1])
    return banned


def apply_edits(row: torch.Tensor, seq: Sequence) -> None:
    """Edit one request's logits row [V] in place."""
    p, dev, vocab = seq.params, row.device, row.shape[-1]
    if p.allowed_token_ids:
        def mask():
            m = torch.ones(vocab, dtype=torch.bool)
            m[[t for t in p.allowed_token_ids if t < vocab]] = False
            return m
        row.masked_fill_(_cached(seq, "disallowed", mask, dev), float("-inf"))
    if p.bad_words_token_ids:
        banned = [t for t in banned_by_bad_words(seq) if t < vocab]
        if banned:
            row.index_fill_(0, torch.tensor(banned).to(dev, non_blocking=True), float("-inf"))
    if p.logit_bias:
        items = [(t, b) for t, b in p.logit_bias.items() if t < vocab]
        if items:
            ids = _cached(seq, "bias_ids", lambda: torch.tensor([t for t, _ in items]), dev)
            vals = _cached(seq, "bias_vals", lambda: torch.tensor([float(b) for _, b in items]), dev)
            row.index_add_(0, ids, vals.to(row.dtype))
