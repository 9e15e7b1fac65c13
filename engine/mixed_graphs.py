"""CUDA graphs for the steps that are not pure decode: prefill chunks, alone or beside
decodes (chunked prefill under load). One graph per token count of a ladder up to
max_cudagraph_tokens, over the model's body (embedding to the final norm); the logits
of the rows that sample are computed eagerly after it, since their number varies.

A step of T tokens in n sequences replays the graph of the smallest token count Tb >= T,
whose inputs hold S = max_num_seqs + 1 sequence slots: the Tb - T padding tokens form one
more sequence (KV slot -1, so nothing is written; it attends to Tb - T positions of its
block-table row, which only ever holds real block ids: finite values, rows of their own),
and the slots after it are empty sequences. Every per-step fact is in device tensors and
the prefill attention's grid follows the tensors' shapes only (llm_kernels.attention), so one
graph serves any split of its tokens into sequences.

Larger steps run eagerly: at thousands of tokens a step is compute-bound and its
launches hide under the GEMMs, while the padding to a coarse ladder would not.
Graphs share the decode graphs' memory pool (a step replays one graph at a time). With
adapters enabled each token count has a graph with the LoRA kernels and one without, as
engine.cuda_graph's decode graphs."""
from __future__ import annotations

import logging
import time
from functools import partial

import torch

from engine.cuda_graph import warm_and_capture
from engine.model.layers import ForwardContext, forward_context

log = logging.getLogger(__name__)


def token_ladder(max_tokens: int) -> list[int]:
    """16, 32, 64, 128, then every 64 up to max_tokens (which is always included)."""
    sizes = [t for t in (16, 32, 64) if t < max_tokens]
    sizes += list(range(128, max_tokens, 64))
    return sizes + [max_tokens]


class MixedGraphs:
    """Graphs of the model body for steps of up to max_tokens tokens in at most
    max_seqs sequences, over persistent inputs filled by copy_inputs."""

    def __init__(self, model, device, max_tokens: int, max_seqs: int, table_width: int, lora: bool = False):
        self.model = model
        self.device = device
        self.sizes = token_ladder(max_tokens)
        self.max_tokens = self.sizes[-1]
        self.slots_n = max_seqs + 1  # sequence slots: the real ones and the padding sequence
        T, S, dev = self.max_tokens, self.slots_n, device
        self.ids = torch.zeros(T, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(T, dtype=torch.int64, device=dev)
        self.slots = torch.full((T,), -1, dtype=torch.int64, device=dev)
        self.ctx = torch.zeros(S, dtype=torch.int32, device=dev)
        self.qsl = torch.zeros(S + 1, dtype=torch.int32, device=dev)
        self.tables = torch.zeros(S, table_width, dtype=torch.int32, device=dev)
        self.lora = torch.full((T,), -1, dtype=torch.int32, device=dev) if lora else None  # tokens' adapter slots
        self.variants = (True, False) if lora else (False,)  # with the LoRA kernels or without
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        self.replays = 0  # steps run by a graph here

    def _forward(self, tb: int, adapters: bool = False) -> torch.Tensor:
        ctx = ForwardContext(slot_mapping=self.slots[:tb], block_tables=self.tables, context_lens=self.ctx,
                             query_start_loc=self.qsl, is_decode=False, lora_slots=self.lora[:tb] if adapters else None)
        with forward_context(ctx):
            return self.model(self.ids[:tb], self.pos[:tb])

    def _dummy_inputs(self, tb: int) -> None:
        """One sequence of tb tokens attending to block 0, writing nothing."""
        self.slots.fill_(-1)
        if self.lora is not None:
            self.lora.fill_(-1)
        self.pos[:tb] = torch.arange(tb, device=self.device)
        self.qsl.fill_(tb)
        self.qsl[0] = 0
        self.ctx.zero_()
        self.ctx[0] = tb
        self.tables.zero_()

    @torch.inference_mode()
    def capture(self, pool=None) -> None:
        """Largest token count first; each runs eagerly first, so its kernels compile and
        tune (the GEMMs' M buckets) outside the capture."""
        t0 = time.monotonic()
        pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for tb in reversed(self.sizes):
            self._dummy_inputs(tb)
            for adapters in self.variants:
                self.graphs[tb, adapters] = warm_and_capture(partial(self._forward, tb, adapters), self.device,
                                                             pool, stream)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.monotonic() - t0
        log.info("captured %d mixed-step CUDA graphs (%d..%d tokens%s) in %.1fs", len(self.graphs), self.sizes[0],
                 self.max_tokens, ", with and without adapters" if len(self.variants) > 1 else "", self.capture_seconds)

    def can_run(self, num_tokens: int, num_seqs: int) -> bool:
        return num_tokens <= self.max_tokens and num_seqs < self.slots_n

    def padded_tokens(self, n: int) -> int:
        """The token count of the graph that runs a step of n tokens."""
        return next(t for t in self.sizes if t >= n)

    def copy_inputs(self, host, tokens: int, tb: int, n_seqs: int, cols: int, adapters: bool = False) -> None:
        """Pad a step's host inputs (engine.runner.HostBuffers: tokens tokens in n_seqs
        sequences, cols block-table columns) to tb tokens and every sequence slot, then
        copy them (asynchronously) into the persistent inputs (the tokens' adapter slots
        when adapters: some token uses one)."""
        S = self.slots_n
        host.ids[tokens:tb] = 0
        host.pos[tokens:tb] = 0
        host.slots[tokens:tb] = -1
        host.ctx[n_seqs] = tb - tokens  # the padding sequence; the slots after it are empty
        host.ctx[n_seqs + 1 : S] = 0
        host.qsl[n_seqs + 1 : S + 1] = tb
        self.ids[:tb].copy_(host.ids_t[:tb], non_blocking=True)
        self.pos[:tb].copy_(host.pos_t[:tb], non_blocking=True)
        self.slots[:tb].copy_(host.slots_t[:tb], non_blocking=True)
        self.ctx.copy_(host.ctx_t[:S], non_blocking=True)
        self.qsl.copy_(host.qsl_t[: S + 1], non_blocking=True)
        self.tables[:n_seqs, :cols].copy_(host.table_t[: n_seqs * cols].view(n_seqs, cols), non_blocking=True)
        if adapters:
            host.lora[tokens:tb] = -1
            self.lora[:tb].copy_(host.lora_t[:tb], non_blocking=True)

    def replay(self, tb: int, adapters: bool = False) -> torch.Tensor:
        """The hidden states [tb, hidden] of the copied-in step (a view of the graph's output),
        from the graph with the LoRA kernels when adapters."""
        graph, out = self.graphs[tb, adapters]
        graph.replay()
        self.replays += 1
        return out
