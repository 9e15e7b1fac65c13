"""Sampled verification preserves the distribution: with an n-gram draft (p_draft = 1 on its
token), the first emitted token is distributed as the target's filtered distribution (accepted
with probability p(d), else a draw from the residual), and after an accepted draft the next
token as the next position's. Chi-square on a vocabulary of 6, thousands of verify rows at once."""
import pytest
import torch

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode import verify

# chi-square critical values at p = 0.001 by degrees of freedom
CHI2_999 = {3: 16.266, 5: 20.515}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    keep = probs > 0
    assert counts[~keep].sum() == 0, "a token of probability zero was drawn"
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def target(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    p = torch.softmax(logits / temperature, -1)
    if top_k > 0:
        p = torch.where(p >= torch.topk(p, top_k).values[-1], p, torch.zeros_like(p))
    return p / p.sum()


@pytest.mark.parametrize("temperature,top_k,draft", [(1.0, -1, 2), (0.7, 4, 0), (1.0, -1, 3)])
def test_emitted_tokens_follow_the_target_distribution(temperature, top_k, draft):
    torch.manual_seed(0)
    vocab, n = 6, 6000
    l0, l1 = torch.randn(vocab) * 1.5, torch.randn(vocab) * 1.5
    params = SamplingParams(max_tokens=8, temperature=temperature, top_k=top_k)
    seqs = []
    for i in range(n):
        seq = Sequence(f"r{i}", None, [1, 2, 3], params, 8)
        seq.spec_token_ids = [draft]
        seqs.append(seq)
    rows = verify.rows(seqs)
    assert len(rows) == 2 * n and rows[1].num_output_tokens == 1 and rows[1].output_token_ids == [draft]
    logits = torch.stack([l0, l1]).repeat(n, 1)
    runs = verify.accepted_runs(seqs, Sampler(set(), seed=1).sample(logits, rows))
    p0, p1 = target(l0, temperature, top_k), target(l1, temperature, top_k)
    first = torch.bincount(torch.tensor([r[0].token_id for r in runs]), minlength=vocab).double()
    stat, df = chi_square(first, p0.double())
    assert stat < CHI2_999[df], (stat, first / n, p0)
    accepted = [r for r in runs if len(r) == 2]
    assert all(r[0].token_id == draft for r in accepted)
    assert len(accepted) / n == pytest.approx(float(p0[draft]), abs=4 * (0.25 / n) ** 0.5)
    if p0[draft] > 0.1:  # enough accepted runs to test the bonus token's distribution
        second = torch.bincount(torch.tensor([r[1].token_id for r in accepted]), minlength=vocab).double()
        stat, df = chi_square(second, p1.double())
        assert stat < CHI2_999[df], (stat, second / len(accepted), p1)
