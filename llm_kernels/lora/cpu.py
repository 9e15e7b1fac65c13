"""The batched LoRA update in PyTorch, for the CPU: tokens grouped by slot, one pair of
matmuls per distinct slot (the expand one per output slice).

A Python loop over the slots in use is cheap here (the host runs the math anyway) and reads
each adapter's A and B once however many tokens use it. The math is float32 whatever the
model's dtype: the result is the reference's (one rounding into out), and a float32 matmul
goes to MKL, which keeps nothing per shape, where a bfloat16 one would make oneDNN build and
keep a kernel for every token count it meets (llm_kernels/dense.py tells that story)."""
from __future__ import annotations

import torch


def add_lora_cpu(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 slots: torch.Tensor, output_slices=None) -> None:
    """add_lora on torch ops (any device; reads slots on the host)."""
    if out.shape[0] == 0 or a.shape[0] == 0:
        return
    xf = x if x.dtype == torch.float32 else x.float()
    slots = slots.to(torch.int64)
    R = b.shape[2]
    bounds = _bounds(output_slices or (out.shape[1],))
    for s in torch.unique(slots).tolist():
        if s < 0:
            continue
        rows = torch.nonzero(slots == s).squeeze(1)
        whole = rows.numel() == out.shape[0]  # one adapter for the whole batch: no gather
        xs = xf if whole else xf.index_select(0, rows)
        y = xs @ a[s].float().t()  # [rows, n R]
        bs = b[s].float()
        cur = out.float() if whole else out.index_select(0, rows).float()
        for i, (c0, c1) in enumerate(bounds):  # each output slice from its own R columns of y
            cur[:, c0:c1].addmm_(y[:, i * R : (i + 1) * R], bs[c0:c1].t())
        if whole:
            out.copy_(cur)
        else:
            out.index_copy_(0, rows, cur.to(out.dtype))


def _bounds(slices) -> list[tuple[int, int]]:
    """Each output slice's [start, end) columns."""
    out, col = [], 0
    for n in slices:
        out.append((col, col + n))
        col += n
    return out
