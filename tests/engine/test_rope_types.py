"""rope_cache against transformers' own rotary embedding modules, rope type by rope
type (default, linear, llama3, yarn, longrope), partial rotary dims included."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, Phi3Config, Qwen3Config
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from engine.errors import UnsupportedModelError
from engine.model.layers.rotary import (
    ROPE_TYPES, rope_attention_factor, rope_cache, rope_inv_freq, rope_is_two_sided, rope_long_after, rope_rows,
)
from engine.model.spec import rope_from_config
from llm_kernels.rotary import rotary_embedding_reference

TOL = dict(rtol=1e-6, atol=1e-6)


def hf_cos_sin(module: torch.nn.Module, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' cos, sin ([len(positions), 2 * half], halves duplicated) for one forward."""
    with torch.no_grad():
        cos, sin = module(torch.zeros(1, dtype=torch.float32), positions[None])
    half = cos.shape[-1] // 2
    assert torch.equal(cos[0, :, :half], cos[0, :, half:]) and torch.equal(sin[0, :, :half], sin[0, :, half:])
    return cos[0], sin[0]


def theta_scaling(cfg) -> tuple[float, dict]:
    """theta and the scaling dict from a transformers 5 config's standardized rope_parameters."""
    scaling = dict(cfg.rope_parameters)
    return float(scaling.pop("rope_theta")), scaling


def rotary_dim(cfg) -> int:
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return head_dim, int(head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0))


def ours(cfg, max_positions: int, scaling: dict | None = None) -> torch.Tensor:
    theta, default_scaling = theta_scaling(cfg)
    head_dim, rot = rotary_dim(cfg)
    return rope_cache(head_dim, max_positions, theta, default_scaling if scaling is None else scaling, "cpu",
                      rotary_dim=rot, max_position_embeddings=cfg.max_position_embeddings)


def assert_rows_match(cache: torch.Tensor, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    half = cos.shape[-1] // 2
    assert cache.shape[-1] == 2 * half and cache.dtype == torch.float32
    torch.testing.assert_close(cache[rows, :half], cos[:, :half], **TOL)
    torch.testing.assert_close(cache[rows, half:], sin[:, :half], **TOL)


def llama(rope: dict, head_dim: int = 64, max_pos: int = 8192, **kw) -> LlamaConfig:
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=max_pos, rope_parameters=dict(rope), **kw)


def check_against(module_cls, cfg, max_positions: int, positions: torch.Tensor | None = None) -> torch.Tensor:
    cache = ours(cfg, max_positions)
    positions = torch.arange(max_positions) if positions is None else positions
    cos, sin = hf_cos_sin(module_cls(cfg), positions)
    assert_rows_match(cache, positions, cos, sin)
    return cache


LLAMA_ROPES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "default_1e6": dict(rope_type="default", rope_theta=1e6),
    "linear": dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
    "llama3": dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192),
}


@pytest.mark.parametrize("name", sorted(LLAMA_ROPES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_default_linear_llama3_match_transformers(name, head_dim):
    cfg = llama(LLAMA_ROPES[name], head_dim=head_dim, max_pos=131072)
    check_against(LlamaRotaryEmbedding, cfg, 4096)
    far = torch.tensor([0, 8191, 8192, 65535, 131071])
    check_against(LlamaRotaryEmbedding, cfg, 131072, far)


def test_old_call_unchanged():
    """The positional call of before (no rotary_dim) still gives the plain full-head cache."""
    inv = 1.0 / 10000.0 ** (torch.arange(0, 64, 2).float() / 64)
    freqs = torch.arange(100).float()[:, None] * inv[None, :]
    assert torch.equal(rope_cache(64, 100, 10000.0, None, "cpu"), torch.cat([freqs.cos(), freqs.sin()], dim=-1))
    assert torch.equal(rope_inv_freq(64, 10000.0, None), inv)


@pytest.mark.parametrize("rope", ["default", "linear", "llama3"])
def test_partial_rotary_plain_types(rope):
    """partial_rotary_factor: inv_freq over the rotary dims only (Phi3 for default, which Llama ignores)."""
    params = dict(LLAMA_ROPES[rope], partial_rotary_factor=0.5)
    if rope == "default":
        cfg = Phi3Config(hidden_size=512, num_attention_heads=4, max_position_embeddings=4096,
                         rope_parameters=dict(params, partial_rotary_factor=0.75))
        cache = check_against(Phi3RotaryEmbedding, cfg, 4096)
        assert cache.shape == (4096, 96)
        return
    cfg = llama(params, head_dim=128, max_pos=32768)
    cache = check_against(LlamaRotaryEmbedding, cfg, 4096)
    assert cache.shape == (4096, 64)


YARN = {
    "qwen3_4x": dict(rope_theta=1e6, factor=4.0, original_max_position_embeddings=32768),
    "attention_factor_betas": dict(rope_theta=10000.0, factor=8.0, original_max_position_embeddings=4096,
                                   attention_factor=0.8, beta_fast=16, beta_slow=2),
    "mscale_equal": dict(rope_theta=10000.0, factor=40.0, original_max_position_embeddings=4096,
                         mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1),
    "mscale_ratio": dict(rope_theta=10000.0, factor=16.0, original_max_position_embeddings=4096,
                         mscale=1.0, mscale_all_dim=0.5),
    "mscale_only": dict(rope_theta=10000.0, factor=16.0, original_max_position_embeddings=4096, mscale=1.0),
    "gpt_oss_no_truncate": dict(rope_theta=150000.0, factor=32.0, original_max_position_embeddings=4096,
                                beta_fast=32.0, beta_slow=1.0, truncate=False),
    "factor_from_lengths": dict(rope_theta=10000.0, factor=None, original_max_position_embeddings=4096),
    "factor_below_one": dict(rope_theta=10000.0, factor=1.0, original_max_position_embeddings=4096),
}


@pytest.mark.parametrize("name", sorted(YARN))
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_yarn_matches_transformers(name, partial):
    params = dict(YARN[name], rope_type="yarn")
    if partial != 1.0:
        params["partial_rotary_factor"] = partial
    max_pos = 131072 if name == "qwen3_4x" else 16384
    cfg = llama(params, head_dim=128, max_pos=max_pos)
    cache = check_against(LlamaRotaryEmbedding, cfg, 4096)
    assert cache.shape == (4096, int(128 * partial))
    check_against(LlamaRotaryEmbedding, cfg, max_pos, torch.tensor([0, 4095, 4096, max_pos // 2, max_pos - 1]))
    hf_scale = LlamaRotaryEmbedding(cfg).attention_scaling
    theta, scaling = theta_scaling(cfg)
    assert rope_attention_factor(scaling, max_position_embeddings=max_pos) == pytest.approx(hf_scale, rel=1e-12)


def test_yarn_on_qwen3_module_and_original_length_default():
    """Qwen3's own module; and with no original length the config's max stands in (as transformers sets it)."""
    cfg = Qwen3Config(hidden_size=256, num_attention_heads=4, head_dim=64, max_position_embeddings=8192,
                      rope_parameters=dict(rope_type="yarn", rope_theta=1e6, factor=4.0))
    assert cfg.rope_parameters["original_max_position_embeddings"] == 8192
    theta, scaling = theta_scaling(cfg)
    scaling.pop("original_max_position_embeddings")
    cache = ours(cfg, 2048, scaling)
    positions = torch.arange(2048)
    cos, sin = hf_cos_sin(Qwen3RotaryEmbedding(cfg), positions)
    assert_rows_match(cache, positions, cos, sin)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        rope_cache(64, 16, theta, scaling, "cpu")


def phi3(head_dim: int, heads: int, partial: float, orig: int, max_pos: int, seed: int = 0, **rope) -> Phi3Config:
    """A Phi-3-like longrope config with seeded factors (short near 1, long up to ~60)."""
    g = torch.Generator().manual_seed(seed)
    n = int(head_dim * partial) // 2
    short = (1.0 + 0.1 * torch.rand(n, generator=g)).tolist()
    long = (1.0 + 60.0 * torch.rand(n, generator=g)).sort().values.tolist()
    params = dict(rope_type="longrope", rope_theta=10000.0, short_factor=short, long_factor=long,
                  partial_rotary_factor=partial, **rope)
    return Phi3Config(hidden_size=head_dim * heads, num_attention_heads=heads, max_position_embeddings=max_pos,
                      original_max_position_embeddings=orig, rope_parameters=params)


LONGROPE = {
    "phi3_mini_128k": dict(head_dim=96, heads=32, partial=1.0, orig=4096, max_pos=131072),
    "phi4_mini": dict(head_dim=128, heads=24, partial=0.75, orig=4096, max_pos=131072),
    "explicit_attention_factor": dict(head_dim=64, heads=4, partial=1.0, orig=4096, max_pos=65536,
                                      attention_factor=1.25),
    "explicit_factor": dict(head_dim=64, heads=4, partial=0.5, orig=4096, max_pos=65536, factor=8.0),
}


@pytest.mark.parametrize("name", sorted(LONGROPE))
def test_longrope_short_and_long_rows_match_transformers(name):
    cfg = phi3(**LONGROPE[name])
    orig, M = cfg.original_max_position_embeddings, 8192
    cache = ours(cfg, M)
    _, rot = rotary_dim(cfg)
    assert rope_is_two_sided(cfg.rope_parameters) and cache.shape == (2 * M, rot)
    module = Phi3RotaryEmbedding(cfg)
    short = torch.arange(orig)  # sequence length == original: short factor
    cos, sin = hf_cos_sin(module, short)
    assert_rows_match(cache, rope_rows(short, torch.zeros_like(short, dtype=torch.bool), cfg.rope_parameters, M),
                      cos, sin)
    long = torch.arange(M)  # sequence length > original: long factor, for the early tokens too
    cos, sin = hf_cos_sin(module, long)
    assert_rows_match(cache, rope_rows(long, torch.ones_like(long, dtype=torch.bool), cfg.rope_parameters, M),
                      cos, sin)
    assert not torch.allclose(cache[:orig], cache[M:M + orig])
    theta, scaling = theta_scaling(cfg)
    assert rope_attention_factor(scaling, max_position_embeddings=cfg.max_position_embeddings) == pytest.approx(
        module.attention_scaling, rel=1e-12)


def test_longrope_generate_short_prompt_crossing_original():
    """A prefill within the original length, then decode past it, forward by forward as
    transformers runs generate: each forward long iff its max position + 1 > original."""
    cfg = phi3(head_dim=32, heads=2, partial=0.75, orig=64, max_pos=256, seed=3)
    M = 128
    cache = ours(cfg, M)
    limit = rope_long_after(cfg.rope_parameters, max_position_embeddings=cfg.max_position_embeddings)
    assert limit == 64
    module = Phi3RotaryEmbedding(cfg)
    forwards = [torch.arange(50)] + [torch.tensor([p]) for p in range(50, 100)]
    for positions in forwards:
        cos, sin = hf_cos_sin(module, positions)
        long_mask = torch.full_like(positions, int(positions.max()) + 1 > limit, dtype=torch.bool)
        assert_rows_match(cache, rope_rows(positions, long_mask, cfg.rope_parameters, M), cos, sin)


def test_longrope_through_spec_and_partial_kernel():
    """rope_from_config passes longrope through; rotating the first 96 of 128 dims with our
    rows equals transformers' apply_rotary_pos_emb on Phi-4-mini-like heads."""
    cfg = phi3(head_dim=128, heads=24, partial=0.75, orig=4096, max_pos=131072, seed=1)
    theta, scaling = rope_from_config(cfg)
    M = 6000
    cache = rope_cache(128, M, theta, scaling, "cpu", rotary_dim=96, max_position_embeddings=131072)
    g = torch.Generator().manual_seed(0)
    T = 40
    positions = torch.sort(torch.randint(0, M, (T,), generator=g)).values
    q, k = torch.randn(T, 3, 128, generator=g), torch.randn(T, 2, 128, generator=g)
    cos, sin = hf_cos_sin(Phi3RotaryEmbedding(cfg), positions)  # max position >= 4096: long
    q_hf, k_hf = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    rows = rope_rows(positions, torch.ones(T, dtype=torch.bool), scaling, M)
    # the reference rotates all it is given, so hand it the rotary dims (the Triton kernel slices itself)
    rotary_embedding_reference(rows, q[..., :96], k[..., :96], cache)
    torch.testing.assert_close(q, q_hf[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k, k_hf[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_rope_rows_one_sided_types_ignore_mask():
    positions = torch.tensor([0, 5, 9])
    mask = torch.tensor([True, False, True])
    for scaling in (None, dict(rope_type="linear", factor=2.0), dict(YARN["qwen3_4x"], rope_type="yarn")):
        assert not rope_is_two_sided(scaling) and rope_long_after(scaling) is None
        assert rope_rows(positions, mask, scaling, 16) is positions
    lr = dict(rope_type="longrope", short_factor=[1.0], long_factor=[2.0], original_max_position_embeddings=8)
    assert torch.equal(rope_rows(positions, mask, lr, 16), torch.tensor([16, 5, 25]))
    assert rope_rows(positions, None, lr, 16) is positions


def test_rope_types_and_refusals():
    assert set(ROPE_TYPES) == {"default", "linear", "llama3", "yarn", "longrope"}
    theta, scaling = rope_from_config(llama(dict(YARN["qwen3_4x"], rope_type="yarn"), max_pos=131072))
    assert theta == 1e6 and scaling["rope_type"] == "yarn"
    dynamic = llama(dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))
    with pytest.raises(UnsupportedModelError, match="'dynamic'"):
        rope_from_config(dynamic)
    with pytest.raises(ValueError, match="'dynamic'"):
        rope_cache(64, 8, 10000.0, dict(rope_type="dynamic", factor=2.0), "cpu")
    with pytest.raises(ValueError, match="rotary_dim"):
        rope_cache(64, 8, 10000.0, None, "cpu", rotary_dim=96)
    bad = dict(rope_type="longrope", short_factor=[1.0] * 3, long_factor=[1.0] * 3,
               original_max_position_embeddings=8, factor=2.0)
    with pytest.raises(ValueError, match="longrope factors"):
        rope_cache(64, 8, 10000.0, bad, "cpu")
