"""compressed-tensors' "pack-quantized" format (llm-compressor's W4A16 / W8A16):
packing, dequantizing, and the view of it that llm_kernels.w4a16.gptq_format.int4_to_awq repacks.

weight_packed int32 [N, K*bits/32] packs input features along K, value k at bits
`bits*(k % (32/bits))`, each stored as q + 2^(bits-1) (unsigned); weight_scale
[N, K/G] (group) or [N, 1] (channel); weight_zero_point (asymmetric only) int32
[N*bits/32, G] packed the same way along N; weight_g_idx [K] (activation order
"group", older checkpoints). w[n, k] = (q[n, k] - zp[n, g(k)]) * s[n, g(k)], signed
q and zp; with both offset by 2^(bits-1) this is AWQ's (u - z) * s.
"""
import torch

from llm_kernels.w4a16.gptq_format import unpack_rows


def ct_unpack(weight_packed, bits: int, in_features: int) -> torch.Tensor:
    """int32 [N, K*bits/32] -> int32 [K, N] of unsigned 0..2^bits-1."""
    return unpack_rows(weight_packed.t().contiguous(), bits)[:in_features]


def ct_unpack_zeros(zero_point, bits: int, out_features: int) -> torch.Tensor:
    """int32 [N*bits/32, G] -> int32 [G, N] of unsigned zero points."""
    return unpack_rows(zero_point, bits)[:out_features].t().contiguous()


def ct_int_view(weight_packed, scale, zero_point, g_idx, bits: int, in_features: int):
    """(q [K, N], z [G, N], s [G, N], g_idx or None) of a pack-quantized weight, integers
    unsigned; symmetric (no zero_point) means z = 2^(bits-1)."""
    q = ct_unpack(weight_packed, bits, in_features)
    s = scale.t().contiguous()
    if zero_point is None:
        z = torch.full(s.shape, 1 << (bits - 1), dtype=torch.int32, device=q.device)
    else:
        z = ct_unpack_zeros(zero_point, bits, q.shape[1])
    if g_idx is not None and g_idx.numel() == 0:
        g_idx = None
    return q, z, s, g_idx


def ct_dequantize(weight_packed, scale, zero_point, g_idx, bits: int, in_features: int, group: int,
                  dtype=torch.float32) -> torch.Tensor:
    """The dense [K, N] weight (the reference)."""
    q, z, s, g_idx = ct_int_view(weight_packed, scale, zero_point, g_idx, bits, in_features)
    K = q.shape[0]
    g = g_idx.long() if g_idx is not None else torch.arange(K, device=q.device) // (group if 0 < group < K else K)
    return (q - z[g]).to(dtype) * s.to(dtype)[g]
