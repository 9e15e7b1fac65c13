"""Fused MoE on the GPU at Qwen3-30B-A3B's shapes (hidden 2048, moe intermediate 768,
128 experts, top-8): the Triton grouped GEMMs (tuned) against the PyTorch reference,
dense and AWQ g128 (the experts repacked into kpack, as the engine runs them, and as the
checkpoint packs them), and the whole call captured in a CUDA graph and replayed with new
routing (no host synchronisation inside)."""
import pytest
import torch

from tests.gpu.conftest import slow

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

H, INTER, E, TOP_K, G = 2048, 768, 128, 8, 128
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(out, ref, dtype, what):
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    assert not torch.isnan(out).any(), f"{what}: NaN (unwritten output?)"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: rel err {err:.3g}"


@pytest.fixture(scope="module")
def gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    return g


def routing(T, gen):
    from engine.model.layers.moe import select_experts

    logits = torch.randn(T, E, device="cuda", generator=gen)
    logits[:, 17] += 3.0  # one popular expert: several BLOCK_M blocks of one expert at larger T
    return select_experts(logits, TOP_K, True)


@pytest.fixture(scope="module")
def dense(gen):
    w13 = (torch.randn(E, 2 * INTER, H, device="cuda", generator=gen) * H ** -0.5).bfloat16()
    w2 = (torch.randn(E, H, INTER, device="cuda", generator=gen) * INTER ** -0.5).bfloat16()
    return w13, w2


def _awq(K, N, gen, dtype):
    from llm_kernels import AWQExperts, pack_awq_int4

    q = torch.randint(0, 16, (E, K, N), device="cuda", generator=gen, dtype=torch.int32)
    z = torch.randint(0, 16, (E, K // G, N), device="cuda", generator=gen, dtype=torch.int32)
    s = (torch.rand(E, K // G, N, device="cuda", generator=gen) * 0.5 + 0.25) * (K ** -0.5 / 8)
    return AWQExperts(torch.stack([pack_awq_int4(t) for t in q]), torch.stack([pack_awq_int4(t) for t in z]),
                      s.to(dtype), G)


@pytest.fixture(scope="module")
def awq_ckpt(gen):
    """(w13, w2) as AWQExperts: AutoAWQ's packing."""
    return _awq(H, 2 * INTER, gen, torch.bfloat16), _awq(INTER, H, gen, torch.bfloat16)


@pytest.fixture(scope="module")
def awq(awq_ckpt):
    """The same experts repacked as the engine holds them on a GPU (KPackExperts)."""
    from llm_kernels import kpack_experts

    return tuple(kpack_experts(w) for w in awq_ckpt)


def check_bf16(fn, reference, weights, T, gen):
    """fn against its reference on T random bfloat16 tokens routed by routing()."""
    w13, w2 = weights
    x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
    tw, ti = routing(T, gen)
    out = fn(x, w13, w2, tw, ti)
    check(out, reference(x, w13, w2, tw, ti), torch.bfloat16, f"{fn.__name__} T={T}")


@pytest.mark.parametrize("T", [1, 256, slow(16), slow(1024)])
def test_fused_moe_dense_bf16(T, dense, gen):
    from llm_kernels.moe import fused_moe, fused_moe_reference

    check_bf16(fused_moe, fused_moe_reference, dense, T, gen)


@pytest.mark.parametrize("T", [1, 256, slow(16), slow(1024)])
def test_fused_moe_awq_g128_bf16(T, awq, awq_ckpt, gen):
    """kpack experts against the reference on AutoAWQ's packing (the repack included), and the
    checkpoint's packing run as it is (the widening kernel)."""
    from llm_kernels.moe import fused_moe_awq, fused_moe_awq_reference

    def on_ckpt_reference(x, w13, w2, tw, ti):
        return fused_moe_awq_reference(x, *awq_ckpt, tw, ti)

    check_bf16(fused_moe_awq, on_ckpt_reference, awq, T, gen)
    check_bf16(fused_moe_awq, fused_moe_awq_reference, awq_ckpt, T, gen)


def test_fused_moe_fp16_and_every_candidate_config(dense, gen):
    """Each candidate config of the tuner (not only the one it picks) computes the same."""
    from triton.runtime.errors import OutOfResources

    from llm_kernels.moe import fused_moe, fused_moe_reference, moe_configs

    w13, w2 = (w.half() for w in dense)
    for T, bm in ((4, 16), (512, 32), (2048, 128)):
        x = torch.randn(T, H, device="cuda", generator=gen).half()
        tw, ti = routing(T, gen)
        ref = fused_moe_reference(x, w13, w2, tw, ti)
        cfgs, too_big = moe_configs(bm, torch.float16, x.device), []
        for cfg in cfgs:
            try:
                out = fused_moe(x, w13, w2, tw, ti, config=cfg)
            except OutOfResources:  # the tuner leaves such a config out; most must fit
                too_big.append(cfg)
                continue
            check(out, ref, torch.float16, f"fused_moe T={T} {cfg}")
        assert len(too_big) <= len(cfgs) // 3, too_big


@pytest.mark.parametrize("quant", [False, True])
def test_fused_moe_replays_in_a_cuda_graph(quant, dense, awq, gen):
    """Captured once (after an eager call tuned it), replayed after the routing and the
    input were rewritten in place: the sort/pad reads nothing back to the host."""
    from llm_kernels.moe import fused_moe, fused_moe_awq, fused_moe_awq_reference, fused_moe_reference

    run, ref_fn, weights = (fused_moe_awq, fused_moe_awq_reference, awq) if quant else \
        (fused_moe, fused_moe_reference, dense)
    T = 8
    x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
    tw, ti = routing(T, gen)
    run(x, *weights, tw, ti)  # compile and tune outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(x, *weights, tw, ti)
    for _ in range(3):
        x.copy_(torch.randn(T, H, device="cuda", generator=gen).bfloat16())
        new_w, new_ids = routing(T, gen)
        tw.copy_(new_w)
        ti.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        check(out, ref_fn(x, *weights, tw, ti), torch.bfloat16, "replayed fused_moe")


def test_fused_moe_awq_every_candidate_config(awq, awq_ckpt, gen):
    """Each 4-bit candidate of the tuner computes the same: the kpack kernel's at decode and
    prefill blocks (16, 32, 64 and 128 rows), the widening kernel's on AutoAWQ's packing."""
    from triton.runtime.errors import OutOfResources

    from llm_kernels.moe import block_m_for, fused_moe_awq, fused_moe_awq_reference, layout_of, moe_configs

    blocks = set()
    for T in (4, 50, 512, 2048, 6000):
        x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
        tw, ti = routing(T, gen)
        ref = fused_moe_awq_reference(x, *awq_ckpt, tw, ti)
        bm = block_m_for(T * TOP_K, E)
        blocks.add(bm)
        for weights in (awq, awq_ckpt):
            cfgs, too_big = moe_configs(bm, torch.bfloat16, x.device, G, layout_of(weights[0])), []
            for cfg in cfgs:
                try:
                    out = fused_moe_awq(x, *weights, tw, ti, config=cfg)
                except OutOfResources:
                    too_big.append(cfg)
                    continue
                check(out, ref, torch.bfloat16, f"fused_moe_awq T={T} {cfg}")
            assert len(too_big) <= len(cfgs) // 3, too_big
    assert blocks == {16, 32, 64, 128}


@pytest.mark.parametrize("T", [1, 10, 50, 512])
def test_moe_align_in_one_launch_is_the_torch_ops_on_the_gpu(T, gen, monkeypatch):
    """The one-program sort (atomics, barriers, loads past L1) gives the torch ops' tensors exactly."""
    from llm_kernels import moe

    _, ti = routing(T, gen)
    for bm in (16, 64):
        one_launch = moe.moe_align(ti, E, bm)
        with monkeypatch.context() as m:
            m.setattr(moe, "ALIGN_PAIRS", 0)
            want = moe.moe_align(ti, E, bm)
        for got, ref in zip(one_launch, want):
            assert torch.equal(got, ref), (T, bm)


@pytest.mark.parametrize("T", [1, 50, 2048])
def test_the_router_in_one_launch_is_the_torch_ops_on_the_gpu(T, gen):
    """llm_kernels.select_experts (one Triton launch) picks what softmax + topk + renormalise
    pick on the GPU, bf16 and float32 logits, and replays in a CUDA graph with new logits."""
    from llm_kernels.moe_route import select_experts, select_experts_reference

    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(T, E, device="cuda", generator=gen) * 2).to(dtype)
        w, ids = select_experts(logits, TOP_K, True)
        rw, rids = select_experts_reference(logits, TOP_K, True)
        probs = torch.softmax(logits, -1, dtype=torch.float32)
        assert torch.equal(probs.gather(1, ids), probs.gather(1, rids))  # the same (bf16 ties: in any order)
        torch.testing.assert_close(w, rw, rtol=1e-5, atol=1e-6)
    static = logits.clone()
    select_experts(static, TOP_K, True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gw, gids = select_experts(static, TOP_K, True)
    static.copy_((torch.randn(T, E, device="cuda", generator=gen) * 2).to(static.dtype))
    graph.replay()
    rw, rids = select_experts_reference(static, TOP_K, True)
    probs = torch.softmax(static, -1, dtype=torch.float32)
    assert torch.equal(probs.gather(1, gids), probs.gather(1, rids))
