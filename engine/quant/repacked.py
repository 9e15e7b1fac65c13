"""The runtime shared by the integer weight-only formats read in other layouts
(GPTQ, compressed-tensors pack-quantized): int4 weights repacked at load time into
AutoAWQ's layout and run by the same kernels as AWQ (llm_kernels.w4a16_linear); int8
weights dequantized at load (no int8 GEMM here: twice the int8 bytes in the model's dtype)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

import llm_kernels
from llm_kernels.w4a16.gptq_format import act_order, int4_to_awq


@dataclass
class Part:
    """Output columns [start, end) of a layer: perm (or None) orders the input features
    as the repacked weight reads them; then either the int4 weight (llm_kernels.W4A16Weight)
    or a dense [n, K] one."""

    start: int
    end: int
    perm: torch.Tensor | None = None
    w4a16: object = None
    dense: torch.Tensor | None = None


def int4_parts(shards: list[tuple], group: int, dtype) -> list[Part]:
    """shards: per merged shard (q [K, n], z [G, n], s [G, n], g_idx [K] or None), integers
    unsigned. Consecutive shards with the same act-order permutation (q, k and v share
    one: GPTQ orders by the same inputs) are repacked together into one part."""
    runs: list[list] = []
    fmt_group = group if 0 < group < shards[0][0].shape[0] else shards[0][0].shape[0]
    for shard in shards:
        perm = act_order(shard[3], fmt_group) if shard[3] is not None else None
        if runs and _same(runs[-1][0], perm):
            runs[-1][1].append(shard)
        else:
            runs.append([perm, [shard]])
    parts, start = [], 0
    for _, run in runs:
        q, z, s = (torch.cat([r[i] for r in run], dim=1) for i in range(3))
        qweight, qzeros, scales, kg, perm = int4_to_awq(q, z, s, run[0][3], group)
        part = Part(start, start + q.shape[1], perm, llm_kernels.w4a16_prepare(qweight, qzeros, scales.to(dtype), kg))
        parts.append(part)
        start = part.end
    return parts


def dense_part(w_kn: torch.Tensor, dtype) -> Part:
    """A dequantized weight [K, N], kept dense [N, K] in the model's dtype."""
    return Part(0, w_kn.shape[1], dense=w_kn.t().contiguous().to(dtype))


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def apply_parts(parts: list[Part], x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x W^T (+ bias) over the layer's parts."""
    outs = []
    for p in parts:
        xp = x.index_select(-1, p.perm) if p.perm is not None else x
        if p.dense is not None:
            outs.append(llm_kernels.dense_linear(xp, p.dense))
        else:
            outs.append(llm_kernels.w4a16_linear(xp, p.w4a16))
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return y + bias if bias is not None else y
