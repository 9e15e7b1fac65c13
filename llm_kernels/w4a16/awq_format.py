"""AutoAWQ's "GEMM" checkpoint format for W4A16: packing, dequantizing, and the
reference GEMM (the CPU path and the tests' oracle).

qweight int32 [K, N/8] and qzeros int32 [K/G, N/8] pack 8 nibbles along N in
the order 0,2,4,6,1,3,5,7 (nibble i holds column ORDER[i] of its group of 8);
scales [K/G, N]; w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n].
"""
import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# column c of a group of 8 lives in nibble AWQ_REVERSE_ORDER[c]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def unpack_awq_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, C/8] -> int32 [R, C] of values 0..15 in column order."""
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    nibbles = (packed.unsqueeze(-1) >> shifts) & 0xF
    order = torch.tensor(AWQ_REVERSE_ORDER, device=packed.device)
    return nibbles.index_select(-1, order).reshape(packed.shape[0], -1)


def pack_awq_int4(values: torch.Tensor) -> torch.Tensor:
    """int [R, C] of 0..15 -> int32 [R, C/8] in AutoAWQ's nibble order."""
    rows, cols = values.shape
    assert cols % 8 == 0, "packed dimension must be a multiple of 8"
    v = values.to(torch.int32).reshape(rows, cols // 8, 8)
    packed = torch.zeros(rows, cols // 8, dtype=torch.int32, device=values.device)
    for i, col in enumerate(AWQ_ORDER):
        packed |= v[..., col] << (4 * i)
    return packed


def awq_dequantize(qweight, qzeros, scales, group_size: int, dtype=None) -> torch.Tensor:
    """The checkpoint's int4 weight as a dense [K, N] tensor."""
    dtype = dtype or scales.dtype
    q = unpack_awq_int4(qweight)
    z = unpack_awq_int4(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    assert q.shape == z.shape == s.shape, (q.shape, z.shape, s.shape)
    return (q - z).to(dtype) * s


def awq_gemm_reference(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    w = awq_dequantize(qweight, qzeros, scales, group_size, dtype=torch.float32)
    return (x.float() @ w).to(x.dtype)


def check_awq_shapes(K: int, N8: int, qzeros, scales, group_size: int, what: str) -> None:
    """ValueError naming `what` unless the tensors are one layer of K rows, 8 * N8 columns."""
    if group_size < 16 or group_size & (group_size - 1) or K % group_size:
        raise ValueError(f"{what}: group size {group_size} with K={K} (need a power of 2 >= 16 dividing K)")
    if tuple(qzeros.shape) != (K // group_size, N8) or tuple(scales.shape) != (K // group_size, 8 * N8):
        raise ValueError(f"{what}: qweight [{K}, {N8}], qzeros {tuple(qzeros.shape)}, "
                         f"scales {tuple(scales.shape)}, group {group_size}")
