"""The shapes and dtypes add_lora accepts, checked from the tensors' metadata alone (no read
of device memory, so the check is free inside a CUDA graph capture)."""
from __future__ import annotations

import torch

MAX_SLICES = 3  # q, k, v: the most output slices a merged linear has (the kernels map a tile to its slice in scalars)


def check_lora_args(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    slots: torch.Tensor, output_slices=None) -> tuple[int, ...]:
    """The output slices (N,) when none are given; ValueError unless out [T, N], x [T, K],
    a [S, n R, K], b [S, N, R] and slots [T] agree, output_slices being n positive column
    counts that sum to N, with x, a and b in out's dtype and slots an integer tensor."""
    if out.dim() != 2 or x.dim() != 2 or a.dim() != 3 or b.dim() != 3 or slots.dim() != 1:
        raise ValueError(f"add_lora: want out [T, N], x [T, K], a [S, n R, K], b [S, N, R], slots [T]; got out "
                         f"{tuple(out.shape)}, x {tuple(x.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}, "
                         f"slots {tuple(slots.shape)}")
    T, N = out.shape
    K = x.shape[1]
    S, R = b.shape[0], b.shape[2]
    slices = (N,) if output_slices is None else tuple(int(n) for n in output_slices)
    if not 1 <= len(slices) <= MAX_SLICES or min(slices) <= 0 or sum(slices) != N:
        raise ValueError(f"add_lora: output_slices {slices} must be 1 to {MAX_SLICES} positive column counts "
                         f"summing to out's {N} columns")
    if (x.shape[0] != T or slots.shape[0] != T or tuple(a.shape) != (S, len(slices) * R, K)
            or b.shape[1] != N):
        raise ValueError(f"add_lora: shapes disagree: out {tuple(out.shape)}, x {tuple(x.shape)}, "
                         f"a {tuple(a.shape)}, b {tuple(b.shape)}, slots {tuple(slots.shape)}, "
                         f"output_slices {slices}")
    if not (x.dtype == a.dtype == b.dtype == out.dtype):
        raise ValueError(f"add_lora: x, a, b and out must share a dtype: {x.dtype}, {a.dtype}, {b.dtype}, "
                         f"{out.dtype}")
    if slots.is_floating_point() or slots.dtype == torch.bool:
        raise ValueError(f"add_lora: slots must be an integer tensor, got {slots.dtype}")
    return slices
