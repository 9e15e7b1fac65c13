"""The Llama family (Llama 2/3, Mistral, SmolLM2) and the decoder the other families
build on (qwen2.py, qwen3.py, phi3.py, gemma3.py): one decoder over paged attention, dense or quantized linears."""
from __future__ import annotations

import dataclasses
import re

import torch
from torch import nn

import llm_kernels
from engine.distributed import SINGLE, TPGroup
from engine.errors import UnsupportedModelError
from engine.model.layers import Linear, PagedAttention, RMSNorm, VocabParallelEmbedding, make_linear, rope_cache
from engine.model.layers.quantized_input import act_before, norm_before
from engine.model.layers.rotary import rope_is_two_sided, rope_long_after
from engine.model.spec import ModelSpec, TPSplit, partial_rotary_factor, rope_from_config


# an FP8 KV cache's per-tensor scales: self_attn.{k,v,kv}_scale, or compressed-tensors'
# older self_attn.{k,v}_proj.output_scale; they belong to the paged attention (self_attn.attn)
_KV_SCALE = re.compile(r"\.self_attn\.(?:(k|v|kv)_scale|(k|v)_proj\.output_scale)$")


def kv_scale_name(key: str) -> str:
    """Our name of a checkpoint tensor, with a KV-cache scale moved to the attention layer."""
    return _KV_SCALE.sub(lambda m: f".self_attn.attn.{m.group(1) or m.group(2)}_scale", key)


class Attention(nn.Module):
    """Under tensor parallelism: this rank's heads and KV heads (q/k/v column-split, o row-split).
    qk_norm: a per-head norm class applied to q and k before rotary (Qwen3, Gemma 3), None: none."""

    def __init__(self, spec: ModelSpec, prefix: str, dtype, device, tp: TPGroup = SINGLE, *, window=None,
                 scale=None, softcap=None, qk_norm=None):
        super().__init__()
        hd = spec.head_dim
        heads = tp.part(spec.num_heads, "num_attention_heads")
        kv_heads = tp.part(spec.num_kv_heads, "num_key_value_heads")
        self.q_size, self.kv_size = heads * hd, kv_heads * hd
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, hd
        q, kv = spec.num_heads * hd, spec.num_kv_heads * hd
        self.qkv_proj = make_linear(spec.quant, prefix + "qkv_proj", spec.hidden_size, [q, kv, kv],
                                    spec.attention_bias, dtype, device, tp, "column")
        self.o_proj = make_linear(spec.quant, prefix + "o_proj", q, [spec.hidden_size],
                                  spec.extra.get("o_proj_bias", False), dtype, device, tp, "row")
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = qk_norm(hd, spec.rms_norm_eps, dtype, device)
            self.k_norm = qk_norm(hd, spec.rms_norm_eps, dtype, device)
        self.attn = PagedAttention(heads, kv_heads, hd, scale=scale, sliding_window=window, softcap=softcap)

    def forward(self, positions, x, cos_sin):
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is None:
            q, k = llm_kernels.rotary_embedding(positions, q, k, cos_sin)
        else:  # each head's norm in the rotary's launch
            q, k = llm_kernels.rotary_embedding(positions, q, k, cos_sin, self.q_norm.weight, self.k_norm.weight,
                                                self.q_norm.eps)
        out = self.attn(q, k, v)
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    """down(act(gate) * up); act silu, or gelu-tanh (Gemma) when spec.extra["act"] says so."""

    def __init__(self, spec: ModelSpec, prefix: str, dtype, device, tp: TPGroup = SINGLE,
                 intermediate_size: int | None = None):
        super().__init__()
        i = intermediate_size or spec.intermediate_size
        self.gelu = spec.extra.get("act") == "gelu_tanh"
        self.gate_up_proj = make_linear(spec.quant, prefix + "gate_up_proj", spec.hidden_size, [i, i], spec.mlp_bias,
                                        dtype, device, tp, "column")
        self.down_proj = make_linear(spec.quant, prefix + "down_proj", i, [spec.hidden_size], spec.mlp_bias, dtype,
                                     device, tp, "row")

    def forward(self, x):
        return self.down_proj(act_before(self.gate_up_proj(x), self.gelu, self.down_proj))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention and MLP (built by the model class, so a family
    can change either), the residual add fused into the norm that follows it."""

    def __init__(self, model, spec: ModelSpec, index: int, dtype, device, tp: TPGroup = SINGLE):
        super().__init__()
        p = f"model.layers.{index}."
        self.self_attn = model.make_attention(spec, index, p + "self_attn.", dtype, device, tp)
        self.mlp = model.make_mlp(spec, index, p + "mlp.", dtype, device, tp)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)

    def forward(self, positions, x, residual, cos_sin):
        # each norm may also quantize its output for an FP8 linear after it (norm_before)
        x, residual = norm_before(self.input_layernorm, x, residual, getattr(self.self_attn, "qkv_proj", None))
        x = self.self_attn(positions, x, cos_sin)
        x, residual = norm_before(self.post_attention_layernorm, x, residual, getattr(self.mlp, "gate_up_proj", None))
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """The Llama decoder; families change it through make_attention / make_mlp /
    layer_class, spec_from_config, embed and the rope caches."""

    # checkpoint projection -> (our merged module, shard index; FUSED: a tensor of all shards)
    packed_modules_mapping = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }
    layer_class = DecoderLayer
    qk_norm = None  # a per-head norm class on q and k before rotary (Qwen3, Gemma 3)
    activations = ("silu",)  # hidden_act values the family runs

    @classmethod
    def spec_from_config(cls, cfg, rope_params: dict | None = None) -> ModelSpec:
        """rope_params: the rope entry to read instead of the config's own (Gemma 3's per layer type)."""
        theta, scaling = rope_from_config(cfg, rope_params)
        act = getattr(cfg, "hidden_act", None) or getattr(cfg, "hidden_activation", None) or "silu"
        if act not in cls.activations:
            raise UnsupportedModelError(f"activation {act!r} is not supported ({', '.join(cls.activations)})")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        layer_types = getattr(cfg, "layer_types", None)
        return ModelSpec(
            architecture=cfg.architectures[0],
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", None) or 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 4096)),
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            attention_bias=bool(getattr(cfg, "attention_bias", False)),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            eos_token_id=getattr(cfg, "eos_token_id", None),
            sliding_window=getattr(cfg, "sliding_window", None) or None,
            layer_types=tuple(layer_types) if layer_types else None,
            rotary_dim=int(head_dim * partial_rotary_factor(cfg)),
            extra={"o_proj_bias": bool(getattr(cfg, "attention_bias", False))},
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
        self.layers = nn.ModuleList(self.layer_class(self, spec, i, dtype, device, tp) for i in range(spec.num_layers))
        self.norm = self.make_norm(spec.hidden_size, spec, dtype, device)
        if spec.tie_word_embeddings:
            pass  # the embedding's weight makes the logits
        elif tp.size == 1:
            self.lm_head = Linear(spec.hidden_size, [spec.vocab_size], False, dtype, device)
        else:
            self.lm_head = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, dtype, device, tp)
        self.register_buffer("cos_sin", self.rope(spec.rope_theta, spec.rope_scaling, max_positions, device),
                             persistent=False)
        # longrope: rows [max_positions, 2 max_positions) of the cache hold the long factors;
        # long_rope = (the length past which they serve, their row offset), read by the runner
        self.long_rope = None
        if rope_is_two_sided(spec.rope_scaling):
            after = rope_long_after(spec.rope_scaling, max_position_embeddings=spec.max_position_embeddings)
            self.long_rope = (after, max_positions)

    # -- what a family changes ----------------------------------------------------------------
    def rope(self, theta, scaling, max_positions, device):
        """The cos/sin cache for one rope base and scaling."""
        spec = self.spec
        return rope_cache(spec.head_dim, max_positions, theta, scaling, device, rotary_dim=spec.rotary_dim,
                          max_position_embeddings=spec.max_position_embeddings)

    def make_norm(self, size, spec: ModelSpec, dtype, device):
        return RMSNorm(size, spec.rms_norm_eps, dtype, device)

    def make_attention(self, spec: ModelSpec, index: int, prefix: str, dtype, device, tp: TPGroup):
        return Attention(spec, prefix, dtype, device, tp, window=spec.window(index), qk_norm=self.qk_norm)

    def make_mlp(self, spec: ModelSpec, index: int, prefix: str, dtype, device, tp: TPGroup):
        return MLP(spec, prefix, dtype, device, tp)

    def rope_of(self, index: int):
        """The cos/sin cache layer `index` rotates with."""
        return self.cos_sin

    def embed(self, input_ids):
        return self.embed_tokens(input_ids)

    # -- the model ------------------------------------------------------------------------------
    def checkpoint_name(self, name: str) -> str | None:
        """Our name of a checkpoint tensor (None: not loaded)."""
        if "rotary_emb.inv_freq" in name:
            return None
        key = kv_scale_name(name.removeprefix("model."))
        if key == "lm_head.weight" and self.spec.tie_word_embeddings:
            return None  # tied: the embeddings serve
        return key

    def forward(self, input_ids, positions):
        """Hidden states [T, hidden] of the packed new tokens of this step (positions:
        the rope cache rows, the token positions except for longrope's long rows)."""
        x = self.embed(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(positions, x, residual, self.rope_of(i))
        x, _ = self.norm(x, residual)
        return x

    def compute_logits(self, hidden):
        if self.tp.size > 1:
            logits = (self.embed_tokens if self.spec.tie_word_embeddings else self.lm_head).logits(hidden)
        elif self.spec.tie_word_embeddings:
            logits = llm_kernels.dense_linear(hidden, self.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden)
        cap = self.spec.extra.get("final_logit_softcapping")
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits
