"""llm_kernels.awq_mma on the CPU: the mma layout undoes to the checkpoint's weights, the
kernel's lanes reading it (the PTX fragment layouts, emulated) compute the product, the
opt-in and its errors, and the tuner's choice between the mma kernel and the layer's kpack
path. The CUDA kernel itself runs on a GPU only (tests/gpu/test_awq_mma_gpu.py)."""
import pytest
import torch

from llm_kernels import awq_configs, awq_mma, dispatch
from llm_kernels.awq import awq_dequantize, awq_gemm_reference, awq_linear, awq_prepare, pack_awq_int4


def _layer(gen, K, N, G):
    q = torch.randint(0, 16, (K, N), generator=gen)
    z = torch.randint(0, 16, (K // G, N), generator=gen)
    s = (torch.rand(K // G, N, generator=gen) * 0.02 + 0.001).to(torch.bfloat16)
    return q, z, s


@pytest.mark.parametrize("K, N, G", [(256, 32, 128), (384, 48, 128), (256, 32, 64), (512, 16, 256)])
def test_the_layout_undoes_to_the_checkpoint_weight(K, N, G):
    gen = torch.Generator().manual_seed(K + N + G)
    q, z, s = _layer(gen, K, N, G)
    qw, qz = pack_awq_int4(q), pack_awq_int4(z)
    words, sz = awq_mma.mma_from_awq(qw, qz, s, G)
    assert words.shape == (N // 16, K // 64, 32, 4) and words.dtype == torch.int32
    assert sz.shape == (N // 16, K // G, 8, 4) and sz.dtype == torch.bfloat16
    torch.testing.assert_close(awq_mma.mma_dequantize_reference(words, sz),
                               awq_dequantize(qw, qz, s, G, dtype=torch.float32), rtol=0, atol=0)


@pytest.mark.parametrize("M, K, N, G", [(1, 256, 32, 128), (7, 384, 48, 128), (16, 128, 16, 128),
                                        (27, 256, 32, 64), (3, 512, 16, 256)])
def test_lanes_reading_the_layout_compute_the_product(M, K, N, G):
    gen = torch.Generator().manual_seed(M * 1000 + K + N + G)
    q, z, s = _layer(gen, K, N, G)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    exact = (q - z.repeat_interleave(G, 0)).float() * s.repeat_interleave(G, 0).float()
    w = exact.to(torch.bfloat16).float()  # the kernel's bf16 dequant
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    ref = x.float() @ w
    got = awq_mma.mma_emulate_lanes(x, *awq_mma.mma_pack(q, z, s))
    assert rel(got, ref) < 1e-5
    # the SC configs: q - z exact in the fragments, each group's float32 sums scaled, so the
    # product of the float32 weights, not of their bf16 rounding
    sc = awq_mma.mma_emulate_lanes(x, *awq_mma.mma_pack(q, z, s), sc=True)
    assert rel(sc, x.float() @ exact) < 1e-5 < rel(got, x.float() @ exact)


def test_a_wrong_nibble_order_is_caught():
    """The emulation sees the layout: two fragment elements' nibbles swapped break the product."""
    gen = torch.Generator().manual_seed(5)
    K, N = 128, 16
    q = torch.randint(0, 16, (K, N), generator=gen)
    x = torch.randn(3, K, generator=gen).to(torch.bfloat16)
    words, sz = awq_mma.mma_pack(q, torch.zeros(1, N, dtype=torch.int64), torch.ones(1, N, dtype=torch.bfloat16))
    w = words.to(torch.int64) & 0xFFFFFFFF
    swapped = (w & ~0xF0F) | ((w & 0xF) << 8) | ((w >> 8) & 0xF)  # nibbles 0 and 2 exchanged
    swapped = torch.where(swapped >= 2**31, swapped - 2**32, swapped).to(torch.int32)
    ref = x.float() @ q.float()
    assert ((awq_mma.mma_emulate_lanes(x, words, sz) - ref).norm() / ref.norm()).item() < 1e-5
    assert ((awq_mma.mma_emulate_lanes(x, swapped, sz) - ref).norm() / ref.norm()).item() > 1e-2


def test_opt_in_only_where_the_kernel_runs(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # bf16 dots are broken under the interpreter: the CPU path
    gen = torch.Generator().manual_seed(1)
    q, z, s = _layer(gen, 256, 32, 128)
    qw, qz = pack_awq_int4(q), pack_awq_int4(z)
    assert awq_prepare(qw, qz, s, 128).words is None  # off by default
    monkeypatch.setenv(awq_mma.ENV, "1")
    assert awq_mma.enabled() and not awq_mma.runs_on(torch.device("cpu"))
    assert awq_prepare(qw, qz, s, 128).words is None  # the CPU cannot run it
    p = awq_prepare(qw, qz, s, 128, mma=True)  # asked for: the layout is made anywhere
    torch.testing.assert_close(awq_mma.mma_dequantize_reference(p.words, p.sz),
                               awq_dequantize(qw, qz, s, 128, dtype=torch.float32))
    x = torch.randn(4, 256, generator=gen).to(torch.bfloat16)
    torch.testing.assert_close(awq_linear(x, p), awq_gemm_reference(x, qw, qz, s, 128))


@pytest.mark.parametrize("K, N, G, what", [(256, 24, 128, "N=24"), (256, 32, 32, "group 32"),
                                           (320, 32, 64, None)])
def test_a_layer_the_layout_does_not_fit_is_refused_by_name(K, N, G, what):
    gen = torch.Generator().manual_seed(2)
    q, z, s = _layer(gen, K, N, G)
    if what is None:  # K = 5 chunks of 64, group 64: fits
        assert awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G, mma=True).words is not None
        return
    with pytest.raises(ValueError, match=what):
        awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, G, mma=True)


def test_configs_fit_shared_memory_and_launch_checks_its_input():
    for M in (1, 8, 9, 16, 17, 32, 64):
        for N in (16, 48, 64, 4608):
            cfgs = awq_mma.mma_configs(M, N)
            assert cfgs and all(c["kind"] == "mma" and awq_mma.fits(c["nw"], -(-M // 8), c.get("ntb", 1))
                                and N % (16 * c.get("ntb", 1)) == 0 for c in cfgs)
            if N % 64 == 0 and M <= 32:  # at M = 64, 4 tiles of 8 token tiles on 4 warps would need 64 KB
                assert {c.get("ntb", 1) for c in cfgs} == {1, 2, 4}
    assert not awq_mma.fits(16, 8)  # 64 KB: the M = 64 tiles leave 16 warps out
    # the SC configs (group sums in registers) up to SC_MAX_MT token tiles only
    assert any(c.get("sc") for c in awq_mma.mma_configs(8 * awq_mma.SC_MAX_MT, 4608))
    assert not any(c.get("sc") for c in awq_mma.mma_configs(8 * awq_mma.SC_MAX_MT + 1, 4608))
    name, src = awq_mma.kernel_source(8, 2, 2, 1, sc=1)
    assert name.endswith("_sc") and "#define SC 1\n" in src and "#define SC 0\n" in awq_mma.kernel_source(8, 2, 2, 1)[1]
    # the MB configs (at least MB blocks an SM: registers capped) at 17-32 tokens only
    for M in (1, 16, 17, 32, 33, 64):
        assert any(c.get("mb") for c in awq_mma.mma_configs(M, 4608)) == (17 <= M <= 32), M
    assert "__launch_bounds__(NW * 32, 4)" in awq_mma.kernel_source(8, 4, 2, 1, mb=4)[1]
    assert "__launch_bounds__(NW * 32)\n" in awq_mma.kernel_source(8, 4, 2, 1)[1]
    assert {c.get("ntb", 1) for c in awq_mma.mma_configs(8, 48)} == {1}  # 3 tiles: neither 2 nor 4 a block
    words, sz = awq_mma.mma_pack(torch.zeros(128, 16, dtype=torch.int64), torch.zeros(1, 16, dtype=torch.int64),
                                 torch.ones(1, 16))
    for x, cfg in ((torch.zeros(65, 128, dtype=torch.bfloat16), {}), (torch.zeros(2, 128, dtype=torch.float16), {}),
                   (torch.zeros(2, 64, dtype=torch.bfloat16), {}),
                   (torch.zeros(64, 128, dtype=torch.bfloat16), {"nw": 16}),
                   (torch.zeros(2, 128, dtype=torch.bfloat16), {"ntb": 2}),  # 16 columns: no 2 tiles a block
                   (torch.zeros(33, 128, dtype=torch.bfloat16), {"sc": 1}),  # 5 token tiles: past SC_MAX_MT
                   (torch.zeros(16, 128, dtype=torch.bfloat16), {"mb": 2})):  # 2 token tiles: not in MB_MT
        with pytest.raises(ValueError, match="mma_launch"):
            awq_mma.mma_launch(x, words, sz, {"nw": 4, "u": 2, **cfg})


def test_the_tuner_picks_the_faster_of_the_mma_kernel_and_the_kpack_path(fake_gpu, monkeypatch):
    """Per shape, from timings: the mma config that wins, or kpack where it is faster; the first
    candidate (the layer's other path) is what a capture takes before the shape is tuned."""
    monkeypatch.setattr(dispatch, "_TUNED", {})
    gen = torch.Generator().manual_seed(3)
    q, z, s = _layer(gen, 256, 32, 128)
    words, sz = awq_mma.mma_pack(q, z, s)
    fast = {"nw": 8, "u": 4}

    def tag(c):
        return f"mma{c['nw']}-{c['u']}-{c.get('ntb', 1)}"

    costs = {"layout": 10e-6, **{tag(c): 12e-6 for c in awq_mma.mma_configs(32, 32)}}
    costs[tag(fast)] = 6e-6
    gpu = fake_gpu(costs)
    out = torch.zeros(1, 32)
    other = lambda x: gpu.log.append("layout") or out  # noqa: E731 - the layer's kpack (or checkpoint) path
    monkeypatch.setattr(awq_mma, "mma_launch", lambda x, w, sz, c: gpu.log.append(tag(c)) or out)
    x = torch.zeros(3, 256, dtype=torch.bfloat16)
    awq_configs.small_m_gemm(x, words, sz, 128, other)
    assert dispatch.chosen(awq_configs.MMA, awq_configs.shape_key(3, 32, 256, 128, torch.bfloat16)) == \
        {"kind": "mma", **fast}
    costs["layout"] = 1e-6  # at another M bucket kpack (here the checkpoint kernel) is faster
    awq_configs.small_m_gemm(torch.zeros(20, 256, dtype=torch.bfloat16), words, sz, 128, other)
    assert dispatch.chosen(awq_configs.MMA, awq_configs.shape_key(20, 32, 256, 128, torch.bfloat16)) == \
        awq_configs.OTHER_LAYOUT
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    gpu.log.clear()
    awq_configs.small_m_gemm(torch.zeros(9, 256, dtype=torch.bfloat16), words, sz, 128, other)  # untuned, in a capture
    assert gpu.log == ["layout"]


# ----------------------------------------------------------------------------
# a layer in the mma layout alone (LLM_KERNELS_AWQ_MMA=small)


@pytest.mark.parametrize("K, N, G", [(256, 32, 128), (384, 48, 64), (512, 16, 256)])
def test_the_dequant_kernel_undoes_the_layout(K, N, G, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from llm_kernels.awq_mma_dequant import mma_dequantize

    gen = torch.Generator().manual_seed(K + N)
    words, sz = awq_mma.mma_pack(*_layer(gen, K, N, G))
    ref = awq_mma.mma_dequantize_reference(words, sz)
    torch.testing.assert_close(mma_dequantize(words, sz, torch.float32), ref, rtol=0, atol=0)
    # bf16: the interpreter's float32 -> bf16 cast truncates where the GPU rounds to nearest
    # (tests/gpu/test_awq_mma_gpu.py checks it exact): within one bf16 step here
    torch.testing.assert_close(mma_dequantize(words, sz, torch.bfloat16).float(), ref, rtol=2 ** -7, atol=0)


def test_the_mode_and_which_layers_keep_the_layout(monkeypatch):
    monkeypatch.delenv(awq_mma.ENV, raising=False)
    assert awq_mma.mode() == "0" and not awq_mma.enabled()
    for value in ("1", "small", "all", "0"):
        monkeypatch.setenv(awq_mma.ENV, value)
        assert awq_mma.mode() == value
    monkeypatch.setenv(awq_mma.ENV, "yes")
    with pytest.raises(ValueError, match="LLM_KERNELS_AWQ_MMA='yes'"):
        awq_mma.mode()
    bf16, fp16 = torch.bfloat16, torch.float16
    assert awq_mma.layout_choice(3584, 4608, bf16, "small") == (True, True)  # Qwen2.5-7B's qkv: alone
    assert awq_mma.layout_choice(3584, 37888, bf16, "small") == (False, False)  # gate_up: kpack only
    assert awq_mma.layout_choice(3584, 4608, fp16, "small") == (False, False)  # the kernel takes bf16 only
    assert awq_mma.layout_choice(3584, 37888, fp16, "1") == (True, False)  # "1": beside kpack, every layer
    assert awq_mma.layout_choice(64, 16, bf16, "0") == (False, False)
    assert awq_mma.layout_choice(3584, 37888, bf16, "all") == (True, True)  # "all": every bf16 layer, alone
    assert awq_mma.layout_choice(3584, 4608, fp16, "all") == (False, False)


@pytest.mark.parametrize("interpret", ["1", "0"])
def test_a_layer_in_the_mma_layout_alone_multiplies_at_every_m(interpret, monkeypatch):
    """On the CPU the product goes through the dequantized layout (the Triton dequant kernel under
    the interpreter, else the reference); on CUDA the kernel takes M <= 64 (the GPU tests)."""
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    gen = torch.Generator().manual_seed(5)
    q, z, s = _layer(gen, 256, 32, 128)
    qw, qz = pack_awq_int4(q), pack_awq_int4(z)
    p = awq_prepare(qw, qz, s, 128, mma_only=True)
    assert p.words is not None and p.qk is None and p.qweight is None and p.qzeros is None
    for M in (1, 33, 70):
        x = torch.randn(M, 256, generator=gen)
        ref = awq_gemm_reference(x, qw, qz, s, 128)
        torch.testing.assert_close(awq_linear(x, p), ref, rtol=1e-4, atol=1e-4)
    for contradiction in ({"kpack": True}, {"mma": False}):
        with pytest.raises(ValueError, match="mma_only"):
            awq_prepare(qw, qz, s, 128, mma_only=True, **contradiction)


def test_small_mode_leaves_a_layer_on_the_cpu_as_it_was(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(awq_mma.ENV, "small")
    gen = torch.Generator().manual_seed(6)
    q, z, s = _layer(gen, 256, 32, 128)
    p = awq_prepare(pack_awq_int4(q), pack_awq_int4(z), s, 128)
    assert p.words is None and p.qweight is not None  # the kernel does not run here: the checkpoint layout


def test_a_buckets_candidates_launch_at_every_m_of_the_bucket():
    """The tuner keeps one choice per power-of-two bucket of M (awq_configs.shape_key): a config
    chosen at 17 tokens must launch at 32 too (8 warps x 4 tiles fits shared memory at 3 token
    tiles, not at 4), and at 33 as at 64 for a layer held in the mma layout alone."""
    for N in (16, 64, 4608):
        for M in range(1, awq_mma.KERNEL_MAX_M + 1):
            bucket = [m for m in range(1, awq_mma.KERNEL_MAX_M + 1) if dispatch.next_pow2(m) == dispatch.next_pow2(M)]
            for cfg in awq_configs.small_m_configs(M, N, 256, awq_mma.KERNEL_MAX_M)[1:]:
                assert all(awq_mma.fits(cfg["nw"], -(-m // 8), cfg.get("ntb", 1)) for m in bucket), (M, N, cfg)
    assert awq_mma.fits(8, 3, 4) and not awq_mma.fits(8, 4, 4)  # the case above: in mma_configs(17), not in (32)
    assert {"kind": "mma", "nw": 8, "u": 2, "ntb": 4} in awq_mma.mma_configs(17, 64)
