"""Runs the model for one scheduled step: KV cache allocation, packed inputs
and attention metadata, forward, logits of the positions that sample."""
from __future__ import annotations

import logging

import torch

from engine.model.layers import ForwardContext, PagedAttention, forward_context
from engine.sequence import Sequence

log = logging.getLogger(__name__)


def kv_bytes_per_block(model, block_size: int, dtype) -> int:
    s = model.spec
    return 2 * s.num_layers * block_size * s.num_kv_heads * s.head_dim * torch.empty((), dtype=dtype).element_size()


class ModelRunner:
    def __init__(self, model, block_size: int, dtype, device):
        self.model = model
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        self.attn_layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
        self.k_caches: list[torch.Tensor] = []
        self.v_caches: list[torch.Tensor] = []

    def allocate_kv_cache(self, num_blocks: int):
        s = self.model.spec
        shape = (num_blocks, self.block_size, s.num_kv_heads, s.head_dim)
        self.k_caches, self.v_caches = [], []
        for layer in self.attn_layers:
            layer.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            layer.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.k_caches.append(layer.k_cache)
            self.v_caches.append(layer.v_cache)

    def prepare(self, scheduled: list[tuple[Sequence, int]]):
        bs = self.block_size
        input_ids, positions, slots = [], [], []
        qsl, ctx_lens, sample_rows = [0], [], []
        max_blocks = max(len(seq.block_table) for seq, _ in scheduled)
        tables = []
        for seq, n in scheduled:
            start = seq.num_computed_tokens
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            qsl.append(qsl[-1] + n)
            ctx_lens.append(start + n)
            tables.append(table + [0] * (max_blocks - len(table)))
            if start + n == seq.num_tokens:
                sample_rows.append(qsl[-1] - 1)
        dev = self.device
        ctx = ForwardContext(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev),
            context_lens=torch.tensor(ctx_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            is_decode=all(n == 1 for _, n in scheduled),
        )
        ids = torch.tensor(input_ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        return ids, pos, ctx, sample_rows

    @torch.inference_mode()
    def execute(self, scheduled: list[tuple[Sequence, int]]) -> torch.Tensor:
        """Logits [S, vocab] (float32) for the scheduled requests that sample, in order."""
        ids, pos, ctx, rows = self.prepare(scheduled)
        with forward_context(ctx):
            hidden = self.model(ids, pos)
        if not rows:
            return torch.empty(0, self.model.spec.vocab_size)
        rows_t = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return self.model.compute_logits(hidden.index_select(0, rows_t)).float()
