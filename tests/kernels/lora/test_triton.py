"""The LoRA Triton kernels (shrink, then expand; llm_kernels.lora.kernels) run by the
interpreter on CPU tensors against the per-token reference: several slots, tokens on none,
mixed ranks, float32 and bfloat16 (the interpreter's dots run in float32: its bf16 dot is
broken, so bf16 here proves the loads, masks and roundings and the GPU test the bf16 dot), one
token and a prefill's 37, K and N off the block sizes, K split or not."""
import pytest
import torch
from tests.kernels.lora.cases import check_update, inputs

from llm_kernels.lora import add_lora, add_lora_reference
from llm_kernels.lora.configs import shrink_configs, token_bucket
from llm_kernels.lora.kernels import REDUCE_FLOATS, block_r, shrink_grid, shrink_units, slot_groups
from llm_kernels.lora.onehot import slots_per_chunk
from llm_kernels.lora.triton_path import add_lora_triton, counters, tuning_slots

K, N = 72, 100  # off every block size of the interpreter's configs (16, 32, 64)
# (shrink, expand): K split 3 ways (the workspace and its last-arrival sum), a program per slot
# of a tile; no split, wider tiles, one program walking all of a tile's slots; two programs a
# tile, each walking every other slot; the one-dot kernels (llm_kernels.lora.onehot) with the
# slots in chunks of two (a loop over chunks, the last one part past S) and in one chunk
CONFIGS = [({"BM": 16, "BK": 32, "split": 3}, {"BM": 16, "BN": 32}),
           ({"BM": 32, "BK": 16, "split": 1, "slots": 1}, {"BM": 32, "BN": 64, "slots": 1}),
           ({"BM": 16, "BK": 32, "split": 2, "slots": 2}, {"BM": 16, "BN": 32, "slots": 2}),
           ({"kind": "onehot", "BM": 16, "BK": 32, "split": 2, "cols": 32}, {"kind": "onehot", "BM": 16, "BN": 32, "cols": 32}),
           ({"kind": "onehot", "BM": 32, "BK": 16, "split": 1, "cols": 128},
            {"kind": "onehot", "BM": 32, "BN": 64, "cols": 256})]
IDS = ["split3-all", "nosplit-walk", "split2-pairs", "onehot-chunks", "onehot-one-dot"]


def reference(out, x, a, b, slots, output_slices=None):
    ref = out.clone()
    add_lora_reference(ref, x, a, b, slots, output_slices)
    return ref


def block_diagonal(b, slices):
    """b [S, N, R] of output slices as the one-slice b [S, N, n R] it stands for: slice i's
    rows in rank columns i R ... (i + 1) R, zeros elsewhere."""
    S, N, R = b.shape
    full = torch.zeros(S, N, len(slices) * R, dtype=b.dtype)
    col = 0
    for i, n in enumerate(slices):
        full[:, col : col + n, i * R : (i + 1) * R] = b[:, col : col + n]
        col += n
    return full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_kernels_match_reference(T, dtype, cfg, rng, poisoned):
    out, x, a, b, slots = inputs(T, K, N, dtype, rng)
    ref = reference(out, x, a, b, slots)
    got = out.clone()
    with poisoned():  # y and the split workspace start as NaN: every element read was written
        add_lora_triton(got, x, a, b, slots, *cfg)
    check_update(got, ref, out, slots, dtype, rng.initial_seed(), f"lora kernels T={T} {cfg[0]}",
                 terms=(x, a, b))


SLICES = [(60, 24, 16), (37, 63)]  # q, k, v and gate, up alike: off the N tiles, one narrower than a tile


@pytest.mark.parametrize("T", [1, 37])
@pytest.mark.parametrize("slices", SLICES, ids=["qkv", "gate_up"])
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_output_slices_each_take_their_own_ranks(T, slices, cfg, rng, poisoned):
    """A merged linear's slices: slice i's columns from y's rank columns i R ... (i + 1) R and
    b's R columns; the same update as the reference and as one slice over the block-diagonal
    b it stands for."""
    out, x, a, b, slots = inputs(T, K, N, torch.float32, rng, slices=len(slices))
    ref = reference(out, x, a, b, slots, slices)
    assert torch.allclose(ref, reference(out, x, a, block_diagonal(b, slices), slots), rtol=1e-5, atol=1e-5)
    got = out.clone()
    with poisoned():
        add_lora_triton(got, x, a, b, slots, *cfg, output_slices=slices)
    check_update(got, ref, out, slots, torch.float32, rng.initial_seed(), f"slices {slices} T={T} {cfg[1]}",
                 terms=(x, a, b, slices))
    whole = out.clone()
    add_lora_triton(whole, x, a, block_diagonal(b, slices), slots, *cfg)
    check_update(got, whole, out, slots, torch.float32, rng.initial_seed(), f"slices {slices} against one",
                 terms=(x, a, b, slices))


def test_public_call_runs_the_kernels_under_the_interpreter(rng, monkeypatch):
    """add_lora on CPU tensors takes the Triton path here (the first configs: no tuning)."""
    from llm_kernels.lora import apply

    ran = []
    monkeypatch.setattr(apply, "add_lora_triton", lambda *args, **kw: ran.append(1) or add_lora_triton(*args, **kw))
    out, x, a, b, slots = inputs(20, K, N, torch.bfloat16, rng)
    ref = reference(out, x, a, b, slots)
    got = out.clone()
    add_lora(got, x, a, b, slots)
    assert ran
    check_update(got, ref, out, slots, torch.bfloat16, rng.initial_seed(), "add_lora interpreted",
                 terms=(x, a, b))


@pytest.mark.parametrize("ranks", [(12, 7, 1), (20, 3)], ids=["R12", "R20"])
def test_ranks_off_powers_of_two(ranks, rng):
    """R = 12 pads to 16 columns of y, R = 20 to 32: the pad is masked in both kernels."""
    R = max(ranks)
    out, x, a, b, slots = inputs(23, K, N, torch.float32, rng, ranks=ranks, R=R)
    assert block_r(R) == (16 if R <= 16 else 32)
    ref = reference(out, x, a, b, slots)
    got = out.clone()
    add_lora_triton(got, x, a, b, slots, *CONFIGS[0])
    check_update(got, ref, out, slots, torch.float32, rng.initial_seed(), f"ranks {ranks}",
                 terms=(x, a, b))


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3]], ids=["walk", "onehot"])
def test_no_adapter_anywhere_and_out_of_range_slots(cfg, rng):
    """All -1: out untouched. Slots outside [0, S) count as none on the kernels (a kernel
    cannot raise; an unchecked slot would read past the adapters)."""
    out, x, a, b, slots = inputs(19, K, N, torch.float32, rng)
    got = out.clone()
    add_lora_triton(got, x, a, b, torch.full_like(slots, -1), *cfg)
    assert torch.equal(got, out)
    S = a.shape[0]
    wild = slots.clone()
    wild[::3] = S + 2
    ref = reference(out, x, a, b, torch.where(wild >= S, -1, wild))
    got = out.clone()
    add_lora_triton(got, x, a, b, wild.to(torch.int64), *cfg)
    check_update(got, ref, out, torch.where(wild >= S, -1, wild), torch.float32, rng.initial_seed(), "wild slots",
                 terms=(x, a, b))


def test_split_counters_are_left_at_zero_and_results_repeat(rng):
    """The last program of a tile resets its arrival counter: a second launch sums the same
    partials in the same order (bitwise the same result)."""
    out, x, a, b, slots = inputs(37, K, N, torch.float32, rng)
    first, second = out.clone(), out.clone()
    add_lora_triton(first, x, a, b, slots, *CONFIGS[0])
    assert not counters(x.device, 1).any()
    add_lora_triton(second, x, a, b, slots, *CONFIGS[0])
    assert torch.equal(first, second)


def test_strided_views(rng):
    """out a column slice of a wider output (as of a fused qkv projection), x a strided view."""
    out, x, a, b, slots = inputs(21, K, N, torch.float32, rng)
    wide = torch.randn(21, N + 30, generator=rng)
    wide[:, 10 : 10 + N] = out
    xs = torch.randn(21, 2 * K, generator=rng)
    xs[:, ::2] = x
    ref = reference(out, x, a, b, slots)
    add_lora_triton(wide[:, 10 : 10 + N], xs[:, ::2], a, b, slots, *CONFIGS[1])
    check_update(wide[:, 10 : 10 + N], ref, out, slots, torch.float32, rng.initial_seed(), "strided out",
                 terms=(x, a, b))
    t_out = out.t().contiguous().t()  # columns strided: computed densely, copied back
    add_lora_triton(t_out, x, a, b, slots, *CONFIGS[1])
    check_update(t_out, ref, out, slots, torch.float32, rng.initial_seed(), "column-major out",
                 terms=(x, a, b))


def test_grid_and_keys():
    """Slot programs per tile up to the distinct slots it can hold; K splits cover K in whole
    BLOCK_K steps with none empty, a (tile, group)'s partials within what its last program loads
    at once; token counts share keys up to a cap."""
    assert [slot_groups({"BM": 16}, 8, T) for T in (1, 5, 64)] == [1, 5, 8]
    assert slot_groups({"BM": 16, "slots": 2}, 8, 64) == 2 and slot_groups({"BM": 16}, 32, 64) == 16
    for K_, br, groups, cfg, sms, T in [(3584, 16, 1, {"BM": 16, "BK": 64, "waves": 2}, 132, 1),
                                        (72, 16, 5, {"BM": 16, "BK": 32, "split": 3}, 4, 37),
                                        (18944, 16, 1, {"BM": 64, "BK": 128, "waves": 1}, 132, 4096),
                                        (18944, 64, 8, {"BM": 16, "BK": 64, "waves": 4}, 132, 64),
                                        (100, 16, 2, {"BM": 16, "BK": 64, "split": 9}, 4, 5)]:
        tiles, split, per = shrink_grid(T, K_, br, groups, cfg, sms)
        assert tiles == -(-T // cfg["BM"]) and per % cfg["BK"] == 0
        assert (split - 1) * per < K_ <= split * per
        assert split * cfg["BM"] * br <= REDUCE_FLOATS
    assert shrink_grid(1, 3584, 16, 1, {"BM": 16, "BK": 64, "waves": 2}, 132)[1] == 28  # capped at 32: 2 steps each
    assert shrink_grid(64, 3584, 16, 8, {"BM": 16, "BK": 64, "waves": 2}, 132)[1] == 8  # 4 tiles x 8 slots x 8
    assert [token_bucket(t) for t in (1, 3, 64, 65, 5000)] == [1, 4, 64, 128, 1024]
    # the one-dot shrink counts in per (tile, chunk of slots): at most S chunks a tile
    assert shrink_units({"kind": "onehot", "BM": 16}, 8, 37) == 3 * 8 and shrink_units({"BM": 16}, 8, 37) == 3 * 8
    assert slots_per_chunk({"cols": 64}, 8, 64) == 1 and slots_per_chunk({"cols": 512}, 5, 16) == 8
    assert shrink_configs(1, torch.float32, torch.device("cpu"))[0]["split"] > 1  # the interpreter splits K
    assert tuning_slots(10, 3, torch.device("cpu")).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    assert tuning_slots(300, 16, torch.device("cpu"))[[0, 63, 64, 299]].tolist() == [0, 0, 1, 4]


def test_tuning_times_inputs_of_its_own(rng, monkeypatch, poisoned):
    """The tuner's launches (here run once per candidate, as its agreement check does) use
    synthetic slots, a y and an out of their own: a warm-up call without any adapter still
    gives every candidate real work, and the caller's out sees only the call itself."""
    from llm_kernels.lora import triton_path

    seen = {}

    def every_candidate(name, key, configs, launch, **_):
        cands = configs() if callable(configs) else configs
        seen[name] = [launch(cfg).float().clone() for cfg in cands]
        return cands[0]

    monkeypatch.setattr(triton_path, "autotune", every_candidate)
    out, x, a, b, _ = inputs(20, K, N, torch.float32, rng)
    got = out.clone()
    with poisoned():  # the call's own y: NaN where no row wrote it (all of it here)
        add_lora_triton(got, x, a, b, torch.full((20,), -1, dtype=torch.int32))
    assert torch.equal(got, out)
    assert set(seen) == {"lora_shrink", "lora_expand"}
    for name, outs in seen.items():
        assert len(outs) == 4 and all(torch.isfinite(o).all() and o.abs().sum() > 0 for o in outs), name
        for o in outs[1:]:
            torch.testing.assert_close(o, outs[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("sms", [1, 64], ids=["one-split", "bound-splits"])
def test_a_split_bound_above_the_launch_split(sms, rng):
    """The compiled kernel holds room for the config's most K splits (split_p2), whatever this
    launch splits: with one split (no workspace, the direct store) and with the bound's five,
    both launches of one kernel, the update is the reference's."""
    from llm_kernels.lora.kernels import launch_expand, launch_shrink, split_p2

    cfg = {"BM": 16, "BK": 16, "waves": 1}  # K 72: 5 steps of 16, so at most 5 splits (8 partial slots)
    assert split_p2(K, 16, cfg) == 8
    out, x, a, b, slots = inputs(37, K, N, torch.float32, rng)
    tiles, split, _ = shrink_grid(37, K, 16, slot_groups(cfg, a.shape[0], 37), cfg, sms)
    assert split == (1 if sms == 1 else 5)
    y = launch_shrink(x, a, slots, cfg, sms, counters(x.device, shrink_units(cfg, a.shape[0], 37)), True)
    got = launch_expand(y, b, slots, out.clone(), {"BM": 16, "BN": 32}, True, (N,))
    check_update(got, reference(out, x, a, b, slots), out, slots, torch.float32, rng.initial_seed(),
                 f"{split} of at most 5 splits", terms=(x, a, b))
    assert not counters(x.device, 1).any()


def test_one_compiled_kernel_for_every_prefill_length(monkeypatch):
    """A prefill of any length runs the kernels compiled at start-up: the constexprs a launch
    passes do not change with the token count T (before, the shrink's partial slots followed
    this launch's K split, and a new length could compile a kernel, and stall every request in
    the step, mid-serving), and no kernel specialises on T (Triton compiles again when an
    integer argument starts or stops dividing by 16)."""
    from llm_kernels.lora import kernels, onehot
    from llm_kernels.lora.configs import expand_configs

    for kernel in (kernels._shrink_kernel, kernels._expand_kernel, onehot._shrink_onehot_kernel,
                   onehot._expand_onehot_kernel):
        assert "T" in kernel.jit_kwargs.get("do_not_specialize", ()), kernel.fn.__name__
    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def run(*args, **constexprs):
                launches.append((self.name, tuple(sorted(constexprs.items()))))
            return run

    for name in ("_shrink_kernel", "_expand_kernel"):
        monkeypatch.setattr(kernels, name, Recorder(name))
    for name in ("_shrink_onehot_kernel", "_expand_onehot_kernel"):
        monkeypatch.setattr(onehot, name, Recorder(name))
    cuda = torch.device("cuda")  # the GPU's candidate lists (nothing runs)
    S = 8
    for K_, slices in ((3584, (3584, 512, 512)), (3584, (18944, 18944)), (18944, (3584,))):
        a = torch.empty(S, 16 * len(slices), K_, dtype=torch.bfloat16, device="meta")
        b = torch.empty(S, sum(slices), 16, dtype=torch.bfloat16, device="meta")
        for cfgs, bucket in ((shrink_configs(700, torch.bfloat16, cuda), "prefill"),
                             (shrink_configs(50, torch.bfloat16, cuda), "decode")):
            for cfg in cfgs:
                seen = set()
                for T in ((513, 600, 1102, 1118, 4000, 8192) if bucket == "prefill" else (17, 50, 64, 100)):
                    launches.clear()
                    x = torch.empty(T, K_, dtype=torch.bfloat16, device="meta")
                    slots = torch.empty(T, dtype=torch.int32, device="meta")
                    shrink = onehot.launch_shrink_onehot if cfg.get("kind") == "onehot" else kernels.launch_shrink
                    shrink(x, a, slots, cfg, 132, None, False)
                    seen.add(launches[0])
                assert len(seen) == 1, (K_, cfg, seen)
        for cfg in expand_configs(700, torch.bfloat16, cuda) + expand_configs(50, torch.bfloat16, cuda):
            seen = set()
            for T in (17, 50, 513, 1118, 8192):
                launches.clear()
                y = torch.empty(T, 16, dtype=torch.float32, device="meta")
                out = torch.empty(T, sum(slices), dtype=torch.bfloat16, device="meta")
                slots = torch.empty(T, dtype=torch.int32, device="meta")
                expand = onehot.launch_expand_onehot if cfg.get("kind") == "onehot" else kernels.launch_expand
                expand(y, b, slots, out, cfg, False, slices)
                seen.add(launches[0])
            assert len(seen) == 1, (K_, cfg, seen)
