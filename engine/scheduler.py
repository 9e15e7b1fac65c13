"""Continuous batching: each step gives requests tokens within one budget,
running ones first (decodes, then unfinished prefill chunks), then waiting
ones in (priority, arrival) order; preemption by recompute when blocks run out.
The scheduler owns the KV block manager and updates requests from each step's output."""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.sequence import Sequence, SequenceStatus

LONG_ROPE_SALT = "\x00longrope"


def use_long_rope(seq: Sequence) -> None:
    """Mark a sequence as rotated with longrope's long factors; its KV blocks then
    hash apart from the same tokens rotated with the short ones."""
    seq.long_rope = True
    seq.cache_salt = f"{seq.cache_salt or ''}{LONG_ROPE_SALT}"


@dataclass(slots=True)
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (seq, new tokens)
    preempted: list[Sequence] = field(default_factory=list)
    expired: list[int] = field(default_factory=list)  # blocks whose TTL passed: their KV is to be zeroed

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: list[Sequence] = []  # sorted by sort_key
        self.running: list[Sequence] = []  # sorted by sort_key
        self.num_preemptions = 0
        # longrope: the length past which a sequence is rotated with the long factors
        # (set by the engine from the model); None: no such switch
        self.rope_switch: int | None = None
        self.num_rope_recomputes = 0
        # every layer sliding: the widest window; blocks below it are released (None: keep all)
        self.window: int | None = None
        self.num_window_released = 0
        self.lora = None  # engine.lora.manager.LoRAManager when adapters are enabled

    def add(self, seq: Sequence):
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.sort_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _free(self, seq: Sequence) -> None:
        """Its KV blocks and its adapter's slot go back."""
        self.bm.free_seq(seq)
        self._release_lora(seq)

    def _release_lora(self, seq: Sequence) -> None:
        if seq.lora_slot >= 0:
            self.lora.release(seq.lora_slot)
            seq.lora_slot = -1

    def _lora_slot(self, seq: Sequence) -> bool:
        """A waiting request's adapter in a device slot (False: every slot is in use: it waits)."""
        if seq.lora_request is None or seq.lora_slot >= 0:
            return True
        slot = self.lora.acquire(seq.lora_request.lora_int_id)
        seq.lora_slot = -1 if slot is None else slot
        return slot is not None

    def _preempt(self, seq: Sequence, out: SchedulerOutput):
        seq.spec_token_ids = []
        self.running.remove(seq)
        self._free(seq)
        seq.num_preemptions += 1
        seq.preempted_time = time.monotonic()
        self.num_preemptions += 1
        out.preempted.append(seq)
        self.add(seq)

    def _recompute_long(self, seq: Sequence) -> None:
        """A sequence that grew past longrope's switch: its KV (rotated with the short
        factors) is dropped and recomputed with the long ones, as transformers' Phi-3 does
        when it crosses; it waits again, ahead of later arrivals by its sort key."""
        self.running.remove(seq)
        self._free(seq)
        use_long_rope(seq)
        self.num_rope_recomputes += 1
        self.add(seq)

    def schedule(self) -> SchedulerOutput:
        expired = self.bm.expire() if self.bm.ttl_s is not None else []
        out = self._schedule()
        out.expired = expired
        now = time.monotonic()
        for seq, _ in out.scheduled:
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = now
        return out

    def _schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if self.rope_switch is not None and not seq.long_rope and seq.num_tokens > self.rope_switch:
                self._recompute_long(seq)
                continue
            if self.window is not None:
                self.num_window_released += self.bm.release_outside_window(seq, self.window)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            assert n > 0
            if seq.spec_token_ids:
                n = self._with_drafts(seq, budget)
            while not self.bm.allocate_slots(seq, n):
                victim = self.running[-1]  # lowest priority, latest arrival
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, n))
                budget -= n
                i += 1
        if out.preempted:
            return out  # no admissions while memory is short
        i = 0
        while i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[i]
            if not self._lora_slot(seq):
                i += 1  # its adapter waits for a slot; the requests behind it go ahead
                continue
            if self.rope_switch is not None and not seq.long_rope and seq.num_tokens > self.rope_switch:
                use_long_rope(seq)  # preempted past the switch: recomputed with the long factors
            computed, n = self._admission(seq, budget)
            if not self.bm.allocate_slots(seq, n, computed):
                self._release_lora(seq)
                break
            if self.window is not None:  # a cached prefix longer than the window: only its tail is kept
                self.num_window_released += self.bm.release_outside_window(seq, self.window)
            self.bm.record_query(seq.num_tokens, len(computed) * self.bm.block_size)
            self.waiting.pop(i)
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=lambda s: s.sort_key)
            out.scheduled.append((seq, n))
            budget -= n
        return out

    def _with_drafts(self, seq: Sequence, budget: int) -> int:
        """A decoding request's tokens with its drafts (engine.spec_decode): drafts count against
        the budget and are cut to what it and the free blocks hold; drafts never preempt anyone."""
        drafts = seq.spec_token_ids[: budget - 1]
        while drafts and not self.bm.can_allocate(seq, 1 + len(drafts)):
            drafts = drafts[:-1]
        seq.spec_token_ids = drafts
        return 1 + len(drafts)

    def _admission(self, seq: Sequence, budget: int) -> tuple[list[int], int]:
        """A waiting request's cached prefix blocks and the tokens of its first chunk."""
        # prompt_logprobs need every prompt position's logits: no prefix hit (as vLLM)
        cached = not seq.block_table and seq.params.prompt_logprobs is None
        computed = self.bm.get_computed_blocks(seq) if cached else []
        num_computed = seq.num_computed_tokens + len(computed) * self.bm.block_size
        return computed, min(seq.num_tokens - num_computed, budget)

    def can_admit(self, running_tokens: int) -> bool:
        """Would a schedule now admit the first waiting request, beside running_tokens of
        the running ones (no preemption)? (engine.async_scheduling runs ahead while not.)"""
        budget = self.max_num_batched_tokens - running_tokens
        if not self.waiting or budget <= 0 or len(self.running) >= self.max_num_seqs:
            return False
        seq = self.waiting[0]
        if seq.lora_request is not None and not self.lora.can_acquire(seq.lora_request.lora_int_id):
            return False
        computed, n = self._admission(seq, budget)
        return self.bm.can_allocate(seq, n, computed)

    def update_from_output(self, scheduled: list[tuple[Sequence, int]], samples: list) -> list[tuple[Sequence, object]]:
        """After a step ran `scheduled` (samples[i]: scheduled[i]'s SampleResult, None for a
        prefill chunk that samples nothing): computed tokens advance, newly full blocks enter
        the prefix cache, sampled tokens are appended. Returns the (request, sample) pairs that
        sampled; a sample with an error (unusable logits) appends nothing."""
        sampled = []
        now = time.monotonic()
        for (seq, n), sample in zip(scheduled, samples):
            if isinstance(sample, list):  # a verified run (engine.spec_decode.verify): its tokens join
                self._take_run(seq, n, sample, now)  # first, so the blocks cached hash real tokens
                sampled.append((seq, sample))
                continue
            self.advance(seq, n)
            if sample is not None:
                self.append_sample(seq, sample, now)
                sampled.append((seq, sample))
        return sampled

    def _take_run(self, seq: Sequence, n: int, run: list, now: float) -> None:
        """A verify step's accepted run joins seq: the computed tokens are its last token and the
        accepted drafts; the KV written at rejected drafts' positions lies past them, never cached
        or read, and the next steps overwrite it."""
        accepted = len(run) - 1 if run[-1].error is None else 0
        for sample in run:
            self.append_sample(seq, sample, now)
        self.advance(seq, n - len(seq.spec_token_ids) + accepted)
        seq.spec_token_ids = []

    def advance(self, seq: Sequence, n: int) -> None:
        """n more of seq's tokens are computed (their KV written): newly full blocks are cached."""
        seq.num_computed_tokens += n
        self.bm.cache_full_blocks(seq)

    @staticmethod
    def append_sample(seq: Sequence, sample, now: float) -> None:
        """seq's sampled token joins it (a sample with an error appends nothing)."""
        if sample.error is None:
            if seq.first_token_time is None:
                seq.first_token_time = now
            seq.token_ids.append(sample.token_id)
            seq.cumulative_logprob += sample.logprob
            if seq.logprobs is not None:
                seq.logprobs.append(sample.top_logprobs)

    def stats(self) -> dict:
        bm = self.bm
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "kv_block_size": bm.block_size,
            "prefix_cache_hit_tokens": bm.hit_tokens,
            "prefix_cache_query_tokens": bm.query_tokens,
            "prefix_cache_hit_rate": bm.hit_tokens / bm.query_tokens if bm.query_tokens else 0.0,
            "num_preemptions": self.num_preemptions,
            "num_rope_recomputes": self.num_rope_recomputes,
            "kv_blocks_released_by_window": self.num_window_released,
        }

    def finish(self, seq: Sequence):
        """Remove a finished or aborted request and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.status = SequenceStatus.FINISHED
