"""The CPU path of add_lora (llm_kernels.lora.cpu, what add_lora runs on CPU tensors outside
the interpreter) against the per-token reference: several slots, tokens on none, mixed ranks,
float32 and bfloat16, decode and prefill token counts."""
import pytest
import torch
from tests.kernels.lora.cases import check_update, inputs

from llm_kernels import add_lora as top_level_add_lora
from llm_kernels.lora import add_lora, add_lora_cpu, add_lora_reference


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 37, 130])
def test_cpu_path_matches_reference(T, dtype, rng):
    K, N = 72, 100
    out, x, a, b, slots = inputs(T, K, N, dtype, rng)
    ref = out.clone()
    add_lora_reference(ref, x, a, b, slots)
    got = out.clone()
    add_lora(got, x, a, b, slots)
    check_update(got, ref, out, slots, dtype, rng.initial_seed(), f"add_lora cpu T={T}", terms=(x, a, b))


@pytest.mark.parametrize("slices", [(60, 24, 16), (50, 50)], ids=["qkv", "gate_up"])
@pytest.mark.parametrize("T", [1, 37])
def test_output_slices_match_reference(T, slices, rng):
    """Each output slice on its own rank rows of a and b's R columns, bf16."""
    out, x, a, b, slots = inputs(T, 72, 100, torch.bfloat16, rng, slices=len(slices))
    ref = out.clone()
    add_lora_reference(ref, x, a, b, slots, slices)
    got = out.clone()
    add_lora(got, x, a, b, slots, output_slices=slices)
    check_update(got, ref, out, slots, torch.bfloat16, rng.initial_seed(), f"add_lora cpu slices {slices}",
                 terms=(x, a, b, slices))


def test_one_slot_for_all_tokens_and_none_at_all(rng):
    """The whole batch on one adapter (no gather), and a batch on none (out untouched)."""
    out, x, a, b, _ = inputs(9, 40, 24, torch.float32, rng)
    for slots in (torch.full((9,), 2, dtype=torch.int32), torch.full((9,), -1, dtype=torch.int32)):
        ref, got = out.clone(), out.clone()
        add_lora_reference(ref, x, a, b, slots)
        add_lora_cpu(got, x, a, b, slots)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, out)


def test_empty_batch_and_the_package_export(rng):
    out, x, a, b, slots = inputs(0, 16, 8, torch.float32, rng)
    add_lora(out, x, a, b, slots)
    assert top_level_add_lora is add_lora


def test_update_is_linear_in_b(rng):
    """b carries alpha/r: doubling it doubles the update."""
    out, x, a, b, slots = inputs(11, 32, 20, torch.float32, rng)
    once, twice = out.clone(), out.clone()
    add_lora(once, x, a, b, slots)
    add_lora(twice, x, a, 2 * b, slots)
    torch.testing.assert_close(twice - out, 2 * (once - out), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", ["x_rows", "b_rank", "dtype", "float_slots", "flat_out", "slices_sum",
                                 "slices_rank", "four_slices", "empty_slice"])
def test_mismatched_arguments_are_refused(bad, rng):
    out, x, a, b, slots = inputs(4, 16, 8, torch.float32, rng)
    slices = None
    if bad == "slices_sum":
        slices, match = (4, 3), "output_slices"
    elif bad == "slices_rank":  # two slices want a of 2 R rows
        slices, match = (4, 4), "output_slices"
    elif bad == "four_slices":
        slices, match = (2, 2, 2, 2), "output_slices"
    elif bad == "empty_slice":
        slices, match = (8, 0), "output_slices"
    if slices is not None:
        with pytest.raises(ValueError, match=match):
            add_lora(out, x, a, b, slots, output_slices=slices)
        return
    if bad == "x_rows":
        x = x[:3]
    elif bad == "b_rank":
        b = b[:, :, :4]
    elif bad == "dtype":
        x = x.to(torch.bfloat16)
    elif bad == "float_slots":
        slots = slots.float()
    else:
        out = out.reshape(-1)
    with pytest.raises(ValueError, match="add_lora"):
        add_lora(out, x, a, b, slots)
