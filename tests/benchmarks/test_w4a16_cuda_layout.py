"""benchmarks/w4a16_cuda_proto.py's weight layout: the repacked words and scales, read the way
the CUDA kernel's lanes read them (mma.sync m16n8k16 fragments, the permuted K order inside a
chunk), give x @ dequant(w). The kernel itself runs on CUDA only (the device's runs)."""
import pytest
import torch

from benchmarks import w4a16_cuda_proto as proto


@pytest.mark.parametrize("M, K, N", [(1, 256, 32), (7, 384, 48), (16, 128, 16), (27, 256, 32)])
def test_lanes_reading_the_repacked_weight_compute_the_product(M, K, N):
    gen = torch.Generator().manual_seed(M * 1000 + K + N)
    q = torch.randint(0, 16, (K, N), generator=gen)
    z = torch.randint(0, 16, (K // proto.G, N), generator=gen)
    s = (torch.rand(K // proto.G, N, generator=gen) * 0.02 + 0.001).to(torch.bfloat16)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    w = (q - z.repeat_interleave(proto.G, 0)).to(torch.bfloat16) * s.repeat_interleave(proto.G, 0)
    ref = x.float() @ w.float()
    words, sz = proto.repack(q, z, s)
    assert words.shape == (N // 16, K // 64, 32, 4) and words.dtype == torch.int32
    assert sz.shape == (N // 16, K // proto.G, 8, 4) and sz.dtype == torch.bfloat16
    got = proto.emulate(x, words, sz)
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5


def test_a_wrong_nibble_order_is_caught():
    """The check sees the layout: swapping two fragment elements' nibbles breaks the product."""
    gen = torch.Generator().manual_seed(5)
    K, N = 128, 16
    q = torch.randint(0, 16, (K, N), generator=gen)
    z = torch.zeros(1, N, dtype=torch.int64)
    s = torch.ones(1, N, dtype=torch.bfloat16)
    x = torch.randn(3, K, generator=gen).to(torch.bfloat16)
    ref = x.float() @ q.float()
    words, sz = proto.repack(q, z, s)
    w = words.to(torch.int64) & 0xFFFFFFFF
    swapped = (w & ~0xF0F) | ((w & 0xF) << 8) | ((w >> 8) & 0xF)  # nibbles 0 and 2 exchanged
    swapped = torch.where(swapped >= 2**31, swapped - 2**32, swapped).to(torch.int32)
    bad = proto.emulate(x, swapped, sz)
    assert ((bad - ref).norm() / ref.norm()).item() > 1e-2
