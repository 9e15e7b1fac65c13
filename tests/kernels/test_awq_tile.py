"""llm_kernels.awq_tile on the CPU: the stream-K split (every unit in one block, every partial
in its own slot, the tile's blocks found from any unit), the kernel emulated statement by
statement (llm_kernels.awq_tile_emulate: the cp.async pieces, each lane's loads, the PTX
fragment layouts, the flush) computing the product in any order of its blocks, bit for bit
the same, and its configs. The CUDA kernel itself runs on a GPU only
(tests/gpu/test_awq_mma_gpu.py); tests/kernels/test_cuda_sources.py compiles it."""
import random

import pytest
import torch

from llm_kernels import awq_configs, awq_mma, awq_tile
from llm_kernels.awq_tile_emulate import tile_emulate


def test_block_ranges_cover_every_unit_once_and_each_partial_has_its_own_slot():
    for tiles in range(1, 9):
        for KI in range(1, 8):
            T = tiles * KI
            for G in range(1, min(T, 24) + 1):
                ranges = [awq_tile.unit_range(b, T, G) for b in range(G)]
                assert ranges[0][0] == 0 and ranges[-1][1] == T and all(a < b for a, b in ranges)
                assert all(ranges[i][1] == ranges[i + 1][0] for i in range(G - 1))
                for v in range(T):
                    b = awq_tile.block_of(v, T, G)
                    assert ranges[b][0] <= v < ranges[b][1], (T, G, v)
                slots, partials = set(), [0] * G
                for tile in range(tiles):
                    t0 = tile * KI
                    blocks = [b for b, (u0, u1) in enumerate(ranges) if u0 < t0 + KI and u1 > t0]
                    first, last = awq_tile.block_of(t0, T, G), awq_tile.block_of(t0 + KI - 1, T, G)
                    assert blocks == list(range(first, last + 1))
                    if len(blocks) == 1:  # one block: the whole tile is its own, written out directly
                        assert ranges[first][0] <= t0 and ranges[first][1] >= t0 + KI
                        continue
                    for b in blocks:
                        s = awq_tile.slot(b, t0, T, G)
                        assert s // 2 == b and s not in slots
                        assert (s % 2 == 0) == (ranges[b][0] >= t0)  # 2b: the tile its range starts in
                        slots.add(s)
                        partials[b] += 1
                assert max(partials) <= 2


def _layer(gen, K, N, G):
    q = torch.randint(0, 16, (K, N), generator=gen)
    z = torch.randint(0, 16, (K // G, N), generator=gen)
    s = (torch.rand(K // G, N, generator=gen) * 0.02 + 0.001).to(torch.bfloat16)
    return awq_mma.mma_pack(q, z, s)


def _cfg(mt, nwt, wn, u, st, mb=1):
    return {"kind": "tile", "mt": mt, "nwt": nwt, "wn": wn, "u": u, "st": st, "mb": mb}


CASES = [  # M, K, N, group, config, SMs
    (5, 256, 64, 128, _cfg(1, 2, 2, 1, 3), 3),  # one token tile, partial tiles
    (37, 384, 128, 64, _cfg(4, 2, 2, 2, 3), 5),  # two token slices, 2 chunks a stage (the last one short)
    (20, 256, 128, 128, _cfg(2, 2, 2, 1, 2, 2), 2),  # 2 stages, 2 blocks an SM
    (70, 192, 64, 64, _cfg(8, 2, 2, 1, 4), 64),  # G = the units: one unit a block, 3 chunks of a tile
    (9, 512, 64, 256, _cfg(2, 1, 4, 1, 5), 1),  # one block holds the whole layer: every tile written out
]


@pytest.mark.parametrize("M, K, N, G, cfg, sms", CASES)
def test_the_emulated_kernel_computes_the_product(M, K, N, G, cfg, sms):
    gen = torch.Generator().manual_seed(M * 7 + K + N)
    words, sz = _layer(gen, K, N, G)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    assert awq_tile.fits(M, N, K, cfg, sms, 227 * 1024)
    ref = x.float() @ awq_mma.mma_dequantize_reference(words, sz).to(torch.bfloat16).float()  # bf16 weights, as dq makes them
    y = tile_emulate(x, words, sz, cfg, sms).float()
    assert not torch.isnan(y).any()  # every element written
    # float32 sums in another order, then one bf16 rounding: within a bf16 step of the exact product
    assert ((y - ref).abs() <= ref.abs() * 2 ** -7 + 1e-3).all()


@pytest.mark.parametrize("M, K, N, G, cfg, sms", [CASES[0], CASES[1]])
def test_blocks_in_any_order_give_the_same_bits(M, K, N, G, cfg, sms):
    """The last block of a tile to finish adds its partials in the blocks' order, whichever it is."""
    gen = torch.Generator().manual_seed(11)
    words, sz = _layer(gen, K, N, G)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    blocks = list(range(awq_tile.grid_for(M, N, K, cfg, sms)))
    assert len(blocks) > 2
    y = tile_emulate(x, words, sz, cfg, sms).view(torch.int16)
    rng = random.Random(0)
    for _ in range(2):
        rng.shuffle(blocks)
        assert torch.equal(tile_emulate(x, words, sz, cfg, sms, order=blocks).view(torch.int16), y)


def test_a_wrong_nibble_order_is_caught():
    """The emulation reads the layout as the lanes do: nibbles 0 and 2 of every word swapped
    (two k of a fragment exchanged) break the product."""
    gen = torch.Generator().manual_seed(5)
    words, sz = _layer(gen, 128, 64, 128)
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16)
    w = words.to(torch.int64) & 0xFFFFFFFF
    swapped = (w & ~0xF0F) | ((w & 0xF) << 8) | ((w >> 8) & 0xF)
    swapped = torch.where(swapped >= 2**31, swapped - 2**32, swapped).to(torch.int32)
    ref = x.float() @ awq_mma.mma_dequantize_reference(words, sz)
    cfg = _cfg(1, 2, 2, 1, 2)
    rel = lambda y: ((y.float() - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(tile_emulate(x, words, sz, cfg, 2)) < 4e-3 < 0.1 < rel(tile_emulate(x, swapped, sz, cfg, 2))


def test_the_candidates_of_a_bucket():
    H200 = (132, 227 * 1024)
    assert awq_tile.tile_configs(16, 4608, 3584, *H200) == [] == awq_tile.tile_configs(512, 4608, 3584, *H200)
    for bucket in (32, 64, 128, 256):
        cands = awq_tile.tile_configs(bucket, 4608, 3584, *H200)
        assert cands and all(c["mt"] == min(8, bucket // 8) for c in cands)
        assert all(c["u"] == 1 or c["mt"] <= awq_tile.U2_MAX_MT for c in cands)
        for c in cands:  # the bucket's choice launches at every M of the bucket
            assert all(awq_tile.fits(m, 4608, 3584, c, *H200) for m in range(bucket // 2 + 1, bucket + 1))
            G = awq_tile.grid_for(bucket, 4608, 3584, c, 132)
            bm, bn = 8 * c["mt"], 16 * c["nwt"] * c["wn"]
            assert G <= 132 * c["mb"] and 2 * G * bm * bn <= awq_tile.WS_FLOATS
    # 896 columns (Qwen2.5-0.5B): only the 128-column blocks divide them
    assert {16 * c["nwt"] * c["wn"] for c in awq_tile.tile_configs(64, 896, 896, *H200)} == {128}
    # an Ada GPU (99 KB a block): the 6-stage 8-warp configs do not fit
    ada = awq_tile.tile_configs(64, 4608, 3584, 128, 99 * 1024)
    assert ada and all(awq_tile.smem_bytes(c["mt"], c["nwt"], c["wn"], c["u"], c["st"]) <= 99 * 1024 for c in ada)
    assert len(ada) < len(awq_tile.tile_configs(64, 4608, 3584, *H200))


def test_the_tuners_candidates_on_a_layer_in_the_mma_layout():
    kinds = lambda cands: [c["kind"] for c in cands]  # noqa: E731
    gpu = (132, 227 * 1024)
    assert kinds(awq_configs.small_m_configs(8, 4608, 3584, 32))[0] == "layout"
    assert set(kinds(awq_configs.small_m_configs(8, 4608, 3584, 32, *gpu))) == {"layout", "mma"}  # under 17: no tile
    assert set(kinds(awq_configs.small_m_configs(20, 4608, 3584, 32, *gpu))) == {"layout", "mma", "tile"}
    assert set(kinds(awq_configs.small_m_configs(40, 4608, 3584, 32, *gpu))) == {"layout", "tile"}  # mma: to 32
    assert set(kinds(awq_configs.small_m_configs(40, 4608, 3584, 64, *gpu))) == {"layout", "mma", "tile"}
    assert set(kinds(awq_configs.small_m_configs(200, 4608, 3584, 64, *gpu))) == {"layout", "tile"}
    assert "tile" not in kinds(awq_configs.small_m_configs(40, 4608, 3584, 64))  # no GPU: no tile configs


def test_the_launcher_refuses_what_the_kernel_cannot_take():
    gen = torch.Generator().manual_seed(1)
    words, sz = _layer(gen, 256, 64, 128)
    for x, cfg in ((torch.zeros(20, 256, dtype=torch.bfloat16), _cfg(4, 2, 2, 1, 3)),  # a CPU tensor
                   (torch.zeros(20, 256), _cfg(4, 2, 2, 1, 3))):
        with pytest.raises(ValueError, match="tile_launch"):
            awq_tile.tile_launch(x, words, sz, cfg)
    assert not awq_tile.fits(20, 64, 256, _cfg(4, 4, 2, 1, 3), 4, 227 * 1024)  # 128 columns a block, 64 in the layer
    assert not awq_tile.fits(300, 64, 256, _cfg(4, 2, 2, 1, 3), 4, 227 * 1024)  # past MAX_M
    assert not awq_tile.fits(20, 64, 256, _cfg(8, 4, 8, 1, 6), 4, 48 * 1024)  # shared memory
