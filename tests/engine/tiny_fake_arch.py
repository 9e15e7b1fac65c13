"""A made-up architecture, added as a real one is (this file and a registry line): its own
checkpoint names (wq/wk/wv fused into wqkv), a GELU MLP, tied embeddings; GELU configs only."""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

import llm_kernels
from engine.distributed import SINGLE, TPGroup
from engine.errors import UnsupportedModelError
from engine.model.layers import PagedAttention, RMSNorm, make_linear, rope_cache
from engine.model.spec import ModelSpec, TPSplit, rope_from_config


class FakeAttention(nn.Module):
    def __init__(self, spec: ModelSpec, prefix: str, dtype, device):
        super().__init__()
        self.heads, self.kv_heads, self.hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        q, kv = self.heads * self.hd, self.kv_heads * self.hd
        self.wqkv = make_linear(spec.quant, prefix + "wqkv", spec.hidden_size, [q, kv, kv], False, dtype, device)
        self.wo = make_linear(spec.quant, prefix + "wo", q, [spec.hidden_size], False, dtype, device)
        self.paged = PagedAttention(self.heads, self.kv_heads, self.hd)

    def forward(self, positions, x, cos_sin):
        q, k, v = self.wqkv(x).split([self.heads * self.hd, self.kv_heads * self.hd, self.kv_heads * self.hd], -1)
        q, k = llm_kernels.rotary_embedding(positions, q.reshape(-1, self.heads, self.hd),
                                        k.reshape(-1, self.kv_heads, self.hd), cos_sin)
        out = self.paged(q, k, v.reshape(-1, self.kv_heads, self.hd))
        return self.wo(out.reshape(-1, self.heads * self.hd))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, index: int, dtype, device):
        super().__init__()
        p, h = f"blocks.{index}.", spec.hidden_size
        self.ln1 = RMSNorm(h, spec.rms_norm_eps, dtype, device)
        self.attn = FakeAttention(spec, p + "attn.", dtype, device)
        self.ln2 = RMSNorm(h, spec.rms_norm_eps, dtype, device)
        self.fc1 = make_linear(spec.quant, p + "fc1", h, [spec.intermediate_size], False, dtype, device)
        self.fc2 = make_linear(spec.quant, p + "fc2", spec.intermediate_size, [h], False, dtype, device)

    def forward(self, positions, x, cos_sin):
        x = x + self.attn(positions, self.ln1(x)[0], cos_sin)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)[0])))


class TinyFakeForCausalLM(nn.Module):
    packed_modules_mapping = {"wq": ("wqkv", 0), "wk": ("wqkv", 1), "wv": ("wqkv", 2)}

    @classmethod
    def spec_from_config(cls, cfg) -> ModelSpec:
        if cfg.hidden_act != "gelu":
            raise UnsupportedModelError(f"TinyFake with activation {cfg.hidden_act!r} is not supported (gelu)")
        theta, scaling = rope_from_config(cfg)
        heads = cfg.num_attention_heads
        return ModelSpec(
            architecture=cfg.architectures[0], vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers, num_heads=heads,
            num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.hidden_size // heads, rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=theta, rope_scaling=scaling, max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=True, attention_bias=False, mlp_bias=False, eos_token_id=cfg.eos_token_id,
        )

    @classmethod
    def tp_rules(cls, spec: ModelSpec) -> tuple[list[tuple[str, int]], list[TPSplit]]:
        return [("num_attention_heads", spec.num_heads)], []

    def __init__(self, spec: ModelSpec, dtype, device, max_positions: int, tp: TPGroup = SINGLE):
        super().__init__()
        assert tp.size == 1, "no tensor parallelism here"
        self.spec = spec
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        self.tok.weight.requires_grad_(False)
        self.blocks = nn.ModuleList(Block(spec, i, dtype, device) for i in range(spec.num_layers))
        self.ln_f = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.register_buffer("cos_sin", rope_cache(spec.head_dim, max_positions, spec.rope_theta, None, device),
                             persistent=False)

    def checkpoint_name(self, name: str) -> str | None:
        return name

    def forward(self, input_ids, positions):
        x = self.tok(input_ids)
        for block in self.blocks:
            x = block(positions, x, self.cos_sin)
        return self.ln_f(x)[0]

    def compute_logits(self, hidden):
        return hidden @ self.tok.weight.t()

