"""add_lora, the public call: checks the arguments and runs the path for their device: the
Triton kernels on CUDA tensors (and on CPU tensors under TRITON_INTERPRET=1), the grouped
PyTorch path on the CPU."""
from __future__ import annotations

import torch

from llm_kernels.dispatch import use_triton
from llm_kernels.lora.checks import check_lora_args
from llm_kernels.lora.cpu import add_lora_cpu
from llm_kernels.lora.triton_path import add_lora_triton


def add_lora(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
             output_slices=None) -> None:
    """In place: out[t] += (x[t] @ a[s].T) @ b[s].T with s = slots[t], for every token t whose slot s >= 0.

    out [T, N] (the base layer's output, model dtype), x [T, K] (the layer's input, same dtype),
    a [S, R, K], b [S, N, R] (S adapter slots, R the max rank; the adapter's scaling alpha/r is
    already folded into b; ranks below R are zero-padded), slots [T] int32 (-1: the token uses no
    adapter).

    output_slices (vLLM's name): a merged linear's n output column counts (q, k, v; gate, up),
    summing to N. Each slice has its own low-rank pair: a [S, n R, K] stacks the slices' A,
    and b [S, N, R] their B one above the other, so slice i's columns of out take
    (x a[s, i R : (i + 1) R].T) @ b[s, its columns].T (the block diagonal without its zeros)."""
    slices = check_lora_args(out, x, a, b, slots, output_slices)
    if use_triton(out, x, a, b, slots):
        add_lora_triton(out, x, a, b, slots, output_slices=slices)
    else:
        add_lora_cpu(out, x, a, b, slots, slices)
