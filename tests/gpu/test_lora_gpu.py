"""Batched LoRA on the GPU at Qwen2.5-7B's shapes as the engine holds them (K 3584: qkv N 4608
in slices q, k, v, o N 3584, gate_up N 37888 in slices gate, up; down K 18944 N 3584), rank 16
a slice, 8 slots of mixed ranks, bfloat16: the Triton kernels
(tuned) against the per-token reference, eagerly and replayed from a CUDA graph with other
slots written in between (no host synchronisation inside), and every candidate config."""
import pytest
import torch

from tests.gpu.conftest import cases, slow

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SHAPES = {"qkv": (3584, (3584, 512, 512)), "o": (3584, (3584,)), "gate_up": (3584, (18944, 18944)),
          "down": (18944, (3584,))}  # (K, output slices)
RANKS = (16, 8, 4, 16, 1, 12, 16, 2)  # 8 slots, R = 16, the smaller ranks zero-padded
TOL = 1.5e-2  # bf16: y enters the expand's dot rounded to bf16, out rounds once


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.fixture(scope="module")
def gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(1234)
    return g


def adapters(K, slices, gen):
    """(a [8, n 16, K], b [8, N, 16]) in bf16 over n output slices, slot i of rank RANKS[i] in
    each, the update about out's size."""
    N = sum(slices)
    a = torch.zeros(len(RANKS), len(slices) * 16, K, device="cuda")
    b = torch.zeros(len(RANKS), N, 16, device="cuda")
    for i, r in enumerate(RANKS):
        for j in range(len(slices)):
            a[i, j * 16 : j * 16 + r] = torch.randn(r, K, device="cuda", generator=gen) * K ** -0.5
        b[i, :, :r] = torch.randn(N, r, device="cuda", generator=gen) * r ** -0.5
    return a.bfloat16(), b.bfloat16()


def random_slots(T, gen, kind="mixed"):
    """int32 [T]: "mixed" every slot and -1 interleaved (decode), "runs" contiguous runs of one
    slot (prefill sequences), "one" all on slot 3, "none" all -1."""
    if kind == "one":
        return torch.full((T,), 3, dtype=torch.int32, device="cuda")
    if kind == "none":
        return torch.full((T,), -1, dtype=torch.int32, device="cuda")
    if kind == "runs":
        return ((torch.arange(T, device="cuda") // 48) % 9 - 1).to(torch.int32)
    return torch.randint(-1, len(RANKS), (T,), device="cuda", generator=gen, dtype=torch.int32)


def reference(before, x, a, b, slots, slices=None):
    from llm_kernels.lora import add_lora_reference

    ref = before.clone()
    add_lora_reference(ref, x, a, b, slots, slices)
    return ref


def check(got, before, ref, slots, what, tol=TOL):
    """Rows of slot -1 exactly as before; the update (got - before) of the others and the whole
    output within tol of the reference's."""
    assert not torch.isnan(got).any(), f"{what}: NaN (unwritten output?)"
    none = slots < 0
    assert torch.equal(got[none], before[none]), f"{what}: rows of slot -1 changed"
    used = ~none
    if used.any():
        err = rel_err(got[used].float() - before[used].float(), ref[used].float() - before[used].float())
        assert err < tol, f"{what}: update rel err {err:.3g}"
    assert rel_err(got, ref) < tol, f"{what}: rel err {rel_err(got, ref):.3g}"


@pytest.mark.parametrize("layer,T", cases(
    default=[("qkv", 1), ("gate_up", 64), ("down", 16), ("o", 256)],
    every=[(layer, T) for layer in SHAPES for T in (1, 16, 64, 256)]))
def test_add_lora_matches_reference(layer, T, gen):
    from llm_kernels.lora import add_lora

    K, slices = SHAPES[layer]
    N = sum(slices)
    a, b = adapters(K, slices, gen)
    x = torch.randn(T, K, device="cuda", generator=gen).bfloat16()
    for kind in ("mixed", "runs"):
        slots = random_slots(T, gen, kind)
        before = torch.randn(T, N, device="cuda", generator=gen).bfloat16()
        got = before.clone()
        add_lora(got, x, a, b, slots, slices)
        check(got, before, reference(before, x, a, b, slots, slices), slots, f"{layer} T={T} {kind}")


@pytest.mark.parametrize("layer,T", cases(
    default=[("gate_up", 64), ("down", 1)],
    every=[(layer, T) for layer in SHAPES for T in (1, 16, 64, 256)]))
def test_add_lora_replays_in_a_cuda_graph(layer, T, gen):
    """Captured once (after an eager call compiled and tuned it), replayed with slots, x and out
    rewritten in place: the kernels read the slots on the device only."""
    from llm_kernels.lora import add_lora

    K, slices = SHAPES[layer]
    N = sum(slices)
    a, b = adapters(K, slices, gen)
    x = torch.randn(T, K, device="cuda", generator=gen).bfloat16()
    slots = random_slots(T, gen)
    out = torch.randn(T, N, device="cuda", generator=gen).bfloat16()
    add_lora(out, x, a, b, slots, slices)  # compile and tune outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_lora(out, x, a, b, slots, slices)
    for kind in ("mixed", "one", "none", "runs", "mixed"):
        before = torch.randn(T, N, device="cuda", generator=gen).bfloat16()
        out.copy_(before)
        x.copy_(torch.randn(T, K, device="cuda", generator=gen).bfloat16())
        slots.copy_(random_slots(T, gen, kind))
        graph.replay()
        torch.cuda.synchronize()
        check(out, before, reference(before, x, a, b, slots, slices), slots, f"replayed {layer} T={T} {kind}")


@pytest.mark.parametrize("T", [1, 64, slow(256), slow(1024)])
def test_every_candidate_config(T, gen):
    """Each candidate the tuner may pick (not only its pick) computes the same, on gate_up (two
    slices) and qkv (three, k and v four 128-column tiles each)."""
    from llm_kernels.lora.configs import expand_configs, shrink_configs
    from llm_kernels.lora.triton_path import add_lora_triton

    for layer in ("gate_up", "qkv"):
        K, slices = SHAPES[layer]
        a, b = adapters(K, slices, gen)
        x = torch.randn(T, K, device="cuda", generator=gen).bfloat16()
        slots = random_slots(T, gen)
        before = torch.randn(T, sum(slices), device="cuda", generator=gen).bfloat16()
        ref = reference(before, x, a, b, slots, slices)
        for sc in shrink_configs(T, torch.bfloat16, x.device):
            for ec in expand_configs(T, torch.bfloat16, x.device):
                got = before.clone()
                add_lora_triton(got, x, a, b, slots, sc, ec, output_slices=slices)
                check(got, before, ref, slots, f"{layer} T={T} {sc} {ec}")


def test_float32_and_ranks_off_powers_of_two(gen):
    """The float32 path (ieee dots) and R = 24 (y padded to 32 columns) on the o shape, in
    float32 and in bf16."""
    from llm_kernels.lora import add_lora

    K, N, T = 3584, 3584, 40
    a = torch.randn(8, 24, K, device="cuda", generator=gen) * K ** -0.5
    b = torch.randn(8, N, 24, device="cuda", generator=gen) * 24 ** -0.5
    x = torch.randn(T, K, device="cuda", generator=gen)
    slots = random_slots(T, gen)
    before = torch.randn(T, N, device="cuda", generator=gen)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, TOL)):
        args = [t.to(dtype) for t in (x, a, b)]
        start = before.to(dtype)
        got = start.clone()
        add_lora(got, *args, slots)
        check(got, start, reference(start, *args, slots), slots, f"R=24 {dtype}", tol)
