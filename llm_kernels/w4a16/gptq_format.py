"""GPTQ's checkpoint format (AutoGPTQ / GPTQModel / optimum) and its repacking into
AutoAWQ's layout, so the AWQ W4A16 kernels run GPTQ (and compressed-tensors) weights.

qweight int32 [K*bits/32, N] packs `32/bits` input rows per int32 along K, row
k at bits `bits*(k % (32/bits))`; qzeros int32 [G, N*bits/32] packs output columns
the same way along N; scales [G, N]; g_idx int32 [K] gives each input row its group.
w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]. checkpoint_format "gptq"
(v1) stores z - 1, "gptq_v2" stores z. Without act-order g_idx[k] = k // G; with
it (desc_act) the groups are scattered over K.
"""
import torch

from llm_kernels.w4a16.awq_format import pack_awq_int4


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R/(32/bits), C] packed along dim 0 -> int32 [R, C] of 0..2^bits-1."""
    per = 32 // bits
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)
    vals = (packed.unsqueeze(1) >> shifts.view(1, per, 1)) & ((1 << bits) - 1)
    return vals.reshape(packed.shape[0] * per, packed.shape[1])


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, C/(32/bits)] packed along dim 1 -> int32 [R, C]."""
    return unpack_rows(packed.t(), bits).t().contiguous()


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """int [R, C] of 0..2^bits-1 -> int32 [R/(32/bits), C] (GPTQ's qweight packing)."""
    per = 32 // bits
    rows, cols = values.shape
    assert rows % per == 0, f"packed dimension {rows} must be a multiple of {per}"
    v = values.to(torch.int64).reshape(rows // per, per, cols)
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=values.device).view(1, per, 1)
    packed = (v << shifts).sum(1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def pack_cols(values: torch.Tensor, bits: int) -> torch.Tensor:
    """int [R, C] -> int32 [R, C/(32/bits)] (GPTQ's qzeros packing)."""
    return pack_rows(values.t(), bits).t().contiguous()


def gptq_unpack(qweight, qzeros, bits: int, zero_offset: int):
    """(q [K, N], z [G, N]) as integers; zero_offset is 1 for checkpoint_format v1."""
    return unpack_rows(qweight, bits), unpack_cols(qzeros, bits) + zero_offset


def gptq_dequantize(qweight, qzeros, scales, g_idx, bits: int, zero_offset: int, dtype=torch.float32):
    """The checkpoint's weight as a dense [K, N] tensor (the reference)."""
    q, z = gptq_unpack(qweight, qzeros, bits, zero_offset)
    g = g_idx.long()
    return (q - z[g]).to(dtype) * scales.to(dtype)[g]


def kernel_group(K: int, group: int) -> int:
    """The group the AWQ kernels run for a format group (-1 or K: one group per
    column): the format's own, or for per-channel the largest power of 2 <= 128
    dividing K (its scales repeated)."""
    if 0 < group < K:
        return group
    for g in (128, 64, 32, 16):
        if K % g == 0:
            return g
    raise ValueError(f"per-channel quantization needs K={K} to be a multiple of 16")


def act_order(g_idx: torch.Tensor, group: int):
    """(perm, sorted) for a g_idx: perm (None when the groups are already contiguous)
    orders the input rows so that row i of the permuted weight is in group i // group."""
    K = g_idx.numel()
    g = g_idx.long() - g_idx.min().long()
    want = torch.arange(K, device=g.device) // group
    if torch.equal(g, want):
        return None
    perm = torch.argsort(g, stable=True)
    if not torch.equal(g[perm], want):
        raise ValueError(f"g_idx does not assign {group} input rows to each group")
    return perm


def int4_to_awq(q, z, s, g_idx, group: int):
    """Repack an int4 weight (q [K, N] of 0..15, zeros z [G, N] of 0..15, scales s [G, N],
    g_idx [K] or None, the format's group size, -1 per channel) into AutoAWQ's layout.
    Returns (qweight, qzeros, scales, kernel group, perm): perm (or None) orders the
    input features as the repacked weight reads them: x @ W == x[:, perm] @ W_awq."""
    K = q.shape[0]
    fmt_group = group if 0 < group < K else K
    perm = act_order(g_idx, fmt_group) if g_idx is not None else None
    if perm is not None:
        q = q.index_select(0, perm)
    if z.min() < 0 or z.max() > 15:
        raise ValueError(f"int4 zero points out of 0..15 (min {int(z.min())}, max {int(z.max())})")
    kg = kernel_group(K, group)
    if kg != fmt_group:
        z, s = z.repeat_interleave(fmt_group // kg, 0), s.repeat_interleave(fmt_group // kg, 0)
    return pack_awq_int4(q), pack_awq_int4(z), s.contiguous(), kg, perm
