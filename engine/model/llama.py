"""The Llama family (Llama 2/3, Qwen2/2.5, Mistral without sliding window,
SmolLM2): one decoder over paged attention, dense or AWQ linears."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

import kernels
from engine.model.layers import AWQLinear, Linear, PagedAttention, RMSNorm, VocabParallelEmbedding, rope_cache
from engine.parallel.group import SINGLE, TPGroup


@dataclass(slots=True)
class ModelSpec:
    """What the model needs from a checkpoint's config (see loader.read_model_spec)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    quant_group_size: int | None  # AWQ when set
    modules_not_quantized: tuple[str, ...] = ()
    eos_token_id: object = None  # int or list, from config.json


def is_quantized(spec: ModelSpec, name: str) -> bool:
    return bool(spec.quant_group_size) and not any(m in name for m in spec.modules_not_quantized)


def make_linear(spec: ModelSpec, name: str, in_features: int, output_sizes, bias: bool, dtype, device,
                tp: TPGroup = SINGLE, split: str | None = None):
    """Sizes are the checkpoint's; under tensor parallelism the layer keeps this rank's part."""
    if is_quantized(spec, name):
        return AWQLinear(in_features, output_sizes, bias, spec.quant_group_size, dtype, device, tp, split)
    return Linear(in_features, output_sizes, bias, dtype, device, tp, split)


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
        self.qkv_proj = make_linear(
            spec, prefix + "qkv_proj", spec.hidden_size, [q, kv, kv], spec.attention_bias, dtype, device, tp, "column",
        )
        self.o_proj = make_linear(spec, prefix + "o_proj", q, [spec.hidden_size], False, dtype, device, tp, "row")
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
        self.gate_up_proj = make_linear(spec, prefix + "gate_up_proj", spec.hidden_size, [i, i], spec.mlp_bias,
                                        dtype, device, tp, "column")
        self.down_proj = make_linear(spec, prefix + "down_proj", i, [spec.hidden_size], spec.mlp_bias, dtype, device,
                                     tp, "row")

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
    PACKED = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

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

    # -- loading ---------------------------------------------------------------
    def linears(self):
        return {n: m for n, m in self.named_modules() if isinstance(m, (Linear, AWQLinear, VocabParallelEmbedding))}

    def load_weights(self, weights) -> None:
        """weights: iterable of (checkpoint name, tensor). Every parameter must be
        filled and every checkpoint tensor used; otherwise ValueError."""
        linears = self.linears()
        norms = {n: m for n, m in self.named_modules() if isinstance(m, RMSNorm)}
        seen = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            key = name[len("model."):] if name.startswith("model.") else name
            if key == "embed_tokens.weight" and self.tp.size > 1:
                self.embed_tokens.load(0, "weight", tensor)
            elif key == "embed_tokens.weight":
                self._copy(self.embed_tokens.weight, tensor, name)
            elif key == "lm_head.weight" and self.spec.tie_word_embeddings:
                continue  # tied: the embeddings serve
            elif key == "lm_head.weight":
                self.lm_head.load(0, "weight", tensor.to(self.lm_head.weight.dtype))
            elif key.rsplit(".", 1)[0] in norms and key.endswith(".weight"):
                self._copy(norms[key.rsplit(".", 1)[0]].weight, tensor, name)
            else:
                module, _, param = key.rpartition(".")
                parent, _, proj = module.rpartition(".")
                target, shard = self.PACKED.get(proj, (proj, 0))
                lin = linears.get(f"{parent}.{target}")
                if lin is None:
                    raise ValueError(f"checkpoint tensor {name} has no place in the model")
                if param != "qweight" and param != "qzeros":
                    tensor = tensor.to(self.embed_tokens.weight.dtype)
                lin.load(shard, param, tensor)
            seen.add(name)
        missing = [f"{n} {e}" for n, lin in linears.items() for e in sorted(lin.expected() - lin.loaded)]
        if "embed_tokens.weight" not in {s.removeprefix("model.") for s in seen}:
            missing.append("embed_tokens.weight")
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        for lin in linears.values():
            lin.finalize()

    @torch.no_grad()
    def init_dummy_weights(self, seed: int = 0) -> None:
        """Random weights of the real shapes, made on the model's device from a seed."""
        gen = torch.Generator(device=self.cos_sin.device).manual_seed(seed)
        for name, t in list(self.named_parameters()) + list(self.named_buffers()):
            if name == "cos_sin":
                continue
            if t.dtype == torch.int32:  # packed int4 weights and zeros
                t.copy_(torch.randint(-(2**31), 2**31 - 1, t.shape, generator=gen, device=t.device, dtype=torch.int32))
            elif name.endswith("scales"):
                t.uniform_(0.001, 0.004, generator=gen)
            elif "norm" in name:
                t.fill_(1.0)
            else:
                t.normal_(0.0, 0.02, generator=gen)
        for lin in self.linears().values():
            lin.finalize()

    @staticmethod
    def _copy(param, tensor, name):
        if param.shape != tensor.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
        param.data.copy_(tensor)
