"""The batched LoRA update as plainly as it is defined: the tests' oracle.

out[t] += (x[t] @ a[s].T) @ b[s].T with s = slots[t], for every token whose slot is >= 0;
one token at a time, in float32, rounded to out's dtype once at the end (as the kernels do)."""
from __future__ import annotations

import torch


def add_lora_reference(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       slots: torch.Tensor) -> None:
    """In place on out [T, N]: x [T, K], a [S, R, K], b [S, N, R], slots [T] (-1: no adapter)."""
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        y = a[s].float() @ x[t].float()  # [R]
        out[t] = (out[t].float() + b[s].float() @ y).to(out.dtype)
