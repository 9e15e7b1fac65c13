"""Triton kernels on the GPU at Qwen2.5-7B shapes (hidden 3584, 28 q heads,
4 kv heads, head dim 128) against the PyTorch reference in float32."""
import pytest
import torch

from tests.gpu.conftest import TOL, cases, check, rel_err, slow

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.usefixtures("poison_cuda_alloc")]

HQ, HKV, D, HIDDEN, INTER = 28, 4, 128, 3584, 18944
def _rand(shape, dtype, gen, scale=1.0):
    return (torch.randn(shape, device="cuda", generator=gen) * scale).to(dtype)


def _paged(batch, max_blocks, block_size, dtype, gen):
    nb = batch * max_blocks + 5
    k = _rand((nb, block_size, HKV, D), dtype, gen)
    v = _rand((nb, block_size, HKV, D), dtype, gen)
    tables = torch.randperm(nb, device="cuda", generator=gen)[: batch * max_blocks]
    return k, v, tables.view(batch, max_blocks).int().contiguous()


@pytest.mark.parametrize("dtype,batch,max_ctx", cases(
    [(torch.float32, 3, 300), (torch.bfloat16, 8, 2048), (torch.float16, 2, 8192)],
    [(d, b, c) for d in (torch.float32, torch.bfloat16, torch.float16) for b, c in ((3, 300), (8, 2048), (2, 8192))]))
def test_decode_attention_real_shapes(dtype, batch, max_ctx, gen):
    from llm_kernels.attention import paged_decode_attention, paged_decode_attention_reference

    bs = 16
    k, v, bt = _paged(batch, max_ctx // bs + 1, bs, dtype, gen)
    lens = torch.randint(1, max_ctx + 1, (batch,), device="cuda", generator=gen).int()
    q = _rand((batch, HQ, D), dtype, gen)
    out = paged_decode_attention(q, k, v, bt, lens, D**-0.5)
    ref = paged_decode_attention_reference(q.float(), k.float(), v.float(), bt, lens, D**-0.5)
    check(out, ref, dtype, "decode")


@pytest.mark.parametrize("hq,hkv,d", [slow(14, 2, 64), (28, 4, 128)])
def test_decode_attention_every_config(hq, hkv, d, gen):
    """Each candidate of the decode autotuner (the engine may run any of them),
    at a graph-sized table (256 blocks) with ragged lengths, in bf16."""
    from llm_kernels import attention as att

    batch, bs, width = 8, 16, 256
    nb = batch * width + 5
    k = _rand((nb, bs, hkv, d), torch.bfloat16, gen)
    v = _rand((nb, bs, hkv, d), torch.bfloat16, gen)
    bt = torch.randperm(nb, device="cuda", generator=gen)[: batch * width].view(batch, width).int().contiguous()
    lens = torch.randint(1, 700, (batch,), device="cuda", generator=gen).int()
    q = _rand((batch, hq, d), torch.bfloat16, gen)
    ref = att.paged_decode_attention_reference(q.float(), k.float(), v.float(), bt, lens, d**-0.5)
    errs = {}
    for cfg in att.DECODE_CONFIGS:
        out = att.decode_triton(q, k, v, bt, lens, d**-0.5, config=cfg)
        errs[cfg] = rel_err(out, ref)
    print("decode rel err by config:", {str(c): round(e, 5) for c, e in errs.items()})
    bad = {c: e for c, e in errs.items() if not e < TOL[torch.bfloat16]}
    assert not bad, bad


def test_decode_attention_in_cuda_graph_with_new_lengths(gen):
    from llm_kernels.attention import paged_decode_attention, paged_decode_attention_reference

    batch, bs, max_blocks = 8, 16, 64
    k, v, bt = _paged(batch, max_blocks, bs, torch.bfloat16, gen)
    q = _rand((batch, HQ, D), torch.bfloat16, gen)
    lens = torch.full((batch,), 100, dtype=torch.int32, device="cuda")
    paged_decode_attention(q, k, v, bt, lens, 0.088)  # warm up / compile outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode_attention(q, k, v, bt, lens, 0.088)
    for _ in range(3):
        lens.copy_(torch.randint(1, max_blocks * bs + 1, (batch,), device="cuda", generator=gen))
        q.copy_(_rand((batch, HQ, D), torch.bfloat16, gen))
        graph.replay()
        ref = paged_decode_attention_reference(q.float(), k.float(), v.float(), bt, lens, 0.088)
        check(out, ref, torch.bfloat16, "decode in graph")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_attention_real_shapes(dtype, gen):
    from llm_kernels.attention import paged_prefill_attention, paged_prefill_attention_reference

    seqs = [(700, 0), (129, 512), (1, 1000), (333, 64)]  # (new, cached prefix)
    bs = 16
    lens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32, device="cuda")
    k, v, bt = _paged(len(seqs), int(lens.max()) // bs + 1, bs, dtype, gen)
    n_new = torch.tensor([n for n, _ in seqs], device="cuda")
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32, device="cuda")
    qsl[1:] = n_new.cumsum(0)
    q = _rand((int(n_new.sum()), HQ, D), dtype, gen)
    out = paged_prefill_attention(q, k, v, bt, qsl, lens, D**-0.5)
    ref = paged_prefill_attention_reference(q.float(), k.float(), v.float(), bt, qsl, lens, D**-0.5)
    check(out, ref, dtype, "prefill")


@pytest.mark.parametrize("dtype,window,softcap", cases(
    [(torch.bfloat16, 4096, 50.0), (torch.float32, 37, None)],
    [(d, w, c) for d in (torch.float32, torch.bfloat16)
     for w, c in ((1024, None), (4096, 50.0), (37, None), (512, 2.0))]))
def test_sliding_window_and_softcap_decode_and_prefill(dtype, window, softcap, gen):
    """Gemma / Mistral windows and Gemma 2 soft-capping at real shapes, decode (in a CUDA
    graph too, every config) and prefill with cached prefixes longer than the window."""
    from llm_kernels import attention as att

    bs, batch = 16, 6
    k, v, bt = _paged(batch, 8192 // bs + 1, bs, dtype, gen)
    lens = torch.tensor([1, 37, 1025, 4000, 8192, 5000], dtype=torch.int32, device="cuda")
    q = _rand((batch, HQ, D), dtype, gen)
    kw = dict(sliding_window=window, softcap=softcap)
    ref = att.paged_decode_attention_reference(q.float(), k.float(), v.float(), bt, lens, D**-0.5, **kw)
    check(att.paged_decode_attention(q, k, v, bt, lens, D**-0.5, **kw), ref, dtype, f"decode w={window}")
    for cfg in att.DECODE_CONFIGS[:: 6 if dtype == torch.float32 else 1]:
        check(att.decode_triton(q, k, v, bt, lens, D**-0.5, cfg, **kw), ref, dtype, f"decode {cfg}")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = att.paged_decode_attention(q, k, v, bt, lens, D**-0.5, **kw)
    lens.copy_(torch.tensor([8000, 2, 300, 1024, 1023, 7777], dtype=torch.int32))
    graph.replay()
    ref = att.paged_decode_attention_reference(q.float(), k.float(), v.float(), bt, lens, D**-0.5, **kw)
    check(out, ref, dtype, f"decode in graph w={window}")
    seqs = [(700, 0), (129, 5000), (1, 1000), (333, 64), (2048, 2048), (16, 100)]  # (new, cached prefix)
    plens = torch.tensor([n + p for n, p in seqs], dtype=torch.int32, device="cuda")
    n_new = torch.tensor([n for n, _ in seqs], device="cuda")
    qsl = torch.zeros(len(seqs) + 1, dtype=torch.int32, device="cuda")
    qsl[1:] = n_new.cumsum(0)
    qp = _rand((int(n_new.sum()), HQ, D), dtype, gen)
    out = att.paged_prefill_attention(qp, k, v, bt, qsl, plens, D**-0.5, **kw)
    ref = att.paged_prefill_attention_reference(qp.float(), k.float(), v.float(), bt, qsl, plens, D**-0.5, **kw)
    check(out, ref, dtype, f"prefill w={window}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_rotary_silu_kv_write_real_shapes(dtype, gen):
    from llm_kernels import activation, kv_cache, norm, rotary

    T = 257
    x, res, w = _rand((T, HIDDEN), dtype, gen), _rand((T, HIDDEN), dtype, gen), _rand((HIDDEN,), dtype, gen)
    check(norm.rms_norm(x, w, 1e-6), norm.rms_norm_reference(x.float(), w.float(), 1e-6), dtype, "rms")
    res_ref = res.float() + x.float()
    out, _ = norm.fused_add_rms_norm(x, res, w, 1e-6)
    check(res, res_ref, dtype, "residual")
    check(out, norm.rms_norm_reference(res_ref, w.float(), 1e-6), dtype, "fused")

    g = _rand((T, 2 * INTER), dtype, gen)
    check(activation.silu_and_mul(g), activation.silu_and_mul_reference(g.float()), dtype, "silu")

    qkv = _rand((T, (HQ + 2 * HKV) * D), dtype, gen)
    q, k = qkv[:, : HQ * D].view(T, HQ, D), qkv[:, HQ * D : (HQ + HKV) * D].view(T, HKV, D)
    qr, kr = q.float().clone(), k.float().clone()
    inv = 1.0 / 1e6 ** (torch.arange(0, D, 2, device="cuda").float() / D)
    f = torch.arange(4096, device="cuda").float()[:, None] * inv
    cache = torch.cat([f.cos(), f.sin()], -1)
    pos = torch.randint(0, 4096, (T,), device="cuda", generator=gen)
    rotary.rotary_embedding_reference(pos, qr, kr, cache)
    rotary.rotary_embedding(pos, q, k, cache)
    check(q, qr, dtype, "rope q")
    check(k, kr, dtype, "rope k")
    qw, kw = _rand((D,), dtype, gen), _rand((D,), dtype, gen)  # Qwen3's head norms, in the rotary's launch
    qr, kr = q.float().clone(), k.float().clone()
    rotary.rotary_embedding_reference(pos, qr, kr, cache, qw.float(), kw.float(), 1e-6)
    rotary.rotary_embedding(pos, q, k, cache, qw, kw, 1e-6)
    check(q, qr, dtype, "normed rope q")
    check(k, kr, dtype, "normed rope k")

    kc = torch.full((40, 16, HKV, D), float("nan"), dtype=dtype, device="cuda")
    vc, kc_ref, vc_ref = kc.clone(), kc.clone(), kc.clone()
    key, val = _rand((T, HKV, D), dtype, gen), _rand((T, HKV, D), dtype, gen)
    slots = torch.randperm(40 * 16, device="cuda", generator=gen)[:T]
    slots[::7] = -1
    kv_cache.write_kv_cache_reference(key, val, kc_ref, vc_ref, slots)
    kv_cache.write_kv_cache(key, val, kc, vc, slots)
    assert torch.equal(kc.nan_to_num(0), kc_ref.nan_to_num(0)) and torch.equal(kc.isnan(), kc_ref.isnan())
    assert torch.equal(vc.nan_to_num(0), vc_ref.nan_to_num(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_summary_real_vocab_and_in_cuda_graph(dtype, gen):
    """The fused argmax / log-sum-exp / finite pass at Qwen2.5's vocabulary: the reference's
    tokens (ties to the first index), lse, flags; then replayed in a CUDA graph on new logits."""
    from llm_kernels import sampling

    V = 152064
    logits = _rand((50, V), dtype, gen, scale=4.0)
    logits[3, 100] = logits[3, 151000] = logits[3].max() + 1  # a tie across chunks: the first wins
    logits[7, 5] = float("nan")
    logits[8, 9] = float("inf")
    got, want = sampling.logits_summary(logits), sampling.logits_summary_reference(logits)
    ok = torch.tensor([r not in (7, 8) for r in range(50)], device="cuda")
    assert torch.equal(got[0][ok], want[0][ok]) and int(got[0][3]) == 100
    assert torch.equal(got[1][:, 2], want[1][:, 2]) and got[1][7, 2] == 0 and got[1][8, 2] == 0
    torch.testing.assert_close(got[2][ok], want[2][ok], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1][ok, 1], want[1][ok, 1], rtol=1e-5, atol=1e-5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampling.logits_summary(logits)
    for _ in range(2):
        logits.copy_(_rand((50, V), dtype, gen, scale=4.0))
        graph.replay()
        want = sampling.logits_summary_reference(logits)
        assert torch.equal(out[0], want[0])
        torch.testing.assert_close(out[2], want[2], rtol=1e-5, atol=1e-5)
