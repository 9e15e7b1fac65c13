"""Gemma 3 (text, Gemma3ForCausalLM) and Gemma 2 (Gemma2ForCausalLM): the Llama decoder
with embeddings scaled by sqrt(hidden), RMSNorm scaling by (1 + weight), norms before
and after both attention and MLP, a GELU-tanh gated MLP, the attention scale from
query_pre_attn_scalar, interleaved sliding / full attention layers (layer_types).
Gemma 3: q/k norms, and its own rope base (and scaling) per layer type. Gemma 2:
tanh soft-capping of the attention scores and of the final logits."""
from __future__ import annotations

import torch
from torch import nn

from engine.distributed import SINGLE, TPGroup
from engine.errors import UnsupportedModelError
from engine.model.layers import GemmaRMSNorm
from engine.model.llama import Attention, LlamaForCausalLM
from engine.model.spec import ModelSpec, rope_from_config

SLIDING, FULL = "sliding_attention", "full_attention"


class GemmaDecoderLayer(nn.Module):
    """x -> x + post_attn(attn(input(x))) -> x + post_ff(mlp(pre_ff(x))); the residual
    adds fused into the input and pre-feedforward norms."""

    def __init__(self, model, spec: ModelSpec, index: int, dtype, device, tp):
        super().__init__()
        p = f"model.layers.{index}."
        self.self_attn = model.make_attention(spec, index, p + "self_attn.", dtype, device, tp)
        self.mlp = model.make_mlp(spec, index, p + "mlp.", dtype, device, tp)
        norm = lambda: GemmaRMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()

    def forward(self, positions, x, residual, cos_sin):
        x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm.plain(self.self_attn(positions, x, cos_sin))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm.plain(self.mlp(x)), residual


class Gemma3ForCausalLM(LlamaForCausalLM):
    layer_class = GemmaDecoderLayer
    qk_norm = GemmaRMSNorm
    activations = ("gelu_pytorch_tanh",)

    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        if getattr(cfg, "use_bidirectional_attention", False):
            raise UnsupportedModelError("use_bidirectional_attention is not supported (causal attention only)")
        params = getattr(cfg, "rope_parameters", None) or {}
        per_type = isinstance(params, dict) and FULL in params
        spec = super().spec_from_config(cfg, params.get(FULL) if per_type else None)
        spec.extra.update(
            act="gelu_tanh",
            attn_scale=float(getattr(cfg, "query_pre_attn_scalar", None) or spec.head_dim) ** -0.5,
            attn_softcap=getattr(cfg, "attn_logit_softcapping", None) or None,
            final_logit_softcapping=getattr(cfg, "final_logit_softcapping", None) or None,
        )
        if per_type and params.get(SLIDING):
            spec.extra["rope_local"] = rope_from_config(cfg, params[SLIDING])
        elif getattr(cfg, "rope_local_base_freq", None):  # transformers 4's spelling
            spec.extra["rope_local"] = (float(cfg.rope_local_base_freq), None)
        return spec

    def __init__(self, spec: ModelSpec, dtype, device, max_positions: int, tp: TPGroup = SINGLE):
        super().__init__(spec, dtype, device, max_positions, tp)
        local = spec.extra.get("rope_local")
        if local is not None:
            self.register_buffer("cos_sin_local", self.rope(*local, max_positions, device), persistent=False)
        self.embed_scale = float(spec.hidden_size) ** 0.5

    def make_norm(self, size, spec: ModelSpec, dtype, device):
        return GemmaRMSNorm(size, spec.rms_norm_eps, dtype, device)

    def make_attention(self, spec: ModelSpec, index: int, prefix: str, dtype, device, tp):
        return Attention(spec, prefix, dtype, device, tp, window=spec.window(index), scale=spec.extra["attn_scale"],
                         softcap=spec.extra["attn_softcap"], qk_norm=self.qk_norm)

    def rope_of(self, index: int):
        if self.spec.window(index) is not None and hasattr(self, "cos_sin_local"):
            return self.cos_sin_local
        return self.cos_sin

    def embed(self, input_ids):
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(self.embed_scale, dtype=x.dtype)  # the scale rounded to the dtype, as Gemma's


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    qk_norm = None
