"""The Llama family (Llama 2/3, Mistral without sliding window, SmolLM2; Qwen2
in qwen2.py): one decoder over paged attention, dense or quantized linears."""
from __future__ import annotations

import dataclasses

from torch import nn

import kernels
from engine.distributed import SINGLE, TPGroup
from engine.errors import UnsupportedModelError
from engine.model.layers import Linear, PagedAttention, RMSNorm, VocabParallelEmbedding, make_linear, rope_cache
from engine.model.spec import ModelSpec, TPSplit, rope_from_config


class Attention(nn.Module):
    """Under tensor parallelism: this rank's heads and KV heads (q/k/v column-split, o row-split)."""

    def __init__(self, spec: ModelSpec, prefix: str, dtype, device, tp: TPGroup = SINGLE):
        super().__init__()
        hd = spec.head_dim
        heads = tp.part(spec.num_heads, "num_attention_heads")
        kv_heads = tp.part(spec.num_kv_heads, "num_key_value_heads")
        self.q_size, self.kv_size = heads * hd, kv_heads * hd
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, hd
        q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
        self.qkv_proj = make_linear(spec.quant, prefix + "qkv_proj", spec.hidden_size, [q, kv, kv],
                                    spec.attention_bias, dtype, device, tp, "column")
        self.o_proj = make_linear(spec.quant, prefix + "o_proj", q, [spec.hidden_size], False, dtype, device, tp,
                                  "row")
        self.attn = PagedAttention(heads, kv_heads, hd)

    def forward(self, positions, x, cos_sin):
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        q, k = kernels.rotary_embedding(positions, q, k, cos_sin)
        out = self.attn(q, k, v)
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, prefix: str, dtype, device, tp: TPGroup = SINGLE):
        super().__init__()
        i = spec.intermediate_size
        self.gate_up_proj = make_linear(spec.quant, prefix + "gate_up_proj", spec.hidden_size, [i, i], spec.mlp_bias,
                                        dtype, device, tp, "column")
        self.down_proj = make_linear(spec.quant, prefix + "down_proj", i, [spec.hidden_size], spec.mlp_bias, dtype,
                                     device, tp, "row")

    def forward(self, x):
        return self.down_proj(kernels.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, index: int, dtype, device, tp: TPGroup = SINGLE):
        super().__init__()
        p = f"model.layers.{index}."
        self.self_attn = Attention(spec, p + "self_attn.", dtype, device, tp)
        self.mlp = MLP(spec, p + "mlp.", dtype, device, tp)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)

    def forward(self, positions, x, residual, cos_sin):
        x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, cos_sin)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    # checkpoint projection -> (our merged module, shard index)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        theta, scaling = rope_from_config(cfg)
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"activation {cfg.hidden_act!r} is not supported (silu)")
        heads = cfg.num_attention_heads
        return ModelSpec(
            architecture=cfg.architectures[0],
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            rms_norm_eps=float(cfg.rms_norm_eps),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(cfg, "attention_bias", False)),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            eos_token_id=getattr(cfg, "eos_token_id", None),
            sliding_window=getattr(cfg, "sliding_window", None),
        )

    @classmethod
    def tp_rules(cls, spec: ModelSpec) -> tuple[list[tuple[str, int]], list[TPSplit]]:
        """(counts every rank must get an equal share of, the split linears of a layer)."""
        hd, layer, i = spec.head_dim, "model.layers.0.", spec.intermediate_size
        counts = [("num_attention_heads", spec.num_heads), ("num_key_value_heads", spec.num_kv_heads),
                  ("intermediate_size", i)]
        return counts, [
            TPSplit(layer + "self_attn.q_proj", spec.num_heads * hd, "column"),
            TPSplit(layer + "self_attn.k_proj", spec.num_kv_heads * hd, "column"),
            TPSplit(layer + "mlp.gate_proj", i, "column"),
            TPSplit(layer + "self_attn.o_proj", spec.num_heads * hd, "row"),
            TPSplit(layer + "mlp.down_proj", i, "row"),
        ]

    def __init__(self, spec: ModelSpec, dtype, device, max_positions: int, tp: TPGroup = SINGLE):
        """tp.size > 1: this rank's shard; its `spec` then counts this rank's heads and
        KV heads (what its KV cache holds), the rest of the spec is the whole model's."""
        super().__init__()
        self.tp = tp
        self.spec = spec if tp.size == 1 else dataclasses.replace(
            spec, num_heads=tp.part(spec.num_heads, "num_attention_heads"),
            num_kv_heads=tp.part(spec.num_kv_heads, "num_key_value_heads"))
        if tp.size == 1:
            self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
            self.embed_tokens.weight.requires_grad_(False)
        else:
            self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, dtype, device, tp)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, dtype, device, tp) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        if spec.tie_word_embeddings:
            self.lm_head_weight = None
        elif tp.size == 1:
            self.lm_head = Linear(spec.hidden_size, [spec.vocab_size], False, dtype, device)
        else:
            self.lm_head = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, dtype, device, tp)
        self.register_buffer(
            "cos_sin", rope_cache(spec.head_dim, max_positions, spec.rope_theta, spec.rope_scaling, device), persistent=False
        )

    def checkpoint_name(self, name: str) -> str | None:
        """Our name of a checkpoint tensor (None: not loaded)."""
        if "rotary_emb.inv_freq" in name:
            return None
        key = name.removeprefix("model.")
        if key == "lm_head.weight" and self.spec.tie_word_embeddings:
            return None  # tied: the embeddings serve
        return key

    def forward(self, input_ids, positions):
        """Hidden states [T, hidden] of the packed new tokens of this step."""
        x = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, self.cos_sin)
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden):
        if self.tp.size > 1:
            return (self.embed_tokens if self.spec.tie_word_embeddings else self.lm_head).logits(hidden)
        if self.spec.tie_word_embeddings:
            return hidden @ self.embed_tokens.weight.t()
        return self.lm_head(hidden)
