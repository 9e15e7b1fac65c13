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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,head_dim", [((4, 4), 64), ((8, 2), 128), ((7, 1), 128)])
def test_head_norms_in_the_rotary_launch(dtype, heads, head_dim, rng):
    """q_norm / k_norm weights (Qwen3, Gemma 3): each head RMS-normalised over head_dim, then
    turned, in place on qkv's views; the same as the reference (norm, then rotary) and as the
    two launches it replaces (llm_kernels.rms_norm, then the rotary), v untouched."""
    from llm_kernels.norm import rms_norm

    hq, hk = heads
    T, eps = 9, 1e-6
    qkv = (torch.randn(T, (hq + 2 * hk) * head_dim, generator=rng) * 3).to(dtype)
    q = qkv[:, : hq * head_dim].view(T, hq, head_dim)
    k = qkv[:, hq * head_dim : (hq + hk) * head_dim].view(T, hk, head_dim)
    v_before = qkv[:, (hq + hk) * head_dim :].clone()
    qw, kw = ((torch.rand(head_dim, generator=rng) + 0.5).to(dtype) for _ in range(2))
    cache = _cache(64, head_dim)
    pos = torch.randint(0, 64, (T,), generator=rng)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_reference(pos, q_ref, k_ref, cache, qw, kw, eps)
    q_two, k_two = rotary_embedding(pos, rms_norm(q, qw, eps), rms_norm(k, kw, eps), cache)
    rotary_embedding(pos, q, k, cache, qw, kw, eps)
    for got, ref, two, what in ((q, q_ref, q_two, "q"), (k, k_ref, k_two, "k")):
        assert_close(got, ref, dtype, rng.initial_seed(), f"{what} against the reference")
        # a sum in another order may move a rounding by one unit: at most a few of the head's largest
        units = (got.float() - two.float()).abs() / (torch.finfo(dtype).eps * two.float().abs().amax(-1, True))
        assert units.max() <= 4, f"{what}: {units.max():.1f} units off the two launches"
    assert torch.equal(qkv[:, (hq + hk) * head_dim :], v_before), "v part of qkv was touched"


def test_head_norms_with_a_partial_rotary_normalise_first(rng):
    """rot < head_dim: the whole head is normalised (its own launch), then the first rot dims turn."""
    T, D, rot = 5, 128, 64
    q, k = torch.randn(T, 4, D, generator=rng), torch.randn(T, 2, D, generator=rng)
    qw, kw = torch.rand(D, generator=rng) + 0.5, torch.rand(D, generator=rng) + 0.5
    cache = _cache(32, rot)
    pos = torch.randint(0, 32, (T,), generator=rng)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding_reference(pos, q_ref, k_ref, cache, qw, kw)
    rotary_embedding(pos, q, k, cache, qw, kw)
    assert_close(q, q_ref, torch.float32, rng.initial_seed(), "q partial, normed")
    assert_close(k, k_ref, torch.float32, rng.initial_seed(), "k partial, normed")


def test_one_head_norm_weight_without_the_other_is_refused(rng):
    q, k = torch.randn(2, 4, 64, generator=rng), torch.randn(2, 2, 64, generator=rng)
    with pytest.raises(ValueError, match="q_weight and k_weight"):
        rotary_embedding(torch.zeros(2, dtype=torch.long), q, k, _cache(8, 64), q_weight=torch.ones(64))


@pytest.mark.parametrize("norm", [False, True])
def test_the_kernel_compiles_for_hopper(norm):
    """The rotary kernel, with the head norms and without, compiles for sm_90 here (no GPU:
    Triton's compiler and its ptxas), at Qwen3's 32 + 4 heads of 128 dims."""
    from tests.kernels.fresh_process import run_fresh

    run_fresh(__name__, "check_compile", norm)


def check_compile(norm: bool) -> None:
    pytest.importorskip("triton")
    from llm_kernels import rotary
    from tests.kernels.kernel_checks import compile_for

    fn = rotary._rotary_kernel.built(False)
    sig = {n: "i32" for n in fn.arg_names}
    sig.update({"pos_ptr": "*i64", "q_ptr": "*bf16", "k_ptr": "*bf16", "cache_ptr": "*fp32", "qw_ptr": "*bf16",
                "kw_ptr": "*bf16", "eps": "fp32"})
    k = compile_for(fn, sig, dict(BLOCK_HQ=32, BLOCK_HK=4, BLOCK_HALF=64, NORM=norm), 90, {"num_warps": 4})
    assert "st.global" in k.asm["ptx"]
