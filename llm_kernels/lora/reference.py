"""The batched LoRA update as plainly as it is defined: the tests' oracle.

out[t] += (x[t] @ a[s].T) @ b[s].T with s = slots[t], for every token whose slot is >= 0;
with output slices, slice i of out's columns takes rank rows i R ... (i + 1) R of a[s] (b[s]
has R columns: the block diagonal's blocks side by side). One token at a time, in float32,
rounded to out's dtype once at the end (as the kernels do)."""
from __future__ import annotations

import torch


def add_lora_reference(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                       slots: torch.Tensor, output_slices=None) -> None:
    """In place on out [T, N]: x [T, K], a [S, n R, K], b [S, N, R], slots [T] (-1: no
    adapter), output_slices n column counts (default: one slice, N)."""
    R = b.shape[2]
    slices = output_slices or (out.shape[1],)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        y = a[s].float() @ x[t].float()  # [n R]
        row, col = out[t].float(), 0
        for i, n in enumerate(slices):
            row[col : col + n] += b[s, col : col + n].float() @ y[i * R : (i + 1) * R]
            col += n
        out[t] = row.to(out.dtype)
