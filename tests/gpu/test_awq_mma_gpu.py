"""llm_kernels.awq_mma on CUDA: the CUDA C++ kernel (NVRTC) equals x @ dequant(w) at
Qwen2.5-7B's layer shapes for every config and M up to 64, groups 128 and 64, and so does
llm_kernels.awq_tile's for every config at 17-256 tokens (the same bits launch after launch,
and from a graph); awq_linear
with the mma layout kept (LLM_KERNELS_AWQ_MMA) agrees with the reference across the cut-over
and replays from a CUDA graph, and so does a layer held in that layout alone ("small"); an
AWQ engine whose decode GEMMs run the kernel generates what the kpack engine does."""
import pytest
import torch

from llm_kernels import awq_configs, awq_mma, awq_tile
from llm_kernels.dispatch import next_pow2, sm_count
from llm_kernels.awq import awq_linear, awq_prepare, pack_awq_int4

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _layer(K, N, G, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(0, 16, (K, N), device="cuda", generator=gen, dtype=torch.int32)
    z = torch.randint(0, 16, (K // G, N), device="cuda", generator=gen, dtype=torch.int32)
    s = (torch.rand(K // G, N, device="cuda", generator=gen) * 0.01 + 0.001).to(torch.bfloat16)
    return pack_awq_int4(q), pack_awq_int4(z), s


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("K, N, G", [(3584, 4608, 128), (18944, 3584, 128), (3584, 3584, 64)])
def test_every_config_matches_the_reference(K, N, G):
    assert awq_mma.runs_on(torch.device("cuda"))
    qw, qz, s = _layer(K, N, G, seed=K + N + G)
    words, sz = awq_mma.mma_from_awq(qw, qz, s, G)
    w = awq_mma.mma_dequantize_reference(words, sz)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for M in (1, 3, 8, 13, 16, 24, 32, 45, 64):
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        ref = x.float() @ w
        for cfg in awq_mma.mma_configs(M, N):
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            awq_mma.mma_launch(x, words, sz, cfg, out)
            assert _rel(out, ref) < 1e-2, (M, cfg)


@pytest.mark.parametrize("K, N, G", [(3584, 4608, 128), (18944, 3584, 128), (3584, 3584, 64), (896, 1152, 128)])
def test_every_tile_config_matches_the_reference(K, N, G):
    dev = torch.device("cuda")
    qw, qz, s = _layer(K, N, G, seed=K + N + G + 1)
    words, sz = awq_mma.mma_from_awq(qw, qz, s, G)
    w = awq_mma.mma_dequantize_reference(words, sz)
    gen = torch.Generator(device="cuda").manual_seed(4)
    tried = 0
    for M in (17, 32, 33, 64, 65, 128, 200, 256):
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        ref = x.float() @ w
        for cfg in awq_tile.tile_configs(next_pow2(M), N, K, sm_count(dev), awq_tile.smem_limit(dev)):
            out = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
            awq_tile.tile_launch(x, words, sz, cfg, out)
            assert _rel(out, ref) < 1e-2, (M, cfg)
            again = awq_tile.tile_launch(x, words, sz, cfg)  # the partials add in a fixed order: the same bits
            assert torch.equal(again, out), (M, cfg)
            tried += 1
    assert tried >= 8
    cfg = awq_tile.tile_configs(64, N, K, sm_count(dev), awq_tile.smem_limit(dev))[0]
    x = torch.randn(48, K, device="cuda", generator=gen).to(torch.bfloat16)
    awq_tile.tile_launch(x, words, sz, cfg)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = awq_tile.tile_launch(x, words, sz, cfg)
    for _ in range(2):  # the counters are zero again after each replay
        x.copy_(torch.randn(48, K, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(y, x.float() @ w) < 1e-2


def test_awq_linear_with_the_mma_layout_across_the_cut_over_and_in_a_graph(monkeypatch):
    monkeypatch.setenv(awq_mma.ENV, "1")
    K, N, G = 3584, 4608, 128
    qw, qz, s = _layer(K, N, G, seed=7)
    p = awq_prepare(qw, qz, s, G)
    assert p.words is not None and p.qk is not None
    w = awq_mma.mma_dequantize_reference(p.words, p.sz)
    gen = torch.Generator(device="cuda").manual_seed(2)
    for M in (1, 2, 5, 8, 16, 31, 32, 33, 40):
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        assert _rel(awq_linear(x, p), x.float() @ w) < 1e-2, M
    x = torch.randn(8, K, device="cuda", generator=gen).to(torch.bfloat16)
    awq_linear(x, p)  # tuned outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = awq_linear(x, p)
    x.copy_(torch.randn(8, K, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(y, x.float() @ w) < 1e-2


def test_a_layer_in_the_mma_layout_alone(monkeypatch):
    """LLM_KERNELS_AWQ_MMA=small's layers: the kernel up to 64 tokens, the dequantized layout
    (llm_kernels.awq_mma_dequant, exact in bf16) and cuBLAS above, and from a CUDA graph."""
    from llm_kernels.awq_mma_dequant import mma_dequantize

    K, N, G = 3584, 4608, 128
    qw, qz, s = _layer(K, N, G, seed=9)
    p = awq_prepare(qw, qz, s, G, mma_only=True)
    assert p.words is not None and p.qk is None and p.qweight is None
    w = awq_mma.mma_dequantize_reference(p.words, p.sz)
    assert torch.equal(mma_dequantize(p.words, p.sz, torch.bfloat16), w.to(torch.bfloat16))
    gen = torch.Generator(device="cuda").manual_seed(3)
    for M in (1, 8, 32, 33, 48, 64, 65, 300):
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        assert _rel(awq_linear(x, p), x.float() @ w) < 1e-2, M
    for M in (48, 100):  # the kernel, and the dequantized layout, replayed
        x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
        awq_linear(x, p)  # tuned outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = awq_linear(x, p)
        x.copy_(torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(y, x.float() @ w) < 1e-2, M


@pytest.mark.parametrize("mode", ["1", "small"])
def test_an_engine_decoding_on_the_kernel_generates_what_kpack_does(tmp_path, monkeypatch, mode):
    """bf16 (the kernels' dtype), CUDA graphs on; only one config of a kernel is a candidate at
    each M, so every layer of a decode step runs awq_mma, and of a prefill step up to 256
    tokens awq_tile (its 128-column blocks divide every layer of the test model). "small":
    the test model's layers are all small, so they hold the mma layout alone."""
    from engine import LLM, SamplingParams
    from tests import models

    src = models.make_checkpoint(str(tmp_path / "dense"), "qwen2", seed=4, hidden_size=256, intermediate_size=512,
                                 num_attention_heads=8, num_key_value_heads=2)
    dst = models.round_to_nearest_awq(src, str(tmp_path / "awq"), group=128)
    prompts = [{"prompt_token_ids": list(range(5 + i, 40 + 7 * i))} for i in range(6)]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    # 8 sequences at most and no mixed-step graphs: the defaults capture and tune graphs far past
    # what 6 prompts need (alone on a fresh machine the test did not finish in 250 s, session 19;
    # with 8 sequences, mode "small" still ran past 170 s, session 20, tuning the mixed steps'
    # token ladder up to 512)
    # 128 tokens a step: the 300 prompt tokens prefill in chunks of 17-128 (awq_tile's range), not at once
    kw = dict(device="cuda", dtype="bfloat16", num_kv_blocks=256, max_num_seqs=8, max_cudagraph_tokens=0,
              max_num_batched_tokens=128)
    kpack = LLM(dst, **kw).generate(prompts, params)

    calls = []
    launch = awq_mma.mma_launch
    monkeypatch.setattr(awq_mma, "mma_launch", lambda *a, **k: calls.append(1) or launch(*a, **k))
    tiles = []
    tile = awq_tile.tile_launch
    monkeypatch.setattr(awq_tile, "tile_launch", lambda *a, **k: tiles.append(1) or tile(*a, **k))

    def only_the_kernels(M, N, K, mma_max, sms=None, smem=None):
        """awq_mma's first config up to 16 tokens, awq_tile's first from 17 (the prompts'
        prefill chunks), the layer's other path where neither launches."""
        if M <= 16:
            return awq_mma.mma_configs(M, N)[:1]
        return awq_tile.tile_configs(next_pow2(M), N, K, sms, smem)[:1] or [awq_configs.OTHER_LAYOUT]

    monkeypatch.setattr(awq_configs, "small_m_configs", only_the_kernels)
    monkeypatch.setenv(awq_mma.ENV, mode)
    mma = LLM(dst, **kw).generate(prompts, params)
    assert calls and tiles  # the kernels ran (captured in the decode graphs, or eagerly)
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(kpack, mma))
    assert same >= 5, same  # bf16 sums in another order may flip a near tie
    for a, b in zip(kpack, mma):  # every token decodes on awq_mma after prefills partly on awq_tile
        if a.outputs[0].token_ids == b.outputs[0].token_ids:
            for la, lb, t in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, a.outputs[0].token_ids):
                # bf16 logits of magnitude 8-16 round to steps of 1/16 (the H200 showed gaps up to 0.073)
                assert abs(la[t].logprob - lb[t].logprob) < 0.15
