"""The router's expert choice of a mixture of experts: softmax over the experts in float32, the
top k, renormalised to sum 1 when asked (transformers' Qwen3-MoE / Qwen2-MoE / Mixtral
routers). In PyTorch that is four to five kernels a layer (softmax, top-k and its sort, the
sum, the division); the Triton kernel does it in one launch: a program takes BLOCK_T tokens'
logits, and k rounds of a row maximum pick the experts (the lowest index among equal
probabilities), so the weights and ids are written once."""
from __future__ import annotations

import torch
import triton.language as tl

from llm_kernels.dispatch import lazy_jit, next_pow2, use_triton
from llm_kernels.pdl import gdc_launch_dependents, gdc_wait

BLOCK_T = 16  # tokens a program


def select_experts_reference(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """The PyTorch ops (the CPU path and the tests' oracle)."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


@lazy_jit(pdl=True)
def _route_kernel(logits_ptr, w_ptr, ids_ptr, T, E, stride_t,
                  K: tl.constexpr, K_P2: tl.constexpr, E_P2: tl.constexpr, BLOCK_T: tl.constexpr,
                  RENORM: tl.constexpr, PDL: tl.constexpr = False):
    """weights [T, K] float32 and ids [T, K] int64 of BLOCK_T tokens."""
    if PDL:  # programmatic dependent launch (llm_kernels.pdl): wait for the previous kernel here
        gdc_wait()
        gdc_launch_dependents()
    rt = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    re = tl.arange(0, E_P2)
    rk = tl.arange(0, K_P2)
    tmask = rt < T
    x = tl.load(logits_ptr + rt.to(tl.int64)[:, None] * stride_t + re[None, :],
                mask=tmask[:, None] & (re < E)[None, :], other=float("-inf")).to(tl.float32)
    x = tl.where(tmask[:, None], x, 0.0)  # rows past T: finite, never stored
    p = tl.exp(x - tl.max(x, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]  # experts past E: exp(-inf) = 0
    p = tl.where((re < E)[None, :], p, -1.0)  # never picked, even where every probability underflows
    w = tl.zeros([BLOCK_T, K_P2], tl.float32)
    ids = tl.zeros([BLOCK_T, K_P2], tl.int32)
    for j in tl.static_range(K):
        best = tl.max(p, axis=1)
        pick = tl.min(tl.where(p == best[:, None], re[None, :], E_P2), axis=1)
        pick = tl.minimum(pick, E - 1)  # a NaN row matches nothing: an id in range all the same
        w = tl.where(rk[None, :] == j, best[:, None], w)
        ids = tl.where(rk[None, :] == j, pick[:, None], ids)
        p = tl.where(re[None, :] == pick[:, None], -1.0, p)
    if RENORM:
        w = w / tl.sum(w, axis=1)[:, None]  # columns past K hold 0
    out = rt.to(tl.int64)[:, None] * K + rk[None, :]
    omask = tmask[:, None] & (rk < K)[None, :]
    tl.store(w_ptr + out, w, mask=omask)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=omask)


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """(weights float32 [T, k], ids int64 [T, k]) for router logits [T, E]: one Triton launch on
    CUDA (and under the interpreter), the PyTorch ops elsewhere."""
    T, E = router_logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"select_experts: top_k {top_k} for {E} experts")
    if not (use_triton(router_logits) and T):
        return select_experts_reference(router_logits, top_k, renormalize)
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    weights = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    _route_kernel[(-(-T // BLOCK_T),)](logits, weights, ids, T, E, logits.stride(0), K=top_k,
                                       K_P2=next_pow2(top_k), E_P2=next_pow2(E), BLOCK_T=BLOCK_T, RENORM=renormalize,
                                       num_warps=4)
    return weights, ids
