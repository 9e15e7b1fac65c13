"""Asynchronous scheduling of steady decoding (vLLM v1's async scheduling idea).

While decode step t runs on the device, the host schedules and launches step t + 1,
whose input tokens are step t's samples read on the device (never waited for), and only
then waits for step t's results and postprocesses them (detokenizing, stop checks) while
step t + 1 runs. The one host synchronisation per step stays one, off the critical path:
the device always has the next step queued.

It covers decode steps where nothing about step t + 1 depends on what the host has not
seen yet: no structured output (its masks follow the token), no penalties or logits
edits (they read the history), min_tokens already met, no waiting request that would be
admitted now (admission and chunked prefill run in an ordinary synchronous step; one that
cannot be admitted yet, for KV blocks or max_num_seqs, lets the running ones go ahead). Any other step runs
synchronously, so every feature keeps its exact behaviour. A request that ends in step t
(EOS, a stop string, an abort) had step t + 1 computed too: that sample is dropped; its
KV write lands at a position past its end, in a block not in the prefix cache."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from engine.logits_processors import needs_edits
from engine.sampler import PendingSamples
from engine.sequence import Sequence, SequenceStatus

log = logging.getLogger(__name__)


@dataclass(slots=True)
class InflightStep:
    """A launched decode step whose samples have not reached the host yet."""
    scheduled: list[tuple[Sequence, int]]
    pending: PendingSamples


def can_run_ahead(seq: Sequence) -> bool:
    """True when seq's next step can be launched before its current sample is known."""
    p = seq.params
    return (seq.matcher is None and not needs_edits(seq) and (seq.parent is None or not seq.parent.held) and p.repetition_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty and seq.num_output_tokens >= p.min_tokens
            and (seq.prompt_logprobs is None or len(seq.prompt_logprobs) >= seq.num_prompt_tokens))


class AsyncScheduling:
    """The engine's pipelined decode steps (LLMEngine.step hands them here)."""

    def __init__(self, engine):
        self.engine = engine
        self.inflight: InflightStep | None = None
        self.num_steps = 0  # decode steps launched ahead of their predecessor's results

    def can_start(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """A synchronously scheduled step that may instead be launched and left running."""
        return all(n == 1 and can_run_ahead(seq) for seq, n in scheduled)

    def start(self, scheduled: list[tuple[Sequence, int]]) -> bool:
        """Launch a synchronously scheduled decode step and leave it running; False when it
        ran out of memory (the engine then runs it synchronously, one request at a time if need be)."""
        self.inflight = self._try_launch(scheduled, None)
        return self.inflight is not None

    def step(self) -> list:
        """Launch the successor of the step in flight (when it can go ahead), then wait for
        the step in flight and postprocess it. Returns its outputs."""
        cur = self.inflight
        self.inflight = self._launch_next(cur)
        outputs = self._complete(cur)
        nxt = self.inflight
        if nxt is not None and all(seq.status is SequenceStatus.FINISHED for seq, _ in nxt.scheduled):
            self.inflight = None  # every request in it ended: nothing of it is used
            self._complete(nxt)
        return outputs

    def _launch(self, scheduled: list[tuple[Sequence, int]], input_ids: torch.Tensor | None) -> InflightStep:
        eng = self.engine
        seqs = [seq for seq, _ in scheduled]
        logits = eng.runner.execute(scheduled, input_ids=input_ids)
        pending = eng.sampler.launch(logits, seqs, plain=True)  # every row passed can_run_ahead
        eng.step_count += 1
        for seq, n in scheduled:
            eng.scheduler.advance(seq, n)  # its next token is in `pending`, not yet in token_ids
        return InflightStep(scheduled, pending)

    def _launch_next(self, cur: InflightStep) -> InflightStep | None:
        """Step t + 1 of the requests of step t that go on, or None when it must wait for
        step t's results: a request to admit, one that cannot run ahead, or no blocks."""
        eng = self.engine
        sched = eng.scheduler
        rows, scheduled = [], []
        members = set()
        for i, (seq, _) in enumerate(cur.scheduled):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # finished or aborted since it was launched
            members.add(seq)
            # its pending token surely ends it (max_tokens or the model's length): no step t + 1
            if seq.num_output_tokens + 1 >= seq.max_tokens or seq.num_tokens + 1 >= eng.max_model_len:
                continue
            if not can_run_ahead(seq):
                return None
            rows.append(i)
            scheduled.append((seq, 1))
        if not scheduled or any(seq not in members for seq in sched.running):
            return None
        if eng.speculator is not None and eng.speculator.wanted(sched.running):
            return None  # a step that would draft waits for its tokens: speculation wins over running ahead
        for seq, _ in scheduled:
            if not sched.bm.allocate_slots(seq, 1):  # a block already given stays its (the next step uses it)
                return None
        if sched.can_admit(len(scheduled)):  # a waiting request fits: admitted in a synchronous step
            return None
        ids = cur.pending.tokens
        if len(rows) < len(cur.scheduled):
            idx = torch.tensor(rows, dtype=torch.long, pin_memory=ids.device.type == "cuda")
            ids = ids.index_select(0, idx.to(ids.device, non_blocking=True))
        nxt = self._try_launch(scheduled, ids)
        self.num_steps += nxt is not None
        return nxt

    def _try_launch(self, scheduled, input_ids) -> InflightStep | None:
        try:
            return self._launch(scheduled, input_ids)
        except torch.OutOfMemoryError:
            log.warning("out of memory launching a decode step ahead; it runs synchronously instead")
            self.engine._empty_cache()
            return None

    def _complete(self, cur: InflightStep) -> list:
        """Wait for cur's samples; the requests still running take theirs (as a synchronous
        step's postprocessing does)."""
        eng = self.engine
        samples = cur.pending.result()
        now = time.monotonic()
        outputs = []
        for (seq, _), sample in zip(cur.scheduled, samples):
            if seq.status is SequenceStatus.FINISHED:
                continue  # it ended after this step was launched: the sample is dropped
            eng.scheduler.append_sample(seq, sample, now)
            outputs.append(eng._postprocess(seq, sample))
        return eng._gather(outputs) if eng.parents else outputs
