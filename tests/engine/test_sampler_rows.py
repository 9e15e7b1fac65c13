"""The sampler draws every sampled row of a step in one pass, each row through its own
temperature, top-k, top-p and min-p: in a batch mixing them (and greedy rows), each row's
tokens follow its own filtered distribution (chi-square, vocabulary of 6), and a seeded
request draws the same tokens whatever else is in its batch."""
import pytest
import torch

from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from tests.engine.spec_decode.test_rejection import CHI2_999, chi_square

VOCAB = 6
KINDS = {
    "plain": dict(temperature=1.0),
    "cool top-k 2": dict(temperature=0.7, top_k=2),
    "top-p 0.6": dict(temperature=1.0, top_p=0.6),
    "min-p 0.3": dict(temperature=1.3, min_p=0.3),
    "all three": dict(temperature=0.9, top_k=4, top_p=0.8, min_p=0.1),
}


def expected(logits: torch.Tensor, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0) -> torch.Tensor:
    """The filtered distribution, one row, written independently of the sampler."""
    p = torch.softmax(logits.double() / temperature, -1)
    keep = torch.ones(VOCAB, dtype=torch.bool)
    order = torch.argsort(p, descending=True)
    if top_k > 0:
        keep[order[top_k:]] = False
    q = torch.where(keep, p, 0) / torch.where(keep, p, 0).sum()
    if top_p < 1.0:
        before = 0.0
        for t in order.tolist():  # keep while the mass before the token is within top_p
            if keep[t]:
                keep[t] = before <= top_p
                before += float(q[t])
    q = torch.where(keep, p, 0) / torch.where(keep, p, 0).sum()
    if min_p > 0:
        keep &= q >= min_p * q.max()
    q = torch.where(keep, p, 0)
    return q / q.sum()


def seqs_for(params: list[SamplingParams]) -> list[Sequence]:
    return [Sequence(f"r{i}", None, [1, 2, 3], p, 8) for i, p in enumerate(params)]


def test_a_mixed_batch_gives_each_row_its_own_distribution():
    torch.manual_seed(0)
    logits = torch.randn(VOCAB) * 1.5
    per_kind, kinds = 3000, list(KINDS)
    params = [SamplingParams(max_tokens=8, **KINDS[kinds[i % len(kinds)]]) for i in range(per_kind * len(kinds))]
    params += [SamplingParams(max_tokens=8, temperature=0)] * 50  # greedy rows in the same batch
    seqs = seqs_for(params)
    samples = Sampler(set(), seed=3).sample(logits.repeat(len(seqs), 1), seqs)
    tokens = torch.tensor([s.token_id for s in samples])
    assert (tokens[-50:] == logits.argmax()).all()
    for k, kind in enumerate(kinds):
        got = torch.bincount(tokens[k:per_kind * len(kinds):len(kinds)], minlength=VOCAB).double()
        stat, df = chi_square(got, expected(logits, **KINDS[kind]))
        assert stat < CHI2_999.get(df, 30.0), (kind, stat, got / per_kind, expected(logits, **KINDS[kind]))


@pytest.mark.parametrize("kind", ["plain", "all three"])
def test_a_seeded_request_draws_the_same_tokens_in_any_batch(kind):
    torch.manual_seed(1)
    logits = torch.randn(5, VOCAB)
    seeded = SamplingParams(max_tokens=8, seed=7, **KINDS[kind])

    def draws(others: list[SamplingParams]) -> list[int]:
        seqs = seqs_for(others + [seeded])
        sampler = Sampler(set(), seed=len(others))
        out = []
        for step in range(5):  # the seeded request's generator carries from step to step
            rows = logits[step].repeat(len(seqs), 1)
            out.append(sampler.sample(rows, seqs)[-1].token_id)
        return out

    alone = draws([])
    assert draws([SamplingParams(max_tokens=8, temperature=1.0)] * 7) == alone
    assert draws([SamplingParams(max_tokens=8, temperature=0.5, top_p=0.5), SamplingParams(max_tokens=8, seed=9)]) == alone
