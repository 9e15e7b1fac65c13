"""add_lora, the public call: checks the arguments and runs the path for their device: the
Triton kernels on CUDA tensors (and on CPU tensors under TRITON_INTERPRET=1), the grouped
PyTorch path on the CPU."""
from __future__ import annotations

import torch

from llm_kernels.dispatch import use_triton
from llm_kernels.lora.checks import check_lora_args
from llm_kernels.lora.cpu import add_lora_cpu
from llm_kernels.lora.triton_path import add_lora_triton


def add_lora(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor) -> None:
    """In place: out[t] += (x[t] @ a[s].T) @ b[s].T with s = slots[t], for every token t whose slot s >= 0.

    out [T, N] (the base layer's output, model dtype), x [T, K] (the layer's input, same dtype),
    a [S, R, K], b [S, N, R] (S adapter slots, R the max rank; the adapter's scaling alpha/r is
    already folded into b; ranks below R are zero-padded), slots [T] int32 (-1: the token uses no
    adapter)."""
    check_lora_args(out, x, a, b, slots)
    if use_triton(out, x, a, b, slots):
        add_lora_triton(out, x, a, b, slots)
    else:
        add_lora_cpu(out, x, a, b, slots)
