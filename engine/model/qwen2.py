"""Qwen2 / Qwen2.5: the Llama decoder with q/k/v biases always on (none on o_proj),
and sliding-window layers only when use_sliding_window says so."""
from __future__ import annotations

from engine.model.llama import LlamaForCausalLM
from engine.model.spec import ModelSpec


class Qwen2ForCausalLM(LlamaForCausalLM):
    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        spec = super().spec_from_config(cfg)
        spec.attention_bias = True
        spec.extra["o_proj_bias"] = False
        if not getattr(cfg, "use_sliding_window", False):
            spec.sliding_window = None
        return spec
