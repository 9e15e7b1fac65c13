"""Fused mixture-of-experts: out[t] = sum_k w[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t))
with e = topk_ids[t, k] (the experts of Qwen3-MoE / transformers' `*Experts` modules).

Weights: dense w13 [E, 2I, H] (rows [0, I) gate, [I, 2I) up) and w2 [E, H, I]; or
AWQExperts, the AutoAWQ GEMM layout of each expert stacked along a new first dim (see
AWQExperts); or those experts repacked once at load into the dense 4-bit path's K-packed
layout (llm_kernels.moe_gemm_kpack.KPackExperts, what a GPU runs). The reference loops over
the experts that have tokens (the CPU path and the oracle). The Triton path (CUDA; CPU under
the interpreter) sorts the (token, slot) pairs by expert and pads each expert's run to the
GEMM's BLOCK_M on the device (moe_align: static sizes, no host synchronisation, so it can be
captured in a CUDA graph), then runs two grouped GEMMs, one launch each: w13 with the gather
of token rows and silu(gate) * up fused in, then w2 with the routing weight multiplied in,
one row per (token, slot); the slots are summed last. The GEMMs are llm_kernels.moe_gemm's
(dense, and AWQ as the checkpoint packs it) and llm_kernels.moe_gemm_kpack's (kpack
experts). Up to ALIGN_PAIRS pairs on a GPU the sort/pad is one Triton program
(`_align_kernel`) instead of a dozen torch kernels: in an E4 profile on an H100 those took
about 3 ms of a 26 ms step at 50 sequences.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton.language as tl

from llm_kernels import moe_gemm, moe_gemm_kpack
from llm_kernels.moe_gemm_kpack import KPackExperts, kpack_experts_dequantize
from llm_kernels.w4a16.awq_format import awq_dequantize, check_awq_shapes
from llm_kernels.dispatch import autotune, lazy_jit, next_pow2, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait


class AWQExperts(NamedTuple):
    """E experts' 4-bit AWQ weights of one projection (K inputs, N outputs), each
    expert's AutoAWQ GEMM tensors as they are in the checkpoint, stacked:
    qweight int32 [E, K, N/8] (8 columns a word, AutoAWQ's nibble order),
    qzeros int32 [E, K/G, N/8], scales [E, K/G, N]. The Triton GEMM reads it
    directly: a K step of one group loads [BLOCK_K, BLOCK_N/8] words, one
    zeros word row and one scales row. For w13, N = 2I: the gate's columns,
    then the up's (I a multiple of 8, so no word is shared)."""

    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    group_size: int

    @property
    def shape(self) -> tuple[int, int, int]:
        """(E, N, K), as a dense [E, N, K] weight's."""
        E, K, N8 = self.qweight.shape
        return E, N8 * 8, K


def awq_experts_dequantize(w: AWQExperts, dtype=None) -> torch.Tensor:
    """The dense [E, N, K] weight (dtype: the scales') of AWQ experts."""
    return torch.stack([awq_dequantize(w.qweight[e], w.qzeros[e], w.scales[e], w.group_size, dtype).t()
                        for e in range(w.qweight.shape[0])])


def check_awq_experts(w: AWQExperts, what: str) -> None:
    """ValueError naming `what` unless the tensors are E experts of one AWQ layout."""
    E, K, N8 = w.qweight.shape
    if w.qzeros.shape[0] != E or w.scales.shape[0] != E:
        raise ValueError(f"{what}: qweight {tuple(w.qweight.shape)}, qzeros {tuple(w.qzeros.shape)}, "
                         f"scales {tuple(w.scales.shape)} hold different numbers of experts")
    check_awq_shapes(K, N8, w.qzeros[0], w.scales[0], w.group_size, what)


# ----------------------------------------------------------------------------
# the reference


def _reference(x, topk_weights, topk_ids, expert) -> torch.Tensor:
    """expert(e) -> (w13 [2I, H], w2 [H, I]); float32 math, the experts in
    ascending order (as transformers), the result in x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(topk_ids).tolist():
        tok, slot = torch.where(topk_ids == e)
        w13, w2 = expert(e)
        h = x[tok].float() @ w13.float().t()
        gate, up = h.chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2.float().t()
        out.index_add_(0, tok, y * topk_weights[tok, slot, None].float())
    return out.to(x.dtype)


def fused_moe_reference(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """PyTorch fused_moe on dense weights (one matmul pair per expert with tokens)."""
    return _reference(x, topk_weights, topk_ids, lambda e: (w13[e], w2[e]))


def fused_moe_awq_reference(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """PyTorch fused_moe on AWQ (or kpack) experts: each used expert dequantized."""
    def dense(w, e):
        if isinstance(w, KPackExperts):
            return kpack_experts_dequantize(w, e)
        return awq_dequantize(w.qweight[e], w.qzeros[e], w.scales[e], w.group_size, torch.float32).t()

    def expert(e):
        return dense(w13, e), dense(w2, e)

    return _reference(x, topk_weights, topk_ids, expert)


# ----------------------------------------------------------------------------
# sorting the (token, slot) pairs by expert


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """(sorted_ids int32 [S], block_expert int32 [S / block_m], total int32 [1]) for topk_ids [T, k].

    sorted_ids holds the flat indices t * k + j grouped by expert (ascending, each
    expert's in token order), every expert's run padded to a multiple of block_m
    with the sentinel T * k; block_expert[b] is the expert of block b; total is the
    padded length. S = T k + min(E, T k) (block_m - 1), rounded up to block_m: a
    bound known from the shapes, so nothing is read back to the host.
    """
    n = topk_ids.numel()
    dev = topk_ids.device
    size = -(-(n + min(num_experts, n) * (block_m - 1)) // block_m) * block_m
    if use_triton(topk_ids) and 0 < n <= ALIGN_PAIRS:
        sorted_ids = torch.empty(size, dtype=torch.int32, device=dev)
        block_expert = torch.empty(size // block_m, dtype=torch.int32, device=dev)
        total = torch.empty(1, dtype=torch.int32, device=dev)
        off = torch.empty(next_pow2(num_experts + 1), dtype=torch.int32, device=dev)
        pairs = next_pow2(n)
        _align_kernel[(1,)](topk_ids.reshape(-1), sorted_ids, block_expert, total, off, n, num_experts, size,
                            block_m, E_BINS=off.numel(), PAIRS=pairs, CHUNK=_CHUNK, num_warps=4 if pairs <= 1024 else 8)
        return sorted_ids, block_expert, total
    flat = topk_ids.reshape(-1).to(torch.int64)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    starts = ends - padded
    e_sorted, order = torch.sort(flat, stable=True)  # the pairs grouped by expert, token order within
    first = counts.cumsum(0) - counts  # where each expert's pairs begin in `order`
    dest = starts[e_sorted] + torch.arange(n, device=dev) - first[e_sorted]
    sorted_ids = torch.full((size,), n, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, size, block_m, device=dev)
    # the expert whose padded run holds a block's first row: the first with end > start
    block_expert = torch.searchsorted(ends, block_starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


ALIGN_PAIRS = 4096  # up to this many (token, slot) pairs, moe_align is one Triton launch
_CHUNK = 128  # sentinels and block experts a step of that launch writes


@lazy_jit(pdl=True)
def _align_kernel(ids_ptr, sorted_ptr, blk_e_ptr, total_ptr, off_ptr, n, E, size, block_m,
                  E_BINS: tl.constexpr, PAIRS: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
    """moe_align in one program, by one sort: the experts' counts (a histogram, E_BINS > E so
    masked lanes fall in a bin of their own), padded run ends (a prefix sum), the padding filled
    with the sentinel n; then every pair's key expert * PAIRS + index sorted at once (stable by
    construction: token order within an expert), and the pair at sorted position p goes to
    p + off[e], off[e] = (expert e's padded start) - (its first sorted position). The chunked rank
    with an atomic per chunk this replaced was one dependent step after another; the sort has
    no loop over the pairs. On an H100, 48 calls in a CUDA graph, 128 experts, top-8 (the same
    tensors out): 5.9 against 8.0 us a call at 80 pairs, 9.6 against 21.8 at 400, 24.8 against
    71.2 at 2,048."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    lanes = tl.arange(0, PAIRS)
    bins = tl.arange(0, E_BINS)
    live = lanes < n
    e = tl.load(ids_ptr + lanes, mask=live, other=E).to(tl.int32)
    counts = tl.where(bins < E, tl.histogram(e, E_BINS), 0)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = tl.cumsum(padded, 0)
    tl.store(off_ptr + bins, ends - padded - (tl.cumsum(counts, 0) - counts))
    chunk = tl.arange(0, CHUNK)
    for s0 in range(0, size, CHUNK):
        tl.store(sorted_ptr + s0 + chunk, tl.full([CHUNK], 0, tl.int32) + n, mask=s0 + chunk < size)
    tl.store(total_ptr, tl.max(ends, 0))
    for b0 in range(0, size // block_m, CHUNK):  # a block's expert: how many runs end at or before it
        start = (b0 + chunk) * block_m
        ended = tl.sum((tl.where(bins < E, ends, size + 1)[None, :] <= start[:, None]).to(tl.int32), 1)
        tl.store(blk_e_ptr + b0 + chunk, tl.minimum(ended, E - 1), mask=b0 + chunk < size // block_m)
    key = tl.sort(e * PAIRS + lanes)  # padded lanes (expert E) sort last
    se = key // PAIRS
    tl.debug_barrier()  # the offsets and the sentinels are written before the scatter reads and overwrites
    off = tl.load(off_ptr + se, mask=se < E, other=0, cache_modifier=".cg")
    tl.store(sorted_ptr + lanes + off, key - se * PAIRS, mask=se < E)


# ----------------------------------------------------------------------------
# configs


def block_m_for(pairs: int, num_experts: int) -> int:
    """BLOCK_M for `pairs` (token, slot) pairs over the experts: about the rows each
    expert gets when the routing is even (decode: 16, the smallest MMA tile)."""
    avg = pairs / num_experts
    return 16 if avg < 24 else 32 if avg < 64 else 64 if avg < 192 else 128


# (BLOCK_N, BLOCK_K, warps, stages) candidates per BLOCK_M, timed per shape on CUDA. The gated
# GEMM stages an A tile and two B tiles (gate, up): (BM BK + 2 BK BN) * 2 bytes a stage, kept
# under the H100/H200's 227 KB of shared memory
_CANDIDATES = {
    16: [(64, 64, 4, 3), (32, 64, 4, 4), (64, 128, 4, 3), (128, 64, 4, 3), (32, 128, 4, 3), (64, 256, 4, 2),
         (128, 128, 8, 3)],
    32: [(64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 4, 3), (128, 128, 8, 2), (32, 128, 4, 3)],
    64: [(64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 4)],
    128: [(128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (128, 64, 8, 4), (64, 32, 4, 4)],
}


# (BLOCK_N, swap, warps, stages) of the kpack kernel (llm_kernels.moe_gemm_kpack) on a GPU. At 16
# rows a block (decode) on an H100 at Qwen3-30B-A3B's shapes, these were the fastest of BLOCK_N
# 32 / 64 / 128, swapped or not, on 2, 4 or 8 warps and 3 or 4 stages (w13 / w2 at 10, 50 and 256
# tokens), and 1.5-2.1x faster than the nibble-plane kernel on AutoAWQ's own packing that ran them
# before (at 50 tokens w13 91 against 169 us, w2 57 against 87 us). On sm_90, 8 warps on a swapped
# tile, and unswapped tiles of 64 rows and more, stage the dequantized tile through shared memory
# inside the loop (their TTGIR): those blocks take swapped 4-warp tiles only
_KPACK = {16: [(64, True, 4, 3), (64, False, 4, 3), (128, True, 2, 3), (128, False, 2, 3), (64, False, 4, 4)],
          32: [(64, True, 4, 3), (128, True, 4, 3), (64, False, 4, 3), (128, False, 4, 3), (128, False, 8, 3)],
          64: [(64, True, 4, 3), (128, True, 4, 3), (64, True, 4, 4), (128, True, 4, 4)]}
_KPACK[128] = _KPACK[64]


def moe_configs(block_m: int, dtype, device, group_size: int | None = None, layout: str = "dense") -> list[dict]:
    """Candidate configs of one grouped GEMM on experts of `layout` ("dense", "awq" or
    "kpack"); the first is the interpreter's and the one used when a shape is first met
    inside a graph capture. AWQ caps BLOCK_K at the group size (a K step is one group)."""
    small = device.type != "cuda" or dtype == torch.float32  # the interpreter, or the float32 correctness path
    if layout == "kpack":
        cands = [(32, False, 4, 2), (32, True, 4, 2)] if small else _KPACK[block_m]
        return [{"kind": "kpack", "BM": block_m, "BN": bn, "swap": swap, "warps": warps, "stages": stages, "GM": 8}
                for bn, swap, warps, stages in cands]
    out = []
    for bn, bk, warps, stages in [(32, 32, 4, 2)] if small else _CANDIDATES[block_m]:
        cfg = {"BM": block_m, "BN": bn, "BK": min(bk, group_size or bk), "warps": warps, "stages": stages, "GM": 8}
        if cfg not in out:
            out.append(cfg)
    return out


def layout_of(weights) -> str:
    """"kpack", "awq" or "dense": which grouped GEMM runs these experts."""
    return "kpack" if isinstance(weights, KPackExperts) else "awq" if isinstance(weights, AWQExperts) else "dense"


def _gemm(name, a, weights, out, align, topk_weights, config, key, **how):
    """One grouped GEMM with `config`, or the one tuned for `key`."""
    group = getattr(weights, "group_size", None)
    layout = layout_of(weights)
    gemm = moe_gemm_kpack if layout == "kpack" else moe_gemm

    def run(cfg):
        return gemm.launch(a, weights, out, align, topk_weights, cfg, **how)

    if config is None:
        config = autotune(name, key, lambda: moe_configs(key[0], a.dtype, a.device, group, layout), run,
                          checked=(a.dtype, group))
    return run(config)


# ----------------------------------------------------------------------------
# the public calls


def _check(x, w13_shape, w2_shape, topk_weights, topk_ids) -> tuple[int, int]:
    """(E, I), or ValueError naming what does not fit."""
    E, two_i, H = w13_shape
    if x.dim() != 2 or x.shape[1] != H or two_i % 2 or tuple(w2_shape) != (E, H, two_i // 2):
        raise ValueError(f"fused_moe: x {tuple(x.shape)}, w13 {tuple(w13_shape)}, w2 {tuple(w2_shape)} "
                         "(need x [T, H], w13 [E, 2I, H], w2 [E, H, I])")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_moe: topk_ids {tuple(topk_ids.shape)}, topk_weights {tuple(topk_weights.shape)} "
                         f"for {x.shape[0]} tokens")
    return E, two_i // 2


def _fused(x, w13, w2, topk_weights, topk_ids, E: int, inter: int, config: dict | None) -> torch.Tensor:
    T, H = x.shape
    k = topk_ids.shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    bm = config["BM"] if config else block_m_for(T * k, E)
    align = moe_align(topk_ids, E, bm)
    tw = topk_weights.reshape(-1).to(torch.float32).contiguous()
    group = getattr(w13, "group_size", 0)
    key = (bm, next_pow2(T), E, k, H, inter, x.dtype, group, layout_of(w13))
    act = torch.empty(T * k, inter, dtype=x.dtype, device=x.device)
    _gemm("moe_w13", x, w13, act, align, tw, config, key, a_div=k, gated=True, mul_w=False)
    y = torch.empty(T * k, H, dtype=x.dtype, device=x.device)
    _gemm("moe_w2", act, w2, y, align, tw, config, key, a_div=1, gated=False, mul_w=True)
    return y.view(T, k, H).sum(1) if k > 1 else y


def fused_moe(x, w13, w2, topk_weights, topk_ids, config: dict | None = None) -> torch.Tensor:
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights [T, k] (float32),
    topk_ids [T, k] -> [T, H] in x's dtype. config (tests, benchmarks): one
    llm_kernels.moe_gemm config for both GEMMs instead of the tuned ones."""
    E, inter = _check(x, w13.shape, w2.shape, topk_weights, topk_ids)
    if not (use_triton(x, w13, w2) and x.shape[0]):
        return fused_moe_reference(x, w13, w2, topk_weights, topk_ids)
    return _fused(x, w13.contiguous(), w2.contiguous(), topk_weights, topk_ids, E, inter, config)


def fused_moe_awq(x, w13, w2, topk_weights, topk_ids, config: dict | None = None) -> torch.Tensor:
    """fused_moe on 4-bit experts, AWQExperts or KPackExperts (llm_kernels.moe_gemm_kpack.
    kpack_experts of them, what the engine runs on a GPU): w13 of K = H inputs and N = 2I
    outputs (gate then up), w2 of K = I, N = H; dequantized inside the GEMMs' K loops."""
    E, inter = _check(x, w13.shape, w2.shape, topk_weights, topk_ids)
    if type(w13) is not type(w2) or not isinstance(w13, (AWQExperts, KPackExperts)):
        raise ValueError(f"fused_moe_awq: w13 and w2 must both be AWQExperts or both KPackExperts, got "
                         f"{type(w13).__name__} and {type(w2).__name__}")
    if isinstance(w13, AWQExperts):
        check_awq_experts(w13, "fused_moe_awq w13")
        check_awq_experts(w2, "fused_moe_awq w2")
    if inter % 8:
        raise ValueError(f"fused_moe_awq: intermediate size {inter} is not a multiple of 8")
    if not (use_triton(x, w13[0], w2[0]) and x.shape[0]):
        return fused_moe_awq_reference(x, w13, w2, topk_weights, topk_ids)
    w13 = type(w13)(*(t.contiguous() for t in w13[:3]), w13.group_size)
    w2 = type(w2)(*(t.contiguous() for t in w2[:3]), w2.group_size)
    return _fused(x, w13, w2, topk_weights, topk_ids, E, inter, config)
