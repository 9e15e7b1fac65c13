"""The router's expert choice in one launch (llm_kernels.moe_route, interpreted) against the
PyTorch ops it replaces: the same experts in the same order, the same weights, for expert counts
that are and are not powers of two, top-1 to top-8, with and without renormalisation."""
import pytest
import torch

from llm_kernels.moe_route import select_experts, select_experts_reference


@pytest.mark.parametrize("T,E,k,renorm", [(1, 8, 2, True), (37, 8, 2, False), (50, 128, 8, True),
                                          (19, 60, 4, False), (5, 64, 1, True), (33, 3, 3, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_launch_picks_what_the_torch_ops_pick(T, E, k, renorm, dtype, rng, poisoned):
    logits = (torch.randn(T, E, generator=rng) * 3).to(dtype)
    want_w, want_ids = select_experts_reference(logits, k, renorm)
    with poisoned():
        got_w, got_ids = select_experts(logits, k, renorm)
    assert got_ids.dtype == torch.int64 and got_w.dtype == torch.float32
    if dtype == torch.float32:
        assert torch.equal(got_ids, want_ids), f"seed {rng.initial_seed()}"
    else:  # bf16 logits tie often, and torch.topk's order among equals is its own: the same probabilities
        probs = torch.softmax(logits, -1, dtype=torch.float32)
        assert torch.equal(probs.gather(1, got_ids), probs.gather(1, want_ids)), f"seed {rng.initial_seed()}"
        assert all(len(set(row)) == k for row in got_ids.tolist())
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)
    if renorm:
        torch.testing.assert_close(got_w.sum(-1), torch.ones(T), rtol=1e-6, atol=1e-6)


def test_strided_logits_and_equal_probabilities(rng):
    """A view of every other column (a router's output inside a wider tensor) reads the right
    logits; equal probabilities go to the lowest expert, each expert once."""
    wide = torch.randn(9, 32, generator=rng)
    logits = wide[:, ::2]
    want_w, want_ids = select_experts_reference(logits, 3, True)
    got_w, got_ids = select_experts(logits, 3, True)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)
    ties = torch.zeros(2, 6)
    ties[1, 4] = 1.0
    _, ids = select_experts(ties, 3, False)
    assert ids.tolist() == [[0, 1, 2], [4, 0, 1]]


def test_a_nan_row_still_names_experts_in_range():
    """A NaN logit (a broken hidden state) must not send the sort past the experts."""
    logits = torch.randn(3, 16)
    logits[1, 5] = float("nan")
    w, ids = select_experts(logits, 4, True)
    assert ((ids >= 0) & (ids < 16)).all()
    assert torch.isnan(w[1]).all() and not torch.isnan(w[[0, 2]]).any()


def test_top_k_past_the_experts_is_refused():
    with pytest.raises(ValueError, match="top_k 5 for 4 experts"):
        select_experts(torch.randn(2, 4), 5, True)
