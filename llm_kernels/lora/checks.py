"""The shapes and dtypes add_lora accepts, checked from the tensors' metadata alone (no read
of device memory, so the check is free inside a CUDA graph capture)."""
from __future__ import annotations

import torch


def check_lora_args(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                    slots: torch.Tensor) -> None:
    """ValueError unless out [T, N], x [T, K], a [S, R, K], b [S, N, R] and slots [T] agree,
    with x, a and b in out's dtype and slots an integer tensor."""
    if out.dim() != 2 or x.dim() != 2 or a.dim() != 3 or b.dim() != 3 or slots.dim() != 1:
        raise ValueError(f"add_lora: want out [T, N], x [T, K], a [S, R, K], b [S, N, R], slots [T]; got out "
                         f"{tuple(out.shape)}, x {tuple(x.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}, "
                         f"slots {tuple(slots.shape)}")
    T, N = out.shape
    K = x.shape[1]
    S, R = a.shape[0], a.shape[1]
    if x.shape[0] != T or slots.shape[0] != T or a.shape[2] != K or tuple(b.shape) != (S, N, R):
        raise ValueError(f"add_lora: shapes disagree: out {tuple(out.shape)}, x {tuple(x.shape)}, "
                         f"a {tuple(a.shape)}, b {tuple(b.shape)}, slots {tuple(slots.shape)}")
    if not (x.dtype == a.dtype == b.dtype == out.dtype):
        raise ValueError(f"add_lora: x, a, b and out must share a dtype: {x.dtype}, {a.dtype}, {b.dtype}, "
                         f"{out.dtype}")
    if slots.is_floating_point() or slots.dtype == torch.bool:
        raise ValueError(f"add_lora: slots must be an integer tensor, got {slots.dtype}")
