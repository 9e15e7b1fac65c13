"""Phi-3 / Phi-4 (Phi3ForCausalLM): the Llama decoder whose checkpoints fuse q/k/v
into qkv_proj and gate/up into gate_up_proj. The fused tensors are cut into our merged
linears' shards at load (so dense and AWQ run the same linears as Llama; a fused tensor
is one copy either way). longrope (Phi-3 128k) and partial rotary (Phi-4-mini) are the
rope cache's."""
from __future__ import annotations

from engine.model.layers.linear import FUSED
from engine.model.llama import LlamaForCausalLM
from engine.model.spec import ModelSpec, TPSplit


class Phi3ForCausalLM(LlamaForCausalLM):
    packed_modules_mapping = {"qkv_proj": ("qkv_proj", FUSED), "gate_up_proj": ("gate_up_proj", FUSED)}

    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        spec = super().spec_from_config(cfg)
        spec.attention_bias = spec.mlp_bias = False
        spec.extra["o_proj_bias"] = False
        return spec

    @classmethod
    def tp_rules(cls, spec: ModelSpec) -> tuple[list[tuple[str, int]], list[TPSplit]]:
        counts, splits = super().tp_rules(spec)
        fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "gate_proj": "gate_up_proj"}
        renamed = []
        for s in splits:
            head, _, proj = s.name.rpartition(".")
            renamed.append(s._replace(name=f"{head}.{fused.get(proj, proj)}"))
        return counts, renamed
