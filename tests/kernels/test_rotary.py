"""Rotary embedding (neox): Triton (interpreted) rotates q/k in place, views included."""
import pytest
import torch
from tests.kernels.kernel_checks import assert_close

from llm_kernels.rotary import rotary_embedding, rotary_embedding_reference


def _cache(max_pos, dim, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, dim, 2).float() / dim)
    freqs = torch.arange(max_pos).float()[:, None] * inv[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 4), (7, 1), (8, 2)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_in_place_on_qkv_views(dtype, heads, head_dim, rng):
    hq, hk = heads
    T = 11
    qkv = torch.randn(T, (hq + 2 * hk) * head_dim, generator=rng).to(dtype)
    q = qkv[:, : hq * head_dim].view(T, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(T, hk, head_dim)
    v_before = qkv[:, (hq + hk) * head_dim :].clone()
    q_ref, k_ref = q.clone(), k.clone()
    cache = _cache(64, head_dim)
    pos = torch.randint(0, 64, (T,), generator=rng)
    rotary_embedding_reference(pos, q_ref, k_ref, cache)
    q_out, k_out = rotary_embedding(pos, q, k, cache)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    assert_close(q, q_ref, dtype, rng.initial_seed(), "q")
    assert_close(k, k_ref, dtype, rng.initial_seed(), "k")
    assert torch.equal(qkv[:, (hq + hk) * head_dim :], v_before), "v part of qkv was touched"


def test_rotary_non_unit_last_stride_still_in_place(rng):
    base = torch.randn(5, 4, 128, generator=rng)
    q = base[..., ::2]  # stride 2 along D
    k = torch.randn(5, 2, 64, generator=rng)
    q_ref, k_ref = q.clone(), k.clone()
    cache = _cache(32, 64)
    pos = torch.randint(0, 32, (5,), generator=rng)
    rotary_embedding_reference(pos, q_ref, k_ref, cache)
    rotary_embedding(pos, q, k, cache)
    assert_close(q, q_ref, torch.float32, rng.initial_seed(), "q strided")
    assert_close(base[..., ::2], q_ref, torch.float32, rng.initial_seed(), "q written back")


@pytest.mark.parametrize("rot", [48, 96])
def test_partial_rotary_leaves_the_other_dims(rot, rng):
    """partial_rotary_factor: only the first rot dims turn (pairs (i, i + rot/2)), as in
    transformers' apply_rotary_pos_emb on q[..., :rot]; Triton and the reference agree."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    T, D = 7, 128
    q, k = torch.randn(T, 4, D, generator=rng), torch.randn(T, 2, D, generator=rng)
    cache = _cache(32, rot)
    pos = torch.randint(0, 32, (T,), generator=rng)
    cos, sin = cache[pos].chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1)[None], torch.cat([sin, sin], -1)[None]
    hf_q, hf_k = apply_rotary_pos_emb(q[..., :rot].transpose(0, 1)[None], k[..., :rot].transpose(0, 1)[None], cos, sin)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_reference(pos, q_ref, k_ref, cache)
    torch.testing.assert_close(q_ref[..., :rot], hf_q[0].transpose(0, 1))
    torch.testing.assert_close(k_ref[..., :rot], hf_k[0].transpose(0, 1))
    assert torch.equal(q_ref[..., rot:], q[..., rot:]) and torch.equal(k_ref[..., rot:], k[..., rot:])
    rotary_embedding(pos, q, k, cache)
    assert_close(q, q_ref, torch.float32, rng.initial_seed(), "q partial")
    assert_close(k, k_ref, torch.float32, rng.initial_seed(), "k partial")
