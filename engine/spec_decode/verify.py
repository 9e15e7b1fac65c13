"""A verify step's sampler rows and its accepted runs.

A request with drafts d_0..d_{k-1} is scheduled for k + 1 positions: its last token and
the drafts. Each position's logits become one sampler row, seen through a DraftView: the
request as it would be after the drafts before that position (its output so far for the
penalties, min_tokens and bad words; its grammar's state for structured output). The
sampler then chooses each row's token exactly as it would without speculation, and the
drafts are accepted while they equal those tokens; the first row whose token differs
(or the last row, when every draft was accepted) gives one more token.

Greedy rows choose the argmax, so the output is the one decoding without speculation gives.
Sampled rows draw from the distribution a plain step would draw from, so an n-gram draft
(p_draft = 1 on its token) is accepted with probability p_target(d), and on rejection the
token drawn is distributed as p_target without d, renormalized: the standard rejection
sampler's min(1, p_target / p_draft) and its residual, for a draft of probability one."""
from __future__ import annotations

from engine.sequence import Sequence


class DraftView:
    """A sampler's view of `seq` after `extra` drafted tokens (a row of a verify step)."""

    __slots__ = ("seq", "extra", "matcher")

    def __init__(self, seq: Sequence, extra: list[int], matcher):
        self.seq, self.extra, self.matcher = seq, extra, matcher

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @property
    def params(self):
        return self.seq.params

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids + self.extra

    @property
    def output_token_ids(self) -> list[int]:
        return self.seq.output_token_ids + self.extra

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_output_tokens + len(self.extra)

    @property
    def generator(self):
        return self.seq.generator

    @generator.setter
    def generator(self, value):
        self.seq.generator = value

    @property
    def device_tensors(self):
        return self.seq.device_tensors

    @device_tensors.setter
    def device_tensors(self, value):
        self.seq.device_tensors = value


def grammar_rows(matcher, drafts: list[int]) -> tuple[list[int], list]:
    """The drafts a request's grammar accepts (cut before the first it refuses or that would
    complete it) and the grammar's state after each of them: the matchers of rows 1..k."""
    states, m = [], matcher
    for j, token in enumerate(drafts):
        m = m.deep_copy()
        if not m.consume_token(token) or m.is_error() or m.is_stopped():
            return drafts[:j], states
        states.append(m)
    return drafts, states


def rows(seqs: list[Sequence]) -> list:
    """The sampler rows of a step's sampling requests: one per request, k + 1 for one with k drafts."""
    out = []
    for seq in seqs:
        out.append(seq)
        drafts = seq.spec_token_ids
        if drafts:
            states = seq.spec.matchers if seq.matcher is not None else None
            out += [DraftView(seq, drafts[:j], states[j - 1] if states else None) for j in range(1, len(drafts) + 1)]
    return out


def accepted_runs(seqs: list[Sequence], samples: list) -> list:
    """Per request, its SampleResult, or for one that verified drafts the list of its accepted
    run: the drafts that equal their rows' tokens, then the first row's token that differs (or
    the last row's). A row of unusable logits in the run makes it that row alone (the request fails)."""
    out, i = [], 0
    for seq in seqs:
        drafts = seq.spec_token_ids
        if not drafts:
            out.append(samples[i])
            i += 1
            continue
        run = []
        for j in range(len(drafts) + 1):
            s = samples[i + j]
            if s.error is not None:
                run = [s]  # the request fails: nothing of this step joins it
                break
            run.append(s)
            if j == len(drafts) or s.token_id != drafts[j]:
                break
        out.append(run)
        i += len(drafts) + 1
    return out


def drop_after_end(seq: Sequence, tail: list) -> None:
    """A run's tokens after the one that ended the request (EOS, a stop string, its grammar's
    end) leave it: the output ends where decoding one token a step would have ended it."""
    if not tail:
        return
    del seq.token_ids[-len(tail):]
    if seq.logprobs is not None:
        del seq.logprobs[-len(tail):]
    seq.cumulative_logprob -= sum(s.logprob for s in tail)
