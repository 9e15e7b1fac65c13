"""Model building blocks over the kernels: linears (dense and AWQ, with
merged shards), RMSNorm, rotary cache, and paged attention with its per-step
metadata (the forward context, set once per step by the runner)."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from engine.parallel.group import SINGLE, TPGroup
from kernels.awq import awq_linear, awq_prepare


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


class _Sharded:
    """Tensor parallelism of a linear (tp.size > 1), given the checkpoint's sizes:
    split "column" keeps this rank's 1/tp of every merged shard's outputs, "row"
    its 1/tp of the inputs, all-reducing the output (the bias added once, after)."""

    TP_DIMS: dict[str, tuple[int, int | None]] = {}  # tensor -> (its output dim, its input dim)

    def _tp_sizes(self, in_features: int, output_sizes, tp: TPGroup, split: str | None):
        self.tp, self.split = tp, (split if tp.size > 1 else None)
        if self.split == "column":
            return in_features, [tp.part(s, "output features") for s in output_sizes]
        if self.split == "row":
            return tp.part(in_features, "input features"), list(output_sizes)
        return in_features, list(output_sizes)

    def _tp_slice(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of a checkpoint tensor (the whole of a replicated one)."""
        if self.split is None or name not in self.TP_DIMS:
            return tensor
        dim = self.TP_DIMS[name][0 if self.split == "column" else 1]
        return tensor if dim is None else self.tp.shard(tensor, dim, name)

    def _tp_reduce(self, y: torch.Tensor) -> torch.Tensor:
        self.tp.all_reduce(y)
        return y + self.bias if self.bias is not None else y


class Linear(_Sharded, nn.Module):
    """y = x W^T + b; output_sizes > 1 merges several projections (q,k,v / gate,up)."""

    TP_DIMS = {"weight": (0, 1), "bias": (0, None)}

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, dtype, device,
                 tp: TPGroup = SINGLE, split: str | None = None):
        super().__init__()
        in_features, output_sizes = self._tp_sizes(in_features, output_sizes, tp, split)
        self.in_features = in_features
        self.output_sizes = list(output_sizes)
        n = sum(output_sizes)
        self.weight = nn.Parameter(torch.empty(n, in_features, dtype=dtype, device=device), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None
        self.loaded: set[tuple[int, str]] = set()

    def shard_offset(self, shard: int) -> int:
        return sum(self.output_sizes[:shard])

    def load(self, shard: int, name: str, tensor: torch.Tensor):
        off, size = self.shard_offset(shard), self.output_sizes[shard]
        param = {"weight": self.weight, "bias": self.bias}.get(name)
        if param is None:
            raise KeyError(name)
        tensor = self._tp_slice(name, tensor)
        want = (size, self.in_features) if name == "weight" else (size,)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
        param.data[off : off + size].copy_(tensor)
        self.loaded.add((shard, name))

    def expected(self) -> set[tuple[int, str]]:
        names = ["weight"] + (["bias"] if self.bias is not None else [])
        return {(s, n) for s in range(len(self.output_sizes)) for n in names}

    def finalize(self):
        pass

    def forward(self, x):
        if self.split == "row":
            return self._tp_reduce(F.linear(x, self.weight))
        return F.linear(x, self.weight, self.bias)


class AWQLinear(_Sharded, nn.Module):
    """4-bit AutoAWQ GEMM-format weights; on CUDA through kernels.awq_linear
    (the Triton W4A16 GEMM on the checkpoint's layout), elsewhere kernels.awq_gemm.

    On the CPU (no int4 matmul there, and outside the Triton interpreter) the
    weight is dequantized once after loading and kept dense. Under tensor
    parallelism "column" slices N (packed 8 per int32), "row" slices K (whole groups)."""

    TP_DIMS = {"qweight": (1, 0), "qzeros": (1, 0), "scales": (1, 0), "bias": (0, None)}

    def __init__(self, in_features: int, output_sizes: list[int], bias: bool, group_size: int, dtype, device,
                 tp: TPGroup = SINGLE, split: str | None = None):
        super().__init__()
        in_features, output_sizes = self._tp_sizes(in_features, output_sizes, tp, split)
        if in_features % group_size or any(s % 8 for s in output_sizes):
            part = f" (this rank's part at tensor_parallel_size {tp.size})" if tp.size > 1 else ""
            raise ValueError(f"AWQ layer {in_features}x{output_sizes}{part} does not fit group {group_size} "
                             "/ packing 8")
        self.in_features, self.output_sizes, self.group_size = in_features, list(output_sizes), group_size
        n, g = sum(output_sizes), in_features // group_size
        self.register_buffer("qweight", torch.zeros(in_features, n // 8, dtype=torch.int32, device=device))
        self.register_buffer("qzeros", torch.zeros(g, n // 8, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(g, n, dtype=dtype, device=device))
        self.bias = nn.Parameter(torch.zeros(n, dtype=dtype, device=device), requires_grad=False) if bias else None
        self.dense: torch.Tensor | None = None
        self.prepared = None  # kernels.awq.AWQPrepared on CUDA
        self.loaded: set[tuple[int, str]] = set()

    def load(self, shard: int, name: str, tensor: torch.Tensor):
        off, size = sum(self.output_sizes[:shard]), self.output_sizes[shard]
        g = self.in_features // self.group_size
        spec = {
            "qweight": (self.qweight, 8, (self.in_features, size // 8)),
            "qzeros": (self.qzeros, 8, (g, size // 8)),
            "scales": (self.scales, 1, (g, size)),
        }
        tensor = self._tp_slice(name, tensor)
        if name == "bias" and self.bias is not None:
            if tuple(tensor.shape) != (size,):
                raise ValueError(f"bias: checkpoint shape {tuple(tensor.shape)}, expected {(size,)}")
            self.bias.data[off : off + size].copy_(tensor)
        elif name in spec:
            buf, pack, want = spec[name]
            if tuple(tensor.shape) != want:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
            buf[:, off // pack : (off + size) // pack].copy_(tensor)
        else:
            raise KeyError(name)
        self.loaded.add((shard, name))

    def expected(self) -> set[tuple[int, str]]:
        names = ["qweight", "qzeros", "scales"] + (["bias"] if self.bias is not None else [])
        return {(s, n) for s in range(len(self.output_sizes)) for n in names}

    def finalize(self):
        from kernels._dispatch import use_triton

        if self.qweight.is_cuda:
            self.prepared = awq_prepare(self.qweight, self.qzeros, self.scales, self.group_size)
            if self.prepared.qk is not None:  # repacked: the checkpoint copy is not needed any more
                self.qweight = torch.empty(0, dtype=torch.int32, device=self.qweight.device)
                self.qzeros = torch.empty(0, dtype=torch.int32, device=self.qzeros.device)
        elif not use_triton(self.qweight):
            w = kernels.awq_dequantize(self.qweight, self.qzeros, self.scales, self.group_size, torch.float32)
            self.dense = w.t().contiguous().to(self.scales.dtype)

    def forward(self, x):
        if self.split == "row":
            return self._tp_reduce(self._forward(x, None))
        return self._forward(x, self.bias)

    def _forward(self, x, bias):
        if self.dense is not None:
            return F.linear(x, self.dense, bias)
        if self.prepared is not None:
            y = awq_linear(x, self.prepared)
            return y + bias if bias is not None else y
        shape = x.shape
        y = kernels.awq_gemm(x.reshape(-1, shape[-1]), self.qweight, self.qzeros, self.scales, self.group_size)
        y = y.reshape(*shape[:-1], y.shape[-1])
        return y + bias if bias is not None else y


class VocabParallelEmbedding(nn.Module):
    """Under tensor parallelism, rows [rank*n, (rank+1)*n) of a [vocab, hidden]
    table (n = vocab / tp rounded up; the last rank's spare rows stay zero): the
    embedding (each rank looks up its rows, the sum over ranks is the lookup), and
    the lm_head (each rank's logits, gathered side by side)."""

    def __init__(self, vocab_size: int, hidden_size: int, dtype, device, tp: TPGroup):
        super().__init__()
        assert tp.size > 1
        self.vocab_size, self.hidden_size, self.tp = vocab_size, hidden_size, tp
        self.per_rank = -(-vocab_size // tp.size)
        self.start = tp.rank * self.per_rank
        self.weight = nn.Parameter(torch.zeros(self.per_rank, hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)
        self.loaded: set[tuple[int, str]] = set()

    def load(self, shard: int, name: str, tensor: torch.Tensor):
        if name != "weight":
            raise KeyError(name)
        if tuple(tensor.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, "
                             f"expected {(self.vocab_size, self.hidden_size)}")
        part = tensor[self.start : self.start + self.per_rank]
        self.weight.data[: part.shape[0]].copy_(part)
        self.loaded.add((shard, name))

    def expected(self) -> set[tuple[int, str]]:
        return {(0, "weight")}

    def finalize(self):
        pass

    def forward(self, ids):
        local = ids - self.start
        inside = (local >= 0) & (local < self.per_rank)
        x = F.embedding(local.masked_fill(~inside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(~inside.unsqueeze(-1), 0))

    def logits(self, hidden):
        return self.tp.all_gather(hidden @ self.weight.t())[..., : self.vocab_size]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x, residual=None):
        if residual is None:
            return kernels.rms_norm(x, self.weight, self.eps), x.clone()
        return kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies for rope types default, linear and llama3."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    assert kind == "default", kind
    return inv


def rope_cache(head_dim: int, max_positions: int, theta: float, scaling: dict | None, device) -> torch.Tensor:
    inv = rope_inv_freq(head_dim, theta, scaling)
    t = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(t, inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


class PagedAttention(nn.Module):
    """Writes this step's K/V into the layer's paged cache, then attends."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.k_cache = self.v_cache = None  # set by the runner

    def forward(self, q, k, v):
        ctx = get_forward_context()
        kernels.write_kv_cache(k, v, self.k_cache, self.v_cache, ctx.slot_mapping)
        if ctx.is_decode:
            return kernels.paged_decode_attention(
                q, self.k_cache, self.v_cache, ctx.block_tables, ctx.context_lens, self.scale
            )
        return kernels.paged_prefill_attention(
            q, self.k_cache, self.v_cache, ctx.block_tables, ctx.query_start_loc, ctx.context_lens, self.scale,
            max_query_len=ctx.max_query_len or None,
        )
