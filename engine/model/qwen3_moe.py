"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): the Qwen3 decoder whose sparse layers
replace the MLP by a router (a dense linear, softmax in float32, top-k, optionally
renormalised) over E experts run by engine.model.layers.moe.FusedMoE. Layer i is
sparse iff i is not in mlp_only_layers, num_experts > 0 and (i + 1) divides by
decoder_sparse_step (as transformers' Qwen3MoeDecoderLayer); the others keep the
dense MLP of intermediate_size. Tensor parallelism is not supported."""
from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from engine.distributed import TPGroup
from engine.errors import UnsupportedModelError
from engine.model.layers import Linear
from engine.model.layers.moe import DOWN, GATE_UP, PROJ, FusedMoE, select_experts
from engine.model.qwen3 import Qwen3ForCausalLM
from engine.model.spec import ModelSpec, TPSplit

# our names of the experts' tensors: per expert (the hub's and AutoAWQ's spelling), or
# transformers' fused parameters of all experts
_EXPERT_KEY = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(?:(\d+)\.(gate_proj|up_proj|down_proj)\.(\w+)"
                         r"|(gate_up_proj|down_proj)(?:\.weight)?)$")


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The config's mixture-of-experts values (ModelSpec.extra["moe"])."""

    num_experts: int
    top_k: int  # num_experts_per_tok
    intermediate_size: int  # moe_intermediate_size, of each expert
    norm_topk_prob: bool  # renormalise the top-k probabilities to sum 1
    decoder_sparse_step: int
    mlp_only_layers: tuple[int, ...]

    @classmethod
    def from_config(cls, cfg) -> MoESpec:
        """Read from a transformers Qwen3MoeConfig; UnsupportedModelError when top-k cannot be."""
        spec = cls(int(getattr(cfg, "num_experts", 0) or 0), int(cfg.num_experts_per_tok),
                   int(cfg.moe_intermediate_size), bool(getattr(cfg, "norm_topk_prob", False)),
                   int(getattr(cfg, "decoder_sparse_step", 1) or 1),
                   tuple(int(i) for i in (getattr(cfg, "mlp_only_layers", None) or ())))
        if spec.num_experts and not 0 < spec.top_k <= spec.num_experts:
            raise UnsupportedModelError(f"num_experts_per_tok={spec.top_k} with num_experts={spec.num_experts}")
        return spec

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer` is a sparse MoE block (else the dense MLP)."""
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)


class SparseMoeBlock(nn.Module):
    """x -> sum over its top-k experts of weight * expert(x). The router `gate`
    [E, H] stays dense (AutoAWQ leaves it unquantized) and runs in the model's
    dtype; the selection is engine.model.layers.moe.select_experts."""

    def __init__(self, spec: ModelSpec, moe: MoESpec, prefix: str, dtype, device, tp: TPGroup):
        super().__init__()
        self.top_k, self.renormalize = moe.top_k, moe.norm_topk_prob
        self.experts = FusedMoE(moe.num_experts, spec.hidden_size, moe.intermediate_size, dtype, device,
                                spec.quant, tp, prefix)
        self.gate = Linear(spec.hidden_size, [moe.num_experts], False, dtype, device)

    def forward(self, x):
        weights, ids = select_experts(self.gate(x), self.top_k, self.renormalize)
        return self.experts(x, weights, ids)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        spec = super().spec_from_config(cfg)
        spec.extra["moe"] = MoESpec.from_config(cfg)
        return spec

    @classmethod
    def tp_rules(cls, spec: ModelSpec) -> tuple[list[tuple[str, int]], list[TPSplit]]:
        """Asked only for tensor_parallel_size > 1, which MoE layers do not support."""
        raise UnsupportedModelError(f"{spec.architecture}: mixture-of-experts layers are not supported under "
                                    "tensor parallelism; use tensor_parallel_size=1")

    def make_mlp(self, spec: ModelSpec, index: int, prefix: str, dtype, device, tp: TPGroup):
        """The sparse block for a sparse layer, the dense MLP (intermediate_size) otherwise."""
        moe: MoESpec = spec.extra["moe"]
        if moe.is_sparse(index):
            return SparseMoeBlock(spec, moe, prefix, dtype, device, tp)
        return super().make_mlp(spec, index, prefix, dtype, device, tp)

    def route_weight(self, key: str):
        """(FusedMoE module, shard, tensor name) of an expert tensor; None: the default routing."""
        m = _EXPERT_KEY.match(key.removeprefix("model."))
        if m is None:
            return None
        module, expert, proj, name, fused = m.groups()
        if fused:
            return module, GATE_UP if fused == "gate_up_proj" else DOWN, "weight"
        return module, (int(expert), PROJ.index(proj)), name
