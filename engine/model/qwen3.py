"""Qwen3 (dense): the Llama decoder with a per-head RMSNorm on q and k before rotary,
an explicit head_dim (hidden / heads need not be it), and no q/k/v bias by default."""
from __future__ import annotations

from engine.model.layers import RMSNorm
from engine.model.llama import LlamaForCausalLM
from engine.model.spec import ModelSpec


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = RMSNorm

    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        spec = super().spec_from_config(cfg)
        if not getattr(cfg, "use_sliding_window", False):
            spec.sliding_window = None
        return spec
