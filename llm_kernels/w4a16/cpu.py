"""W4A16 on the CPU: torch's int4 weight-only matmul for a step of few rows, the
dequantized dense weight above that.

torch ships a CPU int4 kernel (aten._weight_int4pack_mm_for_cpu, gpt-fast's CPU path):
weights packed two a byte, per group a (scale, zero) pair, w = (q - 8) scale + zero. AWQ's
w = (q - z) s is that with scale = s and zero = (8 - z) s; the kernel's bfloat16 roundings
leave each weight within 0.08 of a quantization step of the dequantized one (tested). Only
bfloat16 has a fast path in it: float32 and float16 ran 10-25x slower than the dense matmul
here, so those models keep the dense weight. Reading a quarter of the bytes, a decode step
of SmolLM2-135M's 120 linears, cold in cache on this 2-core machine, took 4.9-5.3 ms against
26.6 ms dense at 1 row and 15.9 against 28.4 ms at 8. Its
work grows with the rows (3x the dense matmul's at 128 rows, hot), so steps above
INT4_MAX_ROWS rows (prefills, wide batches) take the dense weight. The kernel keeps no
per-shape state (unlike oneDNN's bf16 matmul, llm_kernels/dense.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from llm_kernels.w4a16.awq_format import unpack_awq_int4

INT4_MAX_ROWS = 16  # above: the dense matmul (the int4 kernel's crossover, hot in cache: 16-24 rows)
INT4_GROUPS = (32, 64, 128, 256)


@dataclass
class Int4Pack:
    """One layer in the CPU int4 kernel's layout: packed [N, K/2] uint8, scales_zeros [K/G, N, 2]."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor
    group_size: int
    out_features: int


def int4_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu")


def int4_pack(qweight, qzeros, scales, group_size: int, dtype) -> Int4Pack | None:
    """An AutoAWQ GEMM-format layer (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]) for
    the CPU int4 kernel in dtype, or None where the kernel does not take it or is slow (torch
    without it, a dtype other than bfloat16, N not a multiple of 16, another group size)."""
    N = qweight.shape[1] * 8
    if (qweight.is_cuda or dtype != torch.bfloat16 or not int4_available() or N % 16
            or group_size not in INT4_GROUPS):
        return None
    q = unpack_awq_int4(qweight).t().contiguous()  # [N, K] of 0..15
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
    s = scales.float()
    zero = (8 - unpack_awq_int4(qzeros).float()) * s
    return Int4Pack(packed, torch.stack([s, zero], dim=-1).to(dtype).contiguous(), group_size, N)


def int4_mm(x2: torch.Tensor, pack: Int4Pack) -> torch.Tensor:
    """x2 [M, K] @ the packed weight -> [M, N] (torch's kernel)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x2, pack.packed, pack.group_size, pack.scales_zeros)
