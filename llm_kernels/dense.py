"""Dense x W^T (+ b) in the model's dtype: cuBLAS on CUDA; on the CPU with the rows
of x padded to a bounded set of counts when the dtype is bfloat16 or float16.

Why the padding: the CPU's reduced-precision matmul (oneDNN) builds and keeps a
JIT kernel for every distinct (M, N, K) it meets, never freed (measured with
torch 2.13: ~0.3 MB a shape, 880 MB after 3,000 row counts of one weight; float32
goes to MKL and keeps nothing). A serving engine's row count is its step's token
count, different nearly every step, so a CPU worker's memory grew with the number
of jobs. Rounding M up to ROW_BUCKETS_PER_OCTAVE counts an octave (exact up to
EXACT_ROWS, where decode steps live and padding would cost up to 2x) bounds the
shapes to about 8 per doubling, for at most 1/8 more rows. The real rows' values
are the padded matmul's own (oneDNN's reduction order does not follow M; tested
bitwise)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

EXACT_ROWS = 32
ROW_BUCKETS_PER_OCTAVE = 8
_PADDED_DTYPES = (torch.bfloat16, torch.float16)


def padded_rows(m: int) -> int:
    """The row count a CPU matmul of m rows runs at: m up to EXACT_ROWS, else m
    rounded up to a multiple of 2^(floor(log2 m) - 3) (8 counts an octave)."""
    if m <= EXACT_ROWS:
        return m
    octave = m.bit_length() - 1  # 2^octave <= m < 2^(octave + 1)
    step = 1 << (octave - (ROW_BUCKETS_PER_OCTAVE.bit_length() - 1))
    return -(-m // step) * step


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K], weight [N, K]; on the CPU in bfloat16 /
    float16 the flattened rows of x are padded to padded_rows(M) and the padding's
    outputs dropped."""
    if x.is_cuda or x.dtype not in _PADDED_DTYPES:
        return F.linear(x, weight, bias)
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    mb = padded_rows(m)
    if mb != m:
        x2 = torch.cat([x2, x2.new_zeros(mb - m, k)])
    return F.linear(x2, weight, bias)[:m].reshape(*lead, weight.shape[0])
