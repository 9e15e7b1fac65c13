"""Mixture-of-experts layers: top-k expert selection from router logits, and
FusedMoE, the E experts' weights of one layer (dense, or AWQ 4-bit) run by
llm_kernels.fused_moe / llm_kernels.fused_moe_awq.

FusedMoE is loadable by engine.model.loader (load / expected / loaded /
finalize). Shards: (e, 0) gate, (e, 1) up, (e, 2) down of expert e, tensor
"weight" (dense) or "qweight" / "qzeros" / "scales" (AutoAWQ GEMM); and, dense
only, GATE_UP / DOWN: transformers' fused tensors of all experts
(experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]).
"""
from __future__ import annotations

import torch
from torch import nn

import llm_kernels
from engine.distributed import SINGLE, TPGroup
from engine.errors import UnsupportedModelError
from engine.quant import QuantMethod

GATE_UP, DOWN = "gate_up_proj", "down_proj"  # the fused shards, named as transformers' parameters
PROJ = ("gate_proj", "up_proj", "down_proj")  # shard j of an expert: PROJ[j]
AWQ_TENSORS = ("qweight", "qzeros", "scales")
PACK = 8  # int4 values per int32 word (AWQ)


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """(weights float32 [T, k], ids int64 [T, k]): softmax in float32 over the experts,
    the top k, renormalised to sum 1 when asked (transformers' Qwen3-MoE / Qwen2-MoE
    / Mixtral routers): llm_kernels.select_experts, one launch on a GPU, the same torch
    ops as transformers on the CPU."""
    return llm_kernels.select_experts(router_logits, top_k, renormalize)


class FusedMoE(nn.Module):
    """E experts of hidden size H and intermediate size I. Dense: parameters
    w13_weight [E, 2I, H] (gate rows, then up) and w2_weight [E, H, I] in the model's
    dtype. AWQ (quant covers `prefix`): buffers in llm_kernels.AWQExperts' layout,
    w13_{qweight,qzeros,scales} ([E, H, 2I/8], [E, H/G, 2I/8], [E, H/G, 2I]) and
    w2_* ([E, I, H/8], [E, I/G, H/8], [E, I/G, H]); each expert's checkpoint tensors
    are copied into their slice as they are. At finalize a GPU (or the interpreter)
    repacks them into the dense 4-bit path's K-packed layout (llm_kernels.KPackExperts:
    1.5-2x faster expert GEMMs at decode) when K is whole 128-row blocks; on the CPU
    outside the interpreter they are dequantized once and run dense."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, dtype, device,
                 quant: QuantMethod | None = None, tp: TPGroup = SINGLE, prefix: str = ""):
        super().__init__()
        if tp.size > 1:
            raise UnsupportedModelError(f"mixture-of-experts layers ({prefix}experts) are not supported under "
                                        f"tensor parallelism (tensor_parallel_size={tp.size}); use 1")
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.prefix = prefix
        self.quant = quant if quant is not None and quant.covers(prefix + "experts") else None
        if self.quant is not None and self.quant.name != "awq":  # before any weight is read
            raise UnsupportedModelError(f"{prefix}experts: {self.quant.name} mixture-of-experts weights are not "
                                        "supported (AWQ only)")
        self.loaded: set = set()
        self.dense = None  # AWQ on the CPU: the dequantized (w13, w2)
        self.kpack = None  # AWQ on a GPU: (w13, w2) as llm_kernels.KPackExperts
        E, H, inter = num_experts, hidden_size, intermediate_size
        if self.quant is None:
            self.w13_weight = nn.Parameter(torch.empty(E, 2 * inter, H, dtype=dtype, device=device), requires_grad=False)
            self.w2_weight = nn.Parameter(torch.empty(E, H, inter, dtype=dtype, device=device), requires_grad=False)
            return
        G = self.group_size = self.quant.group_size
        if H % G or inter % G or H % PACK or inter % PACK:
            raise UnsupportedModelError(f"{prefix}experts: hidden {H} / moe intermediate {inter} do not fit AWQ "
                                        f"group {G} and packing {PACK}")
        for name, (K, N) in (("w13", (H, 2 * inter)), ("w2", (inter, H))):
            self.register_buffer(f"{name}_qweight", torch.zeros(E, K, N // PACK, dtype=torch.int32, device=device))
            self.register_buffer(f"{name}_qzeros", torch.zeros(E, K // G, N // PACK, dtype=torch.int32, device=device))
            self.register_buffer(f"{name}_scales", torch.zeros(E, K // G, N, dtype=dtype, device=device))

    def tensor_names(self) -> tuple[str, ...]:
        """The checkpoint tensors of each expert projection."""
        return ("weight",) if self.quant is None else AWQ_TENSORS

    def expected(self) -> set:
        """Every (shard, tensor name) the checkpoint must fill (a fused tensor fills its shards)."""
        return {((e, j), n) for e in range(self.num_experts) for j in range(3) for n in self.tensor_names()}

    def load(self, shard, name: str, tensor: torch.Tensor) -> None:
        """One checkpoint tensor: of expert e's projection j (shard (e, j)), or a fused
        tensor of all experts (shard GATE_UP / DOWN, dense)."""
        if name not in self.tensor_names():
            raise KeyError(name)
        if shard in (GATE_UP, DOWN):
            self._load_fused(shard, name, tensor)
            return
        e, j = shard
        if not (0 <= e < self.num_experts and j in (0, 1, 2)):
            raise ValueError(f"{self.prefix}experts.{e}.{PROJ[j] if j in (0, 1, 2) else j}: no such expert "
                             f"(the layer has {self.num_experts})")
        dst, want = self._slot(e, j, name)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{self.prefix}experts.{e}.{PROJ[j]}.{name}: checkpoint shape {tuple(tensor.shape)}, "
                             f"expected {want}")
        dst.copy_(tensor)
        self.loaded.add(((e, j), name))

    def _slot(self, e: int, j: int, name: str) -> tuple[torch.Tensor, tuple]:
        """(where tensor `name` of expert e's projection j goes, its checkpoint shape)."""
        H, inter = self.hidden_size, self.intermediate_size
        if self.quant is None:
            if j == 2:
                return self.w2_weight.data[e], (H, inter)
            return self.w13_weight.data[e, j * inter : (j + 1) * inter], (inter, H)
        G = self.group_size
        if j == 2:
            rows = {"qweight": inter, "qzeros": inter // G, "scales": inter // G}[name]
            cols = H if name == "scales" else H // PACK
            return getattr(self, f"w2_{name}")[e], (rows, cols)
        rows = {"qweight": H, "qzeros": H // G, "scales": H // G}[name]
        cols = inter if name == "scales" else inter // PACK
        return getattr(self, f"w13_{name}")[e, :, j * cols : (j + 1) * cols], (rows, cols)

    def _load_fused(self, shard: str, name: str, tensor: torch.Tensor) -> None:
        E, H, inter = self.num_experts, self.hidden_size, self.intermediate_size
        if self.quant is not None:
            raise ValueError(f"{self.prefix}experts.{shard}: a fused experts tensor in an AWQ checkpoint "
                             "(expected per-expert qweight/qzeros/scales)")
        param, want, shards = ((self.w13_weight, (E, 2 * inter, H), (0, 1)) if shard == GATE_UP
                               else (self.w2_weight, (E, H, inter), (2,)))
        if tuple(tensor.shape) != want:
            raise ValueError(f"{self.prefix}experts.{shard}: checkpoint shape {tuple(tensor.shape)}, expected {want}")
        param.data.copy_(tensor)
        self.loaded.update(((e, j), name) for e in range(E) for j in shards)

    def awq_experts(self) -> tuple[llm_kernels.AWQExperts, llm_kernels.AWQExperts]:
        """(w13, w2) as llm_kernels.AWQExperts."""
        G = self.group_size
        return (llm_kernels.AWQExperts(self.w13_qweight, self.w13_qzeros, self.w13_scales, G),
                llm_kernels.AWQExperts(self.w2_qweight, self.w2_qzeros, self.w2_scales, G))

    def finalize(self) -> None:
        """After loading (or dummy filling): AWQ on a GPU (and under the interpreter) is
        repacked into kpack experts, the checkpoint's buffers freed, where the layout fits
        (else the GEMMs read AutoAWQ's packing as loaded); on the CPU outside the interpreter
        it is dequantized once (no int4 matmul there)."""
        if self.quant is None or self.kpack is not None:
            return
        if llm_kernels.use_triton(self.w13_qweight):
            if llm_kernels.kpack_fits(self.intermediate_size, self.group_size) and \
                    llm_kernels.kpack_fits(self.hidden_size, self.group_size):
                self.kpack = tuple(llm_kernels.kpack_experts(w) for w in self.awq_experts())
                for name in ("w13", "w2"):  # the checkpoint's layout is not read again
                    for t in AWQ_TENSORS:
                        setattr(self, f"{name}_{t}", torch.empty(0, dtype=getattr(self, f"{name}_{t}").dtype,
                                                                 device=self.w13_scales.device))
            return
        dtype = self.w13_scales.dtype
        w13, w2 = self.awq_experts()
        self.dense = (llm_kernels.awq_experts_dequantize(w13, torch.float32).to(dtype),
                      llm_kernels.awq_experts_dequantize(w2, torch.float32).to(dtype))

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """x [T, H] through each token's k experts, weighted: [T, H]."""
        if self.quant is None:
            return llm_kernels.fused_moe(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids)
        if self.dense is not None:
            return llm_kernels.fused_moe(x, *self.dense, topk_weights, topk_ids)
        return llm_kernels.fused_moe_awq(x, *(self.kpack or self.awq_experts()), topk_weights, topk_ids)
