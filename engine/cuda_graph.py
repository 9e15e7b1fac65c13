"""CUDA graphs for decode steps: one graph per batch size of a ladder up to
max_num_seqs, sharing one memory pool, over persistent device input buffers.

A decode step of n sequences replays the smallest graph of at least n rows;
the rows past n are padding (KV slot -1, context length 0: no write, no
read). The host fills pinned buffers and copies them into the persistent
inputs asynchronously, so a replay never waits for the GPU.

With adapters enabled (engine.lora) each batch size has two graphs: one with the LoRA
kernels, for steps where some sequence uses an adapter, and one without, for steps of base
model requests only, which would otherwise launch every linear's LoRA kernels to find no
adapter row (as vLLM's cudagraph_specialize_lora)."""
from __future__ import annotations

import logging
import time
from functools import partial

import torch

from engine.model.layers import ForwardContext, forward_context

log = logging.getLogger(__name__)


def batch_ladder(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_num_seqs (which is always included)."""
    sizes = [b for b in (1, 2, 4) if b < max_num_seqs]
    sizes += list(range(8, max_num_seqs, 8))
    return sizes + [max_num_seqs]


def warm_and_capture(forward, device, pool, stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """forward() run once eagerly (its kernels compile and tune outside the capture), then
    captured into a graph of the pool: (the graph, its output)."""
    forward()
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = forward()
    return graph, out


class DecodeGraphs:
    """The graphs of one model's decode steps; `replay` copies a step's inputs from
    the runner's host buffers into the persistent inputs, then replays."""

    def __init__(self, model, device, max_batch: int, table_width: int, lora: bool = False):
        self.model = model
        self.device = device
        self.sizes = batch_ladder(max_batch)
        self.max_batch = self.sizes[-1]
        dev = device
        W = table_width
        self.ids = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(self.max_batch, dtype=torch.int64, device=dev)
        self.slots = torch.full((self.max_batch,), -1, dtype=torch.int64, device=dev)
        self.ctx = torch.zeros(self.max_batch, dtype=torch.int32, device=dev)
        self.qsl = torch.arange(self.max_batch + 1, dtype=torch.int32, device=dev)
        self.tables = torch.zeros(self.max_batch, W, dtype=torch.int32, device=dev)
        # each row's adapter slot (engine.lora), an input of every graph when adapters are enabled
        self.lora = torch.full((self.max_batch,), -1, dtype=torch.int32, device=dev) if lora else None
        self.variants = (True, False) if lora else (False,)  # with the LoRA kernels or without
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None  # the graphs' memory pool (engine.mixed_graphs captures into it too)
        self.capture_seconds = 0.0

    def _context(self, bs: int, adapters: bool) -> ForwardContext:
        return ForwardContext(slot_mapping=self.slots[:bs], block_tables=self.tables[:bs],
                              context_lens=self.ctx[:bs], query_start_loc=self.qsl[: bs + 1],
                              is_decode=True, lora_slots=self.lora[:bs] if adapters else None)

    def _forward(self, bs: int, adapters: bool = False) -> torch.Tensor:
        model = self.model
        with forward_context(self._context(bs, adapters)):
            return model.compute_logits(model(self.ids[:bs], self.pos[:bs]))

    @torch.inference_mode()
    def capture(self):
        """Largest batch first, so the smaller graphs fit in the pool it made.
        Each size runs eagerly first: kernels compile and tune outside capture."""
        t0 = time.monotonic()
        pool = self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        for bs in reversed(self.sizes):
            for adapters in self.variants:
                self.graphs[bs, adapters] = warm_and_capture(partial(self._forward, bs, adapters), self.device, pool,
                                                             stream)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.monotonic() - t0
        log.info("captured %d decode CUDA graphs (batch %d..%d%s) in %.1fs", len(self.graphs), self.sizes[0],
                 self.max_batch, ", with and without adapters" if len(self.variants) > 1 else "", self.capture_seconds)

    def can_run(self, scheduled) -> bool:
        return len(scheduled) <= self.max_batch and all(n == 1 for _, n in scheduled)

    def padded_size(self, n: int) -> int:
        """The batch of the graph that runs a decode step of n sequences."""
        return next(b for b in self.sizes if b >= n)

    def copy_inputs(self, host, bs: int, cols: int, adapters: bool = False) -> None:
        """Copy (asynchronously) a decode step's inputs into the persistent ones: `host`
        (engine.runner.HostBuffers) holds them for bs rows and cols block-table columns;
        adapters: some row uses one (its graph reads the rows' slots)."""
        self.ids[:bs].copy_(host.ids_t[:bs], non_blocking=True)
        self.pos[:bs].copy_(host.pos_t[:bs], non_blocking=True)
        self.slots[:bs].copy_(host.slots_t[:bs], non_blocking=True)
        self.ctx[:bs].copy_(host.ctx_t[:bs], non_blocking=True)
        self.tables[:bs, :cols].copy_(host.table_t[: bs * cols].view(bs, cols), non_blocking=True)
        if adapters:
            self.lora[:bs].copy_(host.lora_t[:bs], non_blocking=True)

    def replay(self, bs: int, adapters: bool = False) -> torch.Tensor:
        """Logits [bs, vocab] of the copied-in step (a view of the graph's output), from the
        graph with the LoRA kernels when adapters."""
        graph, out = self.graphs[bs, adapters]
        graph.replay()
        return out
