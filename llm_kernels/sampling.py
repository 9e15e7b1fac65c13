"""One fused pass over a step's logits for the sampler's greedy rows: per row the
argmax token, its log-probability, log-sum-exp and an all-finite flag, in place
of the float cast, log_softmax, argmax and isfinite passes over the vocabulary.
One Triton program per row; the reference is the CPU path and test oracle."""
import torch
import triton.language as tl

from llm_kernels.dispatch import jit_helper, lazy_jit, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

BLOCK = 4096  # vocabulary elements per loop step (a ~152k vocabulary takes ~38)
WARPS = 8


def logits_summary_reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = logits.float()
    tokens = x.argmax(-1)
    lse = torch.logsumexp(x, -1)
    finite = torch.isfinite(x).all(-1)
    packed = torch.stack([tokens.double(), (x.max(-1).values - lse).double(), finite.double()], 1)
    return tokens, packed, lse


@jit_helper
def _gap(lo, hi):
    # lo - hi for lo <= hi, 0 where they are equal (no inf - inf = NaN)
    same = lo == hi
    return tl.where(same, 0.0, lo) - tl.where(same, 0.0, hi)


@lazy_jit(pdl=True)
def _logits_summary_kernel(
    x_ptr, tok_ptr, packed_ptr, lse_ptr, stride_x, V,
    BLOCK: tl.constexpr, PDL: tl.constexpr = False,
):
    # Each lane keeps its own running max (NaN read as -inf), the first column
    # reaching it (updated only on a strictly greater value, and a lane's columns
    # grow), and sum(exp(x - max)); the lanes are merged once after the loop.
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ninf = float("-inf")
    m = tl.full([BLOCK], ninf, tl.float32)
    s = tl.zeros([BLOCK], dtype=tl.float32)
    idx = cols
    bad = tl.zeros([BLOCK], dtype=tl.int32)
    base = x_ptr + row * stride_x
    for start in range(0, V, BLOCK):
        c = start + cols
        mask = c < V
        x = tl.load(base + c, mask=mask, other=ninf).to(tl.float32)
        bad = tl.where(mask & ~(tl.abs(x) < float("inf")), 1, bad)  # NaN or +-inf
        x = tl.where(x == x, x, ninf)
        up = x > m
        hi = tl.maximum(m, x)
        lo = tl.minimum(m, x)
        # e = exp(lo - hi) with no inf - inf: 1 where lo == hi. A lane still at -inf
        # counts 1s, which its first finite value wipes (s * exp(-inf - x) = 0)
        # and the merge below too (a row of -inf only stays at lse = -inf).
        e = tl.exp(_gap(lo, hi))
        s = tl.where(up, s * e + 1.0, s + e)
        idx = tl.where(up, c, idx)
        m = hi
    best = tl.max(m, axis=0)
    top = tl.where(m == best, idx, 2147483647)
    token = tl.min(top, axis=0)  # the max's first column; 0 for a row of -inf (idx starts at the lane)
    scale = tl.exp(_gap(m, best))  # 0 for a lane of -inf only, unless all are
    total = tl.sum(s * scale, axis=0)
    # total >= 1 (the max's own term) unless the row is all -inf: then lse = -inf
    lse = best + tl.log(tl.maximum(total, 1.0))
    finite = 1.0 - tl.max(bad, axis=0).to(tl.float32)
    tl.store(tok_ptr + row, token.to(tl.int64))
    tl.store(packed_ptr + row * 3, token.to(tl.float64))
    tl.store(packed_ptr + row * 3 + 1, (best - lse).to(tl.float64))
    tl.store(packed_ptr + row * 3 + 2, finite.to(tl.float64))
    tl.store(lse_ptr + row, lse)


def _launch(logits: torch.Tensor, block: int):
    S, V = logits.shape
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    tokens = torch.empty(S, dtype=torch.int64, device=dev)
    packed = torch.empty((S, 3), dtype=torch.float64, device=dev)
    lse = torch.empty(S, dtype=torch.float32, device=dev)
    if S:
        _logits_summary_kernel[(S,)](
            logits, tokens, packed, lse, logits.stride(0), V, BLOCK=block, num_warps=WARPS,
        )
    return tokens, packed, lse


def logits_summary(logits: torch.Tensor, block: int = BLOCK,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [S, V] (float32 / bfloat16 / float16, any row stride) ->
    (tokens int64 [S], packed float64 [S, 3], lse float32 [S]).
    tokens: the first index of each row's max (as torch.argmax); packed[:, 0] = tokens,
    packed[:, 1] = the argmax's log-probability (max - lse in float32), packed[:, 2] =
    1.0 when every logit of the row is finite, else 0.0; lse = log(sum(exp(row))).
    A row holding NaN has finite 0, and its token and lse read the NaNs as -inf
    (torch would give NaN: the token is the first NaN and lse NaN).
    block: vocabulary elements per loop step of the kernel (a power of two).
    No host synchronisation: CUDA-graph capturable."""
    assert logits.dim() == 2 and logits.shape[1] > 0, logits.shape
    if use_triton(logits):
        return _launch(logits, block)
    return logits_summary_reference(logits)
