"""RMSNorm over llm_kernels.rms_norm, fused with the residual add after the first layer;
Gemma's variant scales by (1 + weight), folded into the weight when it is loaded."""
from __future__ import annotations

import torch
from torch import nn

import llm_kernels


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device), requires_grad=False)

    def forward(self, x, residual=None):
        """(normed x, the residual for the next norm: x itself, or x + residual)."""
        if residual is None:
            return llm_kernels.rms_norm(x, self.weight, self.eps), x.clone()
        return llm_kernels.fused_add_rms_norm(x, residual, self.weight, self.eps)

    def quantized(self, x, residual=None):
        """forward(x, residual) and its output quantized per token in the same launch:
        (normed x, residual, (e4m3 rows, float32 scales [M, 1]))."""
        if residual is None:
            out, q, s = llm_kernels.rms_norm_quant(x, self.weight, self.eps)
            return out, x.clone(), (q, s)
        out, residual, q, s = llm_kernels.fused_add_rms_norm_quant(x, residual, self.weight, self.eps)
        return out, residual, (q, s)

    def plain(self, x):
        """The norm of x over its last dim (no residual): per-head q/k norms, Gemma's post norms."""
        return llm_kernels.rms_norm(x, self.weight, self.eps)


class GemmaRMSNorm(RMSNorm):
    """Gemma's checkpoints store w where the norm scales by (1 + w): the layer loads
    1 + w (computed in float32) into its weight, so it runs as a plain RMSNorm."""

    def __init__(self, size: int, eps: float, dtype, device):
        super().__init__(size, eps, dtype, device)
        self.loaded: set = set()

    def load(self, shard, name: str, tensor: torch.Tensor) -> None:
        if name != "weight":
            raise KeyError(name)
        if tuple(tensor.shape) != tuple(self.weight.shape):
            raise ValueError(f"weight: checkpoint shape {tuple(tensor.shape)}, expected {tuple(self.weight.shape)}")
        self.weight.data.copy_(tensor.float() + 1.0)
        self.loaded.add((shard, name))

    def expected(self) -> set:
        return {(0, "weight")}

    def finalize(self) -> None:
        pass
