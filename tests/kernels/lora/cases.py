"""Inputs of the LoRA tests: adapters of mixed ranks (zero-padded to R, as the engine holds
them), tokens spread over the slots with some on none (-1), and the checks of a result."""
from __future__ import annotations

import torch
from tests.kernels.kernel_checks import TOL, rel_err

from llm_kernels.lora import add_lora_reference

RANKS = (8, 3, 16, 1, 5)  # per slot; R = 16, the others zero-padded
R = 16


def adapters(K: int, N: int, dtype, gen, ranks=RANKS, R=R, slices: int = 1):
    """(a [S, slices R, K], b [S, N, R]) with slot i of rank ranks[i] in every output slice:
    rows of a's R rows a slice and columns of b past it zero. b is scaled so that the update
    is about as large as out (it holds alpha/r)."""
    S = len(ranks)
    a = torch.zeros(S, slices * R, K)
    b = torch.zeros(S, N, R)
    for i, r in enumerate(ranks):
        for j in range(slices):
            a[i, j * R : j * R + r] = torch.randn(r, K, generator=gen) * K ** -0.5
        b[i, :, :r] = torch.randn(N, r, generator=gen) * r ** -0.5
    return a.to(dtype), b.to(dtype)


def token_slots(T: int, S: int, gen, none_share: float = 0.25) -> torch.Tensor:
    """int32 [T]: random slots in [0, S), about none_share of them -1; a prefill-like run of one
    slot in the middle when T is large (tiles of a single slot)."""
    slots = torch.randint(0, S, (T,), generator=gen)
    slots[torch.rand(T, generator=gen) < none_share] = -1
    if T >= 16:
        slots[T // 4 : T // 4 + T // 2] = 1
    return slots.to(torch.int32)


def inputs(T: int, K: int, N: int, dtype, gen, ranks=RANKS, R=R, slices: int = 1):
    """(out, x, a, b, slots) of one case: adapters of `ranks` padded to R, over `slices`
    output slices of out's N columns."""
    a, b = adapters(K, N, dtype, gen, ranks, R, slices)
    x = torch.randn(T, K, generator=gen).to(dtype)
    out = torch.randn(T, N, generator=gen).to(dtype)
    return out, x, a, b, token_slots(T, len(ranks), gen)


def ulp(t: torch.Tensor, dtype) -> torch.Tensor:
    """The spacing of dtype's numbers at each value of t (float32)."""
    _, exp = torch.frexp(t.float())
    return torch.ldexp(torch.full_like(t, torch.finfo(dtype).eps, dtype=torch.float32), exp - 1)


def term_bound(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, slices=None) -> torch.Tensor:
    """float32 [T, N]: the update made of absolute values, |x| |a[s]|^T |b[s]|^T. Rounding in
    float32 scales with it, not with the update: a row whose terms nearly cancel (a rank-1
    adapter, say) has a tiny update and the ordinary rounding of much larger terms."""
    bound = torch.zeros(x.shape[0], b.shape[1])
    add_lora_reference(bound, x.float().abs(), a.float().abs(), b.float().abs(), slots, slices)
    return bound


def check_update(got: torch.Tensor, ref: torch.Tensor, before: torch.Tensor, slots: torch.Tensor, dtype,
                 seed: int, what: str, terms: tuple | None = None) -> None:
    """Rows of slot -1 exactly as before; every element of the others' update (got - before)
    within the dtype's tolerance of its row's largest update, plus one unit in the last place
    of out (the interpreter's float32 -> bf16 cast truncates where the GPU's rounds to nearest:
    one unit is a large share of a small update), plus, given the inputs as terms (x, a, b,
    slices), 1e-6 of term_bound (float32 sums in another order: about sqrt(K) eps of it);
    the whole output within tolerance too."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, ref.shape, got.dtype, ref.dtype)
    assert not torch.isnan(got).any(), f"{what}: NaN in output (seed={seed})"
    none = slots < 0
    assert torch.equal(got[none], before[none]), f"{what}: rows of slot -1 changed (seed={seed})"
    used = ~none
    if used.any():
        d_got = got[used].float() - before[used].float()
        d_ref = ref[used].float() - before[used].float()
        allowed = TOL[dtype] * d_ref.abs().amax(dim=1, keepdim=True) + ulp(ref[used], dtype)
        if terms is not None:
            allowed = allowed + 1e-6 * term_bound(*terms[:3], slots, *terms[3:])[used]
        excess = ((d_got - d_ref).abs() - allowed).max().item()
        assert excess <= 0, f"{what}: an update off by {excess:.3g} past its allowance (seed={seed})"
    err = rel_err(got, ref)
    assert err < TOL[dtype], f"{what}: rel err {err:.3g} >= {TOL[dtype]} (seed={seed})"
