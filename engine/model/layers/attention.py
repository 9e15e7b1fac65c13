"""Paged attention and its per-step metadata: the forward context, set once per
step by the runner and read by every attention layer of that step. It is per
thread: two engines stepping at once in one process (each steps on a thread of
its own) must not read, or clear, each other's slot mapping."""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch
from torch import nn

import llm_kernels


@dataclass(slots=True)
class ForwardContext:
    slot_mapping: torch.Tensor  # int64 [T]
    block_tables: torch.Tensor  # int32 [B, max_blocks]
    context_lens: torch.Tensor  # int32 [B]
    query_start_loc: torch.Tensor  # int32 [B+1]
    is_decode: bool  # every sequence has exactly one new token
    lora_slots: torch.Tensor | None = None  # int32 [T]: each token's adapter slot (-1 none); None: adapters off


_LOCAL = threading.local()  # .ctx: this thread's ForwardContext


@contextlib.contextmanager
def forward_context(ctx: ForwardContext):
    prev = getattr(_LOCAL, "ctx", None)
    _LOCAL.ctx = ctx
    try:
        yield ctx
    finally:
        _LOCAL.ctx = prev


def get_forward_context() -> ForwardContext:
    ctx = getattr(_LOCAL, "ctx", None)
    assert ctx is not None, "model called outside a forward context"
    return ctx


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
        # per-tensor scales of an FP8 cache: the checkpoint's (k_scale / v_scale tensors,
        # 1.0 without them), applied by the runner when it allocates an FP8 cache
        self.checkpoint_scales = {"k_scale": 1.0, "v_scale": 1.0}
        self.k_scale = self.v_scale = 1.0
        self.loaded: set[str] = set()

    # a loadable module for engine.model.loader: the optional KV-cache scales
    def expected(self) -> set[str]:
        return set()

    def load(self, shard: int, name: str, tensor: torch.Tensor) -> None:
        names = ("k_scale", "v_scale") if name == "kv_scale" else (name,)  # kv_scale: vLLM's older single scale
        if any(n not in self.checkpoint_scales for n in names):
            raise KeyError(name)
        if tensor.numel() != 1:
            raise ValueError(f"a per-tensor {name} is one number, got shape {tuple(tensor.shape)}")
        value = float(tensor.float().reshape(-1)[0])
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")
        for n in names:
            self.checkpoint_scales[n] = value
            self.loaded.add(n)

    def finalize(self) -> None:
        pass

    def use_cache_scales(self, fp8: bool) -> None:
        """The scales the kernels apply: the checkpoint's for an FP8 cache, none otherwise."""
        self.k_scale, self.v_scale = ((self.checkpoint_scales["k_scale"], self.checkpoint_scales["v_scale"])
                                      if fp8 else (1.0, 1.0))

    def forward(self, q, k, v):
        ctx = get_forward_context()
        llm_kernels.write_kv_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping, self.k_scale, self.v_scale)
        opts = dict(sliding_window=self.sliding_window, softcap=self.softcap, k_scale=self.k_scale,
                    v_scale=self.v_scale)
        if ctx.is_decode:
            return llm_kernels.paged_decode_attention(
                q, self.k_cache, self.v_cache, ctx.block_tables, ctx.context_lens, self.scale, **opts,
            )
        return llm_kernels.paged_prefill_attention(
            q, self.k_cache, self.v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, self.scale,
            **opts,
        )
