"""Paged attention and its per-step metadata: the forward context, set once per
step by the runner and read by every attention layer."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

import kernels


@dataclass(slots=True)
class ForwardContext:
    slot_mapping: torch.Tensor  # int64 [T]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    context_lens: torch.Tensor  # int32 [B]
    query_start_loc: torch.Tensor  # int32 [B+1]
    is_decode: bool  # every sequence has exactly one new token
    max_query_len: int = 0  # most new tokens of one sequence (host value: no sync to find it)


_CONTEXT: ForwardContext | None = None


@contextlib.contextmanager
def forward_context(ctx: ForwardContext):
    global _CONTEXT
    prev, _CONTEXT = _CONTEXT, ctx
    try:
        yield ctx
    finally:
        _CONTEXT = prev


def get_forward_context() -> ForwardContext:
    assert _CONTEXT is not None, "model called outside a forward context"
    return _CONTEXT


class PagedAttention(nn.Module):
    """Writes this step's K/V into the layer's paged cache, then attends."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None,
                 sliding_window: int | None = None, softcap: float | None = None):
        """scale None: head_dim ** -0.5. sliding_window: a query at position i sees
        keys j with i - W < j <= i (Hugging Face's); None attends the whole context.
        softcap: Gemma 2's attn_logit_softcapping (cap * tanh(scores / cap)); None off."""
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else float(scale)
        self.sliding_window, self.softcap = sliding_window, softcap
        self.k_cache = self.v_cache = None  # set by the runner

    def forward(self, q, k, v):
        ctx = get_forward_context()
        kernels.write_kv_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.is_decode:
            return kernels.paged_decode_attention(
                q, self.k_cache, self.v_cache, ctx.block_tables, ctx.context_lens, self.scale,
                sliding_window=self.sliding_window, softcap=self.softcap,
            )
        return kernels.paged_prefill_attention(
            q, self.k_cache, self.v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, self.scale,
            max_query_len=ctx.max_query_len or None, sliding_window=self.sliding_window, softcap=self.softcap,
        )
