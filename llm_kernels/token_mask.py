"""Structured output's token masks applied to the logits in place: rows[r] of `logits`
keeps the tokens whose bit is set in bitmask[r] (32 tokens per int32 word, token t in
bit t % 32 of word t // 32, as llguidance and xgrammar lay them out); the others become
-inf. One Triton launch over (mask row, token block), writing only the banned entries;
the reference unpacks the bits with torch ops (the CPU path)."""
import torch
import triton.language as tl

from llm_kernels.dispatch import lazy_jit, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

BLOCK = 1024


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[R, W] int32 words -> [R, vocab] bool, True where the token may be sampled."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab].bool()


def apply_token_bitmask_reference(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    banned = ~allowed_tokens(bitmask, logits.shape[-1])
    logits[rows] = logits[rows].masked_fill(banned, float("-inf"))


@lazy_jit(pdl=True)
def _token_mask_kernel(logits_ptr, rows_ptr, mask_ptr, stride_l, W, V, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < V
    words = tl.load(mask_ptr + r * W + cols // 32, mask=inside, other=-1)
    keep = (words >> (cols % 32)) & 1
    row = tl.load(rows_ptr + r).to(tl.int64)
    tl.store(logits_ptr + row * stride_l + cols, float("-inf"), mask=inside & (keep == 0))


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits [S, V] (float32, rows contiguous), rows [R] int64 indices into it, bitmask
    [R, ceil(V / 32)] int32, all on one device: banned tokens of those rows set to -inf."""
    assert bitmask.dtype == torch.int32 and bitmask.shape[0] == rows.shape[0]
    assert bitmask.shape[1] * 32 >= logits.shape[-1], "bitmask narrower than the vocabulary"
    if not rows.numel():
        return
    if not use_triton(logits, rows, bitmask) or logits.stride(-1) != 1:
        return apply_token_bitmask_reference(logits, rows, bitmask)
    vocab = logits.shape[-1]
    grid = (rows.shape[0], -(-vocab // BLOCK))
    _token_mask_kernel[grid](logits, rows, bitmask.contiguous(), logits.stride(0), bitmask.shape[1], vocab,
                             BLOCK=BLOCK, num_warps=4)


