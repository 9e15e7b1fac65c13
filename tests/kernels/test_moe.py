"""Fused MoE: the expert sort/pad (moe_align: the one-launch Triton program against the torch
ops), and the Triton grouped GEMMs (interpreted) against the PyTorch reference, dense and AWQ
(on AutoAWQ's packing: the widening kernel; repacked into kpack experts: the engine's GPU
kernel, swapped or not); float32 and float16 (bf16 dots are broken under the interpreter)."""
import pytest
import torch
import torch.nn.functional as F
from tests.kernels.kernel_checks import assert_close

from llm_kernels import awq_dequantize, kpack_experts, kpack_fits, moe, pack_awq_int4
from llm_kernels.w4a16.kpack import kpack_from_awq
from llm_kernels.moe import (
    AWQExperts,
    awq_experts_dequantize,
    fused_moe,
    fused_moe_awq,
    fused_moe_awq_reference,
    fused_moe_reference,
    moe_align,
)

E, K_TOP = 8, 2


def routing(T, rng, pattern="random", k=K_TOP):
    """(topk_weights float32 [T, k], topk_ids [T, k]): "random" softmax top-k with
    experts 3 and 6 never chosen; "skewed" most tokens on experts 0 and 5 (several
    BLOCK_M blocks for one expert), the others on none or few."""
    logits = torch.randn(T, E, generator=rng)
    logits[:, [3, 6]] = -1e4
    if pattern == "skewed":
        logits[: max(1, T - 3), [0, 5]] += 20.0
    w, ids = torch.topk(logits.softmax(-1), k, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def dense_weights(H, inter, dtype, rng):
    w13 = (torch.randn(E, 2 * inter, H, generator=rng) * H ** -0.5).to(dtype)
    w2 = (torch.randn(E, H, inter, generator=rng) * inter ** -0.5).to(dtype)
    return w13, w2


def awq_weights(K, N, G, dtype, rng):
    q = torch.randint(0, 16, (E, K, N), generator=rng)
    z = torch.randint(0, 16, (E, K // G, N), generator=rng)
    s = (torch.rand(E, K // G, N, generator=rng) * 0.02 + 0.002).to(dtype)
    return AWQExperts(torch.stack([pack_awq_int4(t) for t in q]), torch.stack([pack_awq_int4(t) for t in z]), s, G)


@pytest.mark.parametrize("T,k,bm", [(1, 2, 16), (37, 2, 16), (37, 2, 32), (5, 8, 16), (200, 1, 64)])
def test_moe_align_groups_and_pads_every_pair_once(T, k, bm, rng):
    ids = torch.randint(0, E, (T, k), generator=rng)
    ids[0] = 2  # a token with the same expert twice: two distinct pairs
    sorted_ids, block_expert, total = moe_align(ids, E, bm)
    n = T * k
    assert sorted_ids.numel() % bm == 0 and sorted_ids.numel() >= n
    assert sorted_ids.numel() == -(-(n + min(E, n) * (bm - 1)) // bm) * bm  # static: from the shapes alone
    total = int(total)
    assert total % bm == 0
    real = sorted_ids[sorted_ids < n]
    assert sorted(real.tolist()) == list(range(n))  # every (token, slot) pair exactly once
    assert (sorted_ids[total:] == n).all()  # nothing past the padded length but sentinels
    flat = ids.reshape(-1)
    for b in range(total // bm):
        block = sorted_ids[b * bm : (b + 1) * bm]
        block = block[block < n].long()
        assert block.numel() > 0, "a padded block without a row"
        assert (flat[block] == block_expert[b]).all()
        assert torch.equal(block, block.sort().values)  # token order within an expert
    counts = torch.bincount(flat, minlength=E)
    assert total == int(((counts + bm - 1) // bm * bm).sum())


@pytest.mark.parametrize("T,k,bm,experts", [(1, 2, 16, 8), (37, 2, 16, 8), (200, 1, 64, 8), (70, 8, 16, 128),
                                             (300, 8, 16, 128)])
def test_moe_align_in_one_launch_is_the_torch_ops_exactly(T, k, bm, experts, rng, monkeypatch):
    """The one-program Triton sort (pairs up to ALIGN_PAIRS) and the torch ops beside it (more
    pairs, the CPU) give the same three tensors: ranks across chunks of 128 pairs, 128 experts,
    experts with no pairs, blocks past the padded length (the last expert)."""
    ids = torch.randint(0, experts, (T, k), generator=rng)
    ids[: T // 2, 0] = 1  # one expert with many runs of blocks
    one_launch = moe_align(ids, experts, bm)
    monkeypatch.setattr(moe, "ALIGN_PAIRS", 0)
    for got, want in zip(one_launch, moe_align(ids, experts, bm)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("pattern", ["random", "skewed"])
def test_fused_moe_matches_reference(dtype, T, pattern, rng, poisoned):
    H, inter = 64, 32
    x = torch.randn(T, H, generator=rng).to(dtype)
    w13, w2 = dense_weights(H, inter, dtype, rng)
    tw, ti = routing(T, rng, pattern)
    ref = fused_moe_reference(x, w13, w2, tw, ti)
    with poisoned():
        out = fused_moe(x, w13, w2, tw, ti)
    assert_close(out, ref, dtype, rng.initial_seed(), f"fused_moe {pattern}")


@pytest.mark.parametrize("cfg", [
    {"BM": 32, "BN": 16, "BK": 16, "warps": 4, "stages": 2, "GM": 2},
    {"BM": 16, "BN": 64, "BK": 64, "warps": 4, "stages": 2, "GM": 1},
])
def test_fused_moe_ragged_shapes_and_configs(cfg, rng, poisoned):
    """H and I not multiples of the blocks (masked K and N edges), int32 ids."""
    H, inter, T = 40, 24, 21
    x = torch.randn(T, H, generator=rng)
    w13, w2 = dense_weights(H, inter, torch.float32, rng)
    tw, ti = routing(T, rng, "skewed")
    ti = ti.to(torch.int32)
    ref = fused_moe_reference(x, w13, w2, tw, ti)
    with poisoned():
        out = fused_moe(x, w13, w2, tw, ti, config=cfg)
    assert_close(out, ref, torch.float32, rng.initial_seed(), f"fused_moe {cfg}")


def test_routing_weights_are_applied_once(rng):
    """Top-1 with weight 1 is the chosen expert's MLP; the output is linear in the weights."""
    H, inter, T = 32, 16, 9
    x = torch.randn(T, H, generator=rng)
    w13, w2 = dense_weights(H, inter, torch.float32, rng)
    ids = torch.randint(0, E, (T, 1), generator=rng)
    out = fused_moe(x, w13, w2, torch.ones(T, 1), ids)
    for t in range(T):
        e = int(ids[t])
        gate, up = (x[t] @ w13[e].t()).chunk(2)
        torch.testing.assert_close(out[t], (F.silu(gate) * up) @ w2[e].t(), rtol=1e-5, atol=1e-5)
    tw, ti = routing(T, rng)
    once = fused_moe(x, w13, w2, tw, ti)
    torch.testing.assert_close(fused_moe(x, w13, w2, 3 * tw, ti), 3 * once, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(once, fused_moe_reference(x, w13, w2, tw, ti), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("G,H,inter", [(32, 64, 32), (64, 128, 64), (128, 128, 128), (32, 256, 128)])
@pytest.mark.parametrize("T", [1, 37])
def test_fused_moe_awq_matches_dequantized_reference(dtype, G, H, inter, T, rng, poisoned):
    x = torch.randn(T, H, generator=rng).to(dtype)
    w13, w2 = awq_weights(H, 2 * inter, G, dtype, rng), awq_weights(inter, H, G, dtype, rng)
    tw, ti = routing(T, rng, "skewed" if T > 1 else "random")
    ref = fused_moe_awq_reference(x, w13, w2, tw, ti)
    dense = fused_moe_reference(x, awq_experts_dequantize(w13, torch.float32), awq_experts_dequantize(w2, torch.float32),
                                tw, ti).to(dtype)
    assert_close(dense, ref, dtype, rng.initial_seed(), "dense of the dequantized experts")
    with poisoned():
        wide = fused_moe_awq(x, w13, w2, tw, ti)  # AutoAWQ's packing: the widening kernel
    assert_close(wide, ref, dtype, rng.initial_seed(), f"fused_moe_awq g{G}, the widening kernel")
    fits = kpack_fits(H, G) and kpack_fits(inter, G)
    assert fits == (inter % 128 == 0)  # the engine repacks the last two cases
    if not fits:  # a K of 64 or 32 rows: no whole 128-row block
        return
    k13, k2 = kpack_experts(w13), kpack_experts(w2)
    assert k13.shape == w13.shape and k2.shape == w2.shape
    assert_close(fused_moe_awq_reference(x, k13, k2, tw, ti), ref, dtype, rng.initial_seed(), "kpack reference")
    with poisoned():
        kpack = fused_moe_awq(x, k13, k2, tw, ti)  # the tuner's first kpack config
        swapped = fused_moe_awq(x, k13, k2, tw, ti, config={"kind": "kpack", "BM": 32, "BN": 32, "swap": True})
    assert_close(kpack, ref, dtype, rng.initial_seed(), f"fused_moe_awq g{G}, kpack experts")
    assert_close(swapped, ref, dtype, rng.initial_seed(), f"fused_moe_awq g{G}, kpack experts swapped")


@pytest.mark.parametrize("N,chunk", [(192, 3), (128, 16), (96, 4)])
def test_kpack_experts_in_chunks_are_each_expert_repacked(N, chunk, rng):
    """Experts side by side repack as one matrix (N whole stripes: 192 in chunks of 3 of the 8,
    the last one short; 128 all at once) and one at a time (96: no whole stripes): the same
    tensors as kpack_from_awq of each expert."""
    w = awq_weights(256, N, 64, torch.float32, rng)
    k = kpack_experts(w, chunk=chunk)
    assert k.shape == w.shape and k.scales.data_ptr() == w.scales.data_ptr()
    for e in range(E):
        qk, zeros = kpack_from_awq(w.qweight[e], w.qzeros[e], 64)
        assert torch.equal(k.qk[e], qk) and torch.equal(k.zeros[e], zeros), e


def test_awq_experts_layout_is_the_checkpoint_stacked(rng):
    w = awq_weights(64, 48, 32, torch.float32, rng)
    assert w.shape == (E, 48, 64)
    dense = awq_experts_dequantize(w)
    for e in (0, 5):
        torch.testing.assert_close(dense[e], awq_dequantize(w.qweight[e], w.qzeros[e], w.scales[e], 32).t())


def test_fused_moe_refuses_mismatched_shapes(rng):
    x = torch.randn(3, 32)
    w13, w2 = dense_weights(32, 16, torch.float32, rng)
    tw, ti = routing(3, rng)
    with pytest.raises(ValueError, match="w2"):
        fused_moe(x, w13, w2[:, :, :8], tw, ti)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe(x, w13, w2, tw[:2], ti[:2])
    q = awq_weights(32, 32, 32, torch.float32, rng)
    with pytest.raises(ValueError, match="group"):
        fused_moe_awq(x, q._replace(group_size=64), awq_weights(16, 32, 16, torch.float32, rng), tw, ti)
    w13, w2 = awq_weights(128, 256, 32, torch.float32, rng), awq_weights(128, 128, 32, torch.float32, rng)
    with pytest.raises(ValueError, match="must both be AWQExperts or both KPackExperts"):
        fused_moe_awq(torch.randn(3, 128), w13, kpack_experts(w2), tw, ti)


def test_zero_tokens(rng):
    w13, w2 = dense_weights(32, 16, torch.float32, rng)
    out = fused_moe(torch.randn(0, 32), w13, w2, torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.long))
    assert out.shape == (0, 32)
