"""W4A16 on the GPU (llm_kernels.w4a16) at real shapes against the float32 reference: every
candidate config the tuner may pick in each layout, the tuned public call, the layout and
kernel the selection list gives, split tiles summed in a fixed order and replayed from CUDA
graphs. Qwen2.5-7B's layers run the K-packed layout, SmolLM2-135M's (K = 576) the checkpoint's."""
import pytest
import torch

from llm_kernels import dispatch
from llm_kernels.w4a16 import awq_gemm_reference, ckpt, kpack, linear, pack_awq_int4, prepare
from llm_kernels.w4a16.configs import DENSE, ckpt_config, ckpt_configs, kpack_configs, shape_key
from llm_kernels.w4a16.select import CHECKPOINT, KPACK, candidates
from llm_kernels.w4a16.weight import TUNED
from tests.gpu.conftest import cases, check, slow

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.usefixtures("poison_cuda_alloc")]

def layer(K, N, G, dtype, gen):
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen)
    z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen)
    s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(dtype)
    return pack_awq_int4(q), pack_awq_int4(z), s


def x_of(M, K, dtype, gen):
    return torch.randn(M, K, device="cuda", generator=gen).to(dtype)


@pytest.mark.parametrize("K,N", [(3584, 4608), (18944, 3584), slow(3584, 37888)])
@pytest.mark.parametrize("M", [1, 16, 64, 200, slow(3), slow(10), slow(50), slow(480)])
def test_kpack_every_config_and_the_tuned_call(K, N, M, gen):
    dtype = torch.bfloat16
    qw, qz, s = layer(K, N, 128, dtype, gen)
    w = prepare(qw, qz, s, 128)
    assert w.layout == KPACK and w.qweight is None  # on CUDA these layers hold only the K-packed words
    x = x_of(M, K, dtype, gen)
    ref = awq_gemm_reference(x, qw, qz, s, 128)
    for cfg in kpack_configs(M, dtype, x.device):
        check(kpack.launch(x, w.qk, w.zeros_k, s, 128, cfg), ref, dtype, f"kpack {cfg}")
    check(linear(x, w), ref, dtype, "linear")
    picked = dispatch.chosen(TUNED[KPACK], shape_key(M, N, K, 128, dtype))
    assert picked is DENSE or picked in kpack_configs(M, dtype, x.device), picked
    assert picked is not DENSE or "dequant_matmul" in candidates("cuda", dtype, M, KPACK)


@pytest.mark.parametrize("M", [1, 16, 64, 200])
def test_kpack_bias_in_every_config_and_the_tuned_call(M, gen):
    """Qwen2.5-7B's qkv with its bias: each kpack config adds it once at the store (the split
    tiles' last arrival too), the dequantized path through addmm, the tuned call likewise."""
    K, N, dtype = 3584, 4608, torch.bfloat16
    qw, qz, s = layer(K, N, 128, dtype, gen)
    w = prepare(qw, qz, s, 128)
    x = x_of(M, K, dtype, gen)
    bias = torch.randn(N, device="cuda", generator=gen).to(dtype)
    ref = awq_gemm_reference(x, qw, qz, s, 128) + bias.float()
    for cfg in kpack_configs(M, dtype, x.device):
        check(kpack.launch(x, w.qk, w.zeros_k, s, 128, cfg, bias=bias), ref, dtype, f"kpack bias {cfg}")
    check(linear(x, w, bias), ref, dtype, "linear with bias")


@pytest.mark.parametrize("K,N", [(576, 960), (576, 3072), slow(3584, 4608)])
@pytest.mark.parametrize("M", [1, 16, 64, slow(5), slow(200)])
def test_checkpoint_layout_every_config_and_the_tuned_call(K, N, M, gen):
    """Its kernels' configs up to 16 tokens; above, the tuned call runs the dequantized weight."""
    G = 64 if K == 576 else 128
    dtype = torch.bfloat16
    qw, qz, s = layer(K, N, G, dtype, gen)
    w = prepare(qw, qz, s, G)
    assert w.layout == (CHECKPOINT if K % 128 else KPACK)
    x = x_of(M, K, dtype, gen)
    ref = awq_gemm_reference(x, qw, qz, s, G)
    for cfg in ckpt_configs(M, dtype, x.device) if M <= 16 else []:
        if ckpt.fits(M, N, K, G, cfg, x.device):
            check(ckpt.launch(x, qw, qz, s, G, cfg), ref, dtype, f"checkpoint {cfg}")
    check(linear(x, prepare(qw, qz, s, G, CHECKPOINT)), ref, dtype, "linear")


@pytest.mark.parametrize("layout,dtype,M", cases(
    [(KPACK, torch.float32, 8), (CHECKPOINT, torch.float32, 100), (CHECKPOINT, torch.float16, 4),
     (KPACK, torch.float16, 48)],
    [(la, d, m) for la in (KPACK, CHECKPOINT)
     for d, m in ((torch.float32, 8), (torch.float32, 100), (torch.float16, 4), (torch.float16, 48))]))
def test_float32_and_float16(layout, dtype, M, gen):
    qw, qz, s = layer(3584, 512, 128, dtype, gen)
    x = x_of(M, 3584, dtype, gen)
    ref = awq_gemm_reference(x, qw, qz, s, 128)
    check(linear(x, prepare(qw, qz, s, 128, layout)), ref, dtype, f"{layout} {dtype}")


@pytest.mark.parametrize("layout,G", [(KPACK, 32), (KPACK, 64), (CHECKPOINT, 32), (CHECKPOINT, 64),
                                      (CHECKPOINT, 256)])
def test_group_sizes(layout, G, gen):
    qw, qz, s = layer(2048, 1024, G, torch.bfloat16, gen)
    x = x_of(7, 2048, torch.bfloat16, gen)
    ref = awq_gemm_reference(x, qw, qz, s, G)
    w = prepare(qw, qz, s, G, layout)
    cands = kpack_configs(7, torch.bfloat16, x.device) if layout == KPACK else ckpt_configs(7, torch.bfloat16, x.device)
    for cfg in cands[:3]:
        if layout == KPACK:
            out = kpack.launch(x, w.qk, w.zeros_k, s, G, cfg)
        else:
            out = ckpt.launch(x, qw, qz, s, G, cfg)
        check(out, ref, torch.bfloat16, f"{layout} G={G} {cfg}")


@pytest.mark.parametrize("layout", [KPACK, CHECKPOINT])
def test_split_tiles_sum_in_a_fixed_order_and_replay_in_a_graph(layout, gen):
    """Split-K / stream-K partials are summed in a fixed order (the same bits every call) and the
    arrival counters reset, so graph replays with new inputs stay right."""
    K, N, M = 18944, 3584, 4
    qw, qz, s = layer(K, N, 128, torch.bfloat16, gen)
    w = prepare(qw, qz, s, 128, layout)
    x = x_of(M, K, torch.bfloat16, gen)
    if layout == KPACK:
        split = {"kind": "fused", "BM": 16, "BN": 64, "stages": 3, "grid": 300}  # runs end inside tiles
        forced = lambda: kpack.launch(x, w.qk, w.zeros_k, s, 128, split)  # noqa: E731
    else:
        split = ckpt_config(16, 32, 2, split=37, pf=True)
        forced = lambda: ckpt.launch(x, qw, qz, s, 128, split)  # noqa: E731
    assert torch.equal(forced(), forced())
    linear(x, w)  # tune outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = linear(x, w)
        out2 = forced()
    for _ in range(3):
        x.copy_(x_of(M, K, torch.bfloat16, gen))
        graph.replay()
        ref = awq_gemm_reference(x, qw, qz, s, 128)
        check(out, ref, torch.bfloat16, f"{layout} tuned, in a graph")
        check(out2, ref, torch.bfloat16, f"{layout} split, in a graph")


def test_linear_keeps_leading_dims_and_takes_every_size(gen):
    qw, qz, s = layer(3584, 4608, 128, torch.bfloat16, gen)
    w = prepare(qw, qz, s, 128)
    for M in (1, 16, 600):
        x = torch.randn(2, M, 3584, device="cuda", generator=gen).to(torch.bfloat16)
        ref = awq_gemm_reference(x.view(-1, 3584), qw, qz, s, 128).view(2, M, 4608)
        check(linear(x, w), ref, torch.bfloat16, f"linear M={2 * M}")
