"""Structured output's token masks (llm_kernels.apply_token_bitmask): the Triton kernel
(interpreted) against the reference, and both against the bit layout spelled out."""
import pytest
import torch

from llm_kernels.token_mask import allowed_tokens, apply_token_bitmask, apply_token_bitmask_reference


def random_bitmask(rows: int, vocab: int, gen: torch.Generator, density: float = 0.3) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 words [rows, ceil(vocab / 32)], the bool allowed matrix they encode)."""
    words = -(-vocab // 32)
    allowed = torch.rand(rows, words * 32, generator=gen) < density
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    packed = (allowed.view(rows, words, 32).long() * weights).sum(-1)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)  # bit 31: the sign
    return packed, allowed[:, :vocab]


@pytest.mark.parametrize("vocab", [32, 1000, 2051])
@pytest.mark.parametrize("rows", [[0], [3, 1], [0, 2, 4, 5]])
def test_banned_tokens_become_minus_inf_and_the_rest_is_untouched(vocab, rows, rng):
    logits = torch.randn(6, vocab, generator=rng)
    mask, allowed = random_bitmask(len(rows), vocab, rng)
    ref = logits.clone()
    apply_token_bitmask_reference(ref, torch.tensor(rows), mask)
    out = logits.clone()
    apply_token_bitmask(out, torch.tensor(rows), mask)  # Triton, interpreted
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    for i, row in enumerate(rows):
        assert torch.equal(torch.isinf(out[row]), ~allowed[i]), row
        assert torch.equal(out[row][allowed[i]], logits[row][allowed[i]])
    others = [r for r in range(6) if r not in rows]
    assert torch.equal(out[others], logits[others])


def test_the_bit_layout_is_token_t_in_bit_t_mod_32_of_word_t_div_32():
    mask = torch.zeros(1, 3, dtype=torch.int32)
    for t in (0, 31, 32, 70):
        mask[0, t // 32] |= torch.tensor(1 << (t % 32)).to(torch.int32)  # 1 << 31 wraps to the sign bit
    assert allowed_tokens(mask, 90)[0].nonzero().flatten().tolist() == [0, 31, 32, 70]
    logits = torch.zeros(1, 90)
    apply_token_bitmask(logits, torch.tensor([0]), mask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0, 31, 32, 70]


def test_an_all_ones_mask_changes_nothing_and_no_rows_is_a_no_op(rng):
    logits = torch.randn(2, 100, generator=rng)
    out = logits.clone()
    apply_token_bitmask(out, torch.tensor([1]), torch.full((1, 4), -1, dtype=torch.int32))
    apply_token_bitmask(out, torch.tensor([], dtype=torch.long), torch.empty(0, 4, dtype=torch.int32))
    assert torch.equal(out, logits)
