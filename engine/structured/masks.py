"""One step's token masks. The engine calls start() before it launches the forward, so
llguidance computes the masks of the constrained requests (on a helper thread that
releases the GIL, in llguidance's parallel threads, into a reused host buffer, pinned on
CUDA) while the host launches the model and the device runs it; the sampler then takes
them (the future's result()), copies them to the device and applies them
(llm_kernels.apply_token_bitmask). A step with no constrained request does nothing here.
After sampling, advance() feeds each constrained request its token."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

import llm_kernels
from engine.sequence import Sequence


@dataclass(slots=True)
class StepMasks:
    rows: list[int]  # sampler rows (indices into the step's sampling requests) that are constrained
    rows_t: torch.Tensor  # the same, host int64 (pinned on CUDA)
    bitmask: torch.Tensor  # host int32 [len(rows), words] (pinned on CUDA)

    def apply(self, logits: torch.Tensor) -> None:
        """Ban, in place, what each constrained row's grammar does not allow next."""
        rows, mask = self.rows_t, self.bitmask
        if logits.device.type != "cpu":  # asynchronous copies out of pinned memory
            rows, mask = rows.to(logits.device, non_blocking=True), mask.to(logits.device, non_blocking=True)
        llm_kernels.apply_token_bitmask(logits, rows, mask)


class MaskFiller:
    """The engine's mask computation: llguidance's thread pool and the host buffer."""

    def __init__(self, vocab_size: int, pin: bool, threads: int | None = None):
        self.words = -(-vocab_size // 32)
        self.pin = pin
        self.threads = threads
        self._executor = None
        self._thread = None  # the helper thread start() runs fill() on
        self._buf = torch.empty(0, self.words, dtype=torch.int32)
        self._rows = torch.empty(0, dtype=torch.int64)

    def _buffers(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the previous step's copies out of them are done: that step ended with a synchronisation
        if self._buf.shape[0] < rows:
            size = max(rows, 2 * self._buf.shape[0])
            self._buf = torch.empty(size, self.words, dtype=torch.int32, pin_memory=self.pin)
            self._rows = torch.empty(size, dtype=torch.int64, pin_memory=self.pin)
        return self._buf[:rows], self._rows[:rows]

    def fill(self, seqs: list[Sequence]) -> StepMasks | None:
        """The masks of the constrained ones among a step's sampling requests (None: none is)."""
        rows = [row for row, seq in enumerate(seqs) if seq.matcher is not None]
        if not rows:
            return None
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor(self.threads)
        buf, rows_t = self._buffers(len(rows))
        rows_t.numpy()[:] = rows
        self._executor.unsafe_compute_mask_ptr([(seqs[row].matcher, i) for i, row in enumerate(rows)],
                                               buf.data_ptr(), self.words * 4, len(rows))
        return StepMasks(rows, rows_t, buf)

    def start(self, seqs: list[Sequence]) -> Future | None:
        """fill(seqs) begun on the helper thread (None: no request of the step is constrained).
        The matchers are not touched by the engine until result() returns."""
        if not any(seq.matcher is not None for seq in seqs):
            return None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="token-masks")
        return self._thread.submit(self.fill, seqs)  # .result(): the StepMasks, or what fill() raised


def advance(seq: Sequence, token_id: int) -> str | None:
    """Feed a constrained request its sampled token. Returns "done" when the grammar is
    complete (nothing may follow), "error" when the token broke it, else None."""
    matcher = seq.matcher
    if not matcher.consume_token(token_id):
        return "error"
    return "done" if matcher.is_stopped() else None
