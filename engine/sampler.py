"""Sampling from the last-position logits of each request, on the logits'
device: logits edits (engine.logits_processors), penalties, min_tokens bans,
temperature, top-k / top-p / min-p, per-request seeds, logprobs and prompt
logprobs (engine.logprobs); structured output's token masks (engine.structured), first. Every row's result reaches the host in one
transfer, the only host synchronisation of a step; launch() queues it without waiting
(the engine's asynchronous scheduling feeds the sampled tokens to the next step on the device)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

import llm_kernels
from engine.logits_processors import apply_edits, needs_edits
from engine.logprobs import PositionLogprobs, PromptRows, device_parts, read_parts
from engine.sequence import Sequence


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: float
    top_logprobs: PositionLogprobs | None  # the sampled token's and the top ones (logprobs asked)
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


def _values(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """Per-row parameters [R, 1] in like's dtype, on its device without waiting."""
    t = torch.tensor(values, dtype=like.dtype).unsqueeze(1)
    return t if like.device.type == "cpu" else t.to(like.device, non_blocking=True)


def _filter_rows(z: torch.Tensor, params: list) -> torch.Tensor:
    """Rows [R, V] (float32) of sampled requests, each through its own temperature, then top-k,
    top-p and min-p (as vLLM orders them); a filter no row uses costs nothing."""
    z = (z - z.max(-1, keepdim=True).values) / _values([p.temperature for p in params], z)  # max first: a tiny temperature gives -inf, never inf - inf
    vocab = z.shape[-1]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(ks):
        top = torch.topk(z, max(ks), dim=-1).values
        kth = top.gather(1, _ids([max(k, 1) - 1 for k in ks], z.device).unsqueeze(1))
        kth = kth.masked_fill(_values([float(k == 0) for k in ks], z) > 0, float("-inf"))  # rows without top-k keep all
        z = z.masked_fill(z < kth, float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        sorted_z, idx = torch.sort(z, dim=-1, descending=True)
        probs = torch.softmax(sorted_z, -1)
        # keep the token that crosses top_p; rows at top_p 1 drop nothing (a cumsum may round past 1)
        drop = (probs.cumsum(-1) - probs > _values([p.top_p for p in params], z)) \
            & (_values([float(p.top_p < 1.0) for p in params], z) > 0)
        z = z.scatter(-1, idx, sorted_z.masked_fill(drop, float("-inf")))
    if any(p.min_p > 0.0 for p in params):
        probs = torch.softmax(z, -1)
        z = z.masked_fill(probs < _values([p.min_p for p in params], z) * probs.max(-1, keepdim=True).values,
                          float("-inf"))
    return z


class Sampler:
    def __init__(self, eos_token_ids: set[int], seed: int = 0):
        self.eos_token_ids = set(eos_token_ids)
        self.seed = seed
        self._generators: dict = {}  # device -> generator of the requests without their own seed

    def _banned(self, seq: Sequence) -> list[int]:
        if seq.num_output_tokens >= seq.params.min_tokens:
            return []
        if seq.matcher is not None and seq.matcher.is_accepting():
            return []  # the output matches its grammar: ending now may be all the grammar allows
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

    def _edit(self, logits: torch.Tensor, seqs: list[Sequence], masks=None) -> torch.Tensor:
        """The logits the tokens are chosen from: a copy edited only when some row needs it
        (structured output's masks, allowed ids, bad words, logit bias, penalties, min_tokens bans)."""
        x, edited = logits, False
        if masks is not None:
            x, edited = logits.to(torch.float32, copy=True), True
            masks.apply(x)
        for row, seq in enumerate(seqs):
            p = seq.params
            edits = needs_edits(seq)
            penalties = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
            banned = [t for t in self._banned(seq) if t < logits.shape[-1]]  # ids past the vocab never come
            if (edits or penalties or banned) and not edited:
                x, edited = logits.to(torch.float32, copy=True), True
            if edits:
                apply_edits(x[row], seq)
            if penalties:
                x[row] = _apply_penalties(x[row], seq)
            if banned:
                x[row].index_fill_(0, _ids(banned, logits.device), float("-inf"))  # a scalar: no host-to-device copy
        return x

    def _draw(self, x: torch.Tensor, seqs: list[Sequence], rows: list[int], tokens: torch.Tensor) -> torch.Tensor:
        """tokens with the sampled rows' tokens drawn: argmax(probs / E), E ~ Exp(1), all rows in
        one pass; the requests with a seed draw their E from their own generator (a row each,
        so a seeded request's tokens do not depend on its batch), the others from one draw."""
        dev = x.device
        idx = _ids(rows, dev)
        params = [seqs[r].params for r in rows]
        probs = torch.softmax(_filter_rows(x.index_select(0, idx).float(), params), -1)
        noise = torch.empty_like(probs)
        shared = [i for i, p in enumerate(params) if p.seed is None]
        if shared:
            gen = self._generator(seqs[rows[shared[0]]], dev)
            if len(shared) == len(rows):
                noise.exponential_(generator=gen)
            else:
                noise.index_copy_(0, _ids(shared, dev), torch.empty(len(shared), probs.shape[1], device=dev)
                                  .exponential_(generator=gen))
        for i, p in enumerate(params):
            if p.seed is not None:
                noise[i].exponential_(generator=self._generator(seqs[rows[i]], dev))
        return tokens.index_copy(0, idx, (probs / noise).argmax(dim=-1).to(tokens.dtype))

    def sample(self, logits: torch.Tensor, seqs: list[Sequence], prompt: PromptRows | None = None,
               masks=None) -> list[SampleResult]:
        """logits [S, V] for S requests, in order (then prompt.num_rows rows predicting prompt
        tokens, when `prompt` is given: their logprobs go to prompt.results). Greedy rows are
        decided in one batched argmax; only rows with edits or sampling take a row of work.
        A sampled token is argmax(probs / E) with E ~ Exp(1) drawn from the request's
        generator: a draw from probs without a host round trip. Logprobs are raw (engine.logprobs).
        masks: engine.structured.masks.StepMasks of the constrained rows, or None."""
        return self.launch(logits, seqs, prompt, masks).result()

    def launch(self, logits: torch.Tensor, seqs: list[Sequence], prompt: PromptRows | None = None,
               masks=None, plain: bool = False) -> "PendingSamples":
        """sample() without waiting: the device work is queued and its results start their
        copy to the host; PendingSamples.tokens (on the device) can feed the next step.
        plain: no row has edits, penalties or bans (the caller checked), so none are looked for.
        logits may be in the model's dtype: one fused pass (llm_kernels.logits_summary) gives every
        row's argmax, the log-sum-exp of its raw logits and whether they are finite, so a
        step of greedy rows without edits or logprobs makes no other pass over the vocabulary."""
        n = len(seqs)
        prompt_logits, logits = logits[n:], logits[:n]
        dev = logits.device
        tokens, packed, lse = llm_kernels.logits_summary(logits)
        x = logits if plain else self._edit(logits, seqs, masks)
        sampled = [row for row, seq in enumerate(seqs) if not seq.params.greedy]
        if x is not logits:
            tokens = x.argmax(dim=-1)
        if sampled:
            tokens = self._draw(x, seqs, sampled, tokens)
        if x is not logits or sampled:  # the chosen tokens' raw logprobs, from the same lse
            chosen = logits.gather(1, tokens.unsqueeze(1)).squeeze(1).float() - lse
            packed = torch.stack([tokens.double(), chosen.double(), packed[:, 2]], 1)
        parts = [packed.flatten()]
        asked = [row for row, seq in enumerate(seqs) if seq.params.logprobs is not None]
        k = max((seqs[r].params.logprobs for r in asked), default=0)
        if asked:  # one gather of the rows that asked
            idx = _ids(asked, dev)
            raw = logits.index_select(0, idx).float() - lse.index_select(0, idx).unsqueeze(1)
            parts += device_parts(raw, tokens.index_select(0, idx), k)
        if prompt is not None:
            parts += _prompt_parts(prompt_logits.float(), prompt)
        return PendingSamples(tokens, torch.cat(parts) if len(parts) > 1 else parts[0], seqs, asked, k, prompt)


class PendingSamples:
    """A step's samples on their way to the host: `tokens` [S] on the device at once,
    result() the SampleResults once the copy is done (the step's one synchronisation)."""

    def __init__(self, tokens: torch.Tensor, packed: torch.Tensor, seqs: list[Sequence], asked: list[int], k: int,
                 prompt: PromptRows | None):
        self.tokens, self.seqs, self.asked, self.k, self.prompt = tokens, seqs, asked, k, prompt
        self.done = None
        if packed.device.type == "cuda":  # into pinned memory without waiting; done marks the copy's end
            host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            host.copy_(packed, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()
            packed = host
        self.packed = packed

    def result(self) -> list[SampleResult]:
        if self.done is not None:
            self.done.synchronize()
        host = self.packed.tolist()
        seqs, asked, k, n = self.seqs, self.asked, self.k, len(self.seqs)
        token_list, chosen_list, finite_list = host[0 : 3 * n : 3], host[1 : 3 * n : 3], host[2 : 3 * n : 3]
        tops, at = read_parts(host, 3 * n, [int(token_list[r]) for r in asked], [seqs[r].params.logprobs for r in asked],
                              k)
        top_of = dict(zip(asked, tops))
        if self.prompt is not None:
            _read_prompt(host, at, self.prompt)
        results = []
        for row in range(n):
            if not finite_list[row]:
                results.append(SampleResult(-1, 0.0, None, error="the model produced NaN or infinite logits"))
                continue
            results.append(SampleResult(int(token_list[row]), chosen_list[row], top_of.get(row)))
        return results


def _prompt_targets(prompt: PromptRows) -> list[int]:
    return [t for seq, first, count in prompt.entries for t in seq.prompt_token_ids[first : first + count]]


def _prompt_parts(logits: torch.Tensor, prompt: PromptRows) -> list[torch.Tensor]:
    """device_parts of the rows predicting prompt tokens (k: the largest prompt_logprobs asked)."""
    k = max(seq.params.prompt_logprobs for seq, _, _ in prompt.entries)
    targets = _ids(_prompt_targets(prompt), logits.device)
    return device_parts(torch.log_softmax(logits, dim=-1), targets, k)


def _read_prompt(host: list[float], at: int, prompt: PromptRows) -> None:
    k = max(seq.params.prompt_logprobs for seq, _, _ in prompt.entries)
    ks = [seq.params.prompt_logprobs for seq, _, count in prompt.entries for _ in range(count)]
    positions, _ = read_parts(host, at, _prompt_targets(prompt), ks, k)
    i = 0
    for _, _, count in prompt.entries:
        prompt.results.append(positions[i : i + count])
        i += count
