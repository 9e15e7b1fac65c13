"""The engine's speculation policy, step by step: which requests draft (not above the
batch-size switch, not a request that opted out or a seeded sampled one, not one whose
drafts keep failing), the drafts themselves, and the counters behind stats() and each
request's metrics."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.sequence import Sequence
from engine.spec_decode.config import SpeculativeConfig
from engine.spec_decode.ngram import NgramIndex
from engine.spec_decode.verify import grammar_rows

PLACEHOLDER = -1  # a draft slot the scheduler sizes before the draft model fills it


@dataclass(slots=True)
class SpecState:
    """One request's speculation: its n-gram index and counters."""
    index: NgramIndex
    draft_tokens: int = 0  # drafted tokens verified, in all
    accepted_tokens: int = 0  # of them accepted
    window_drafted: int = 0  # since the last acceptance check
    window_accepted: int = 0
    paused_until: int = 0  # no drafts before this step
    pause: int = 0  # steps of its last pause (doubling while its windows keep failing)
    matchers: list = field(default_factory=list)  # its grammar's state after each draft (structured output)
    draft_kv: int = 0  # draft_model: its tokens with the draft model's KV written
    draft_kv_preemptions: int = -1  # its preemptions when that KV was written (another count: freed since)


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int, drafter=None):
        """drafter: engine.spec_decode.draft_model.DraftModel for method draft_model (else prompt lookup)."""
        self.config = config
        self.max_model_len = max_model_len
        self.drafter = drafter
        self.step = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.verify_steps = 0  # steps that verified drafts
        self.drafting_requests = 0  # request-steps that verified drafts
        self.paused = 0  # times a request's drafts were paused for low acceptance

    def eligible(self, seq: Sequence) -> bool:
        """May this request speculate at all? A seeded sampled request never does: its seed's
        draws then follow its own tokens only, whatever else the batch holds."""
        p = seq.params
        if p.speculative is False or (self.config.opt_in and p.speculative is not True):
            return False
        return p.seed is None or p.greedy

    def _state(self, seq: Sequence) -> SpecState | None:
        if seq.spec is None and self.eligible(seq):
            c = self.config
            seq.spec = SpecState(NgramIndex(c.prompt_lookup_min, c.prompt_lookup_max))
        return seq.spec

    def _room(self, seq: Sequence) -> int:
        """Drafts that fit: every accepted one and the token after it stay within max_tokens
        and the context."""
        return min(self.config.num_speculative_tokens, seq.max_tokens - seq.num_output_tokens - 1,
                   self.max_model_len - seq.num_tokens - 1)

    def on_for(self, running: list[Sequence]) -> bool:
        """The batch-size switch: no drafts in a step of more running requests than disable_by_batch_size."""
        return len(running) <= self.config.disable_by_batch_size

    def wanted(self, running: list[Sequence]) -> bool:
        """Would a step of these running requests draft? (Asynchronous scheduling then waits.)"""
        return self.on_for(running) and any(
            self.eligible(s) and (s.spec is None or s.spec.paused_until <= self.step) for s in running)

    def propose(self, running: list[Sequence]) -> None:
        """Set each running request's drafts for the coming step (none for most)."""
        self.step += 1
        on = self.on_for(running)
        for seq in running:
            seq.spec_token_ids = []
            state = self._state(seq)  # made once it runs: its counters report 0 while it never drafts
            if state is None or not on or seq.num_tokens - seq.num_computed_tokens != 1:
                continue  # not speculating, above the switch, or still prefilling
            if state.paused_until > self.step:
                continue
            k = self._room(seq)
            if k <= 0:
                continue
            if self.drafter is not None:  # placeholders the scheduler fits; fill() makes them drafts
                seq.spec_token_ids = [PLACEHOLDER] * k
                continue
            drafts = self.draft(seq, k)
            if drafts and seq.matcher is not None:
                drafts, state.matchers = grammar_rows(seq.matcher, drafts)
            seq.spec_token_ids = drafts

    def draft(self, seq: Sequence, k: int) -> list[int]:
        """Up to k tokens the method guesses will follow seq's."""
        return seq.spec.index.propose(seq.token_ids, k)

    def fill(self, scheduled: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
        """draft_model: the scheduled requests' placeholders become the draft model's tokens (cut
        where a structured output's grammar rejects one); the schedule with each verify run's length."""
        seqs = [seq for seq, _ in scheduled if seq.spec_token_ids]
        if self.drafter is None or not seqs:
            return scheduled
        self.drafter.fill(seqs)
        for seq in seqs:
            if seq.matcher is not None:
                seq.spec_token_ids, seq.spec.matchers = grammar_rows(seq.matcher, seq.spec_token_ids)
        drafting = {id(seq) for seq in seqs}
        return [(seq, 1 + len(seq.spec_token_ids)) if id(seq) in drafting else (seq, n) for seq, n in scheduled]

    def record(self, seqs: list[Sequence], runs: list) -> None:
        """Count a verify step's drafts and accepted tokens (runs: engine.spec_decode.verify.accepted_runs)."""
        any_drafts = False
        for seq, run in zip(seqs, runs):
            drafted = len(seq.spec_token_ids)
            if not drafted:
                continue
            any_drafts = True
            accepted = len(run) - 1 if run[-1].error is None else 0
            state = seq.spec
            state.draft_tokens += drafted
            state.accepted_tokens += accepted
            state.window_drafted += drafted
            state.window_accepted += accepted
            self.draft_tokens += drafted
            self.accepted_tokens += accepted
            self.drafting_requests += 1
            self._check_acceptance(state)
        self.verify_steps += any_drafts

    def _check_acceptance(self, state: SpecState) -> None:
        """After a window of drafted tokens: a request accepting too few pauses its drafts for as
        many steps, twice as many after each further failing window (up to 64 windows); a window
        that passes ends the doubling."""
        c = self.config
        if state.window_drafted < c.acceptance_window:
            return
        if state.window_accepted < c.min_acceptance_rate * state.window_drafted:
            state.pause = min(2 * state.pause, 64 * c.acceptance_window) if state.pause else c.acceptance_window
            state.paused_until = self.step + state.pause
            self.paused += 1
        else:
            state.pause = 0
        state.window_drafted = state.window_accepted = 0

    def stats(self) -> dict:
        d = self.draft_tokens
        return {
            "spec_draft_tokens": d,
            "spec_accepted_tokens": self.accepted_tokens,
            "spec_acceptance_rate": self.accepted_tokens / d if d else 0.0,
            "spec_verify_steps": self.verify_steps,
            "spec_verify_requests": self.drafting_requests,  # request-steps that verified drafts
            # tokens a request gained per verify it took part in: accepted drafts + the one it always gets
            "spec_tokens_per_verify": (self.accepted_tokens / self.drafting_requests + 1) if self.drafting_requests else 0.0,
            "spec_paused_requests": self.paused,
        }
