"""logits_summary: the Triton kernel (interpreted) against the reference, with a
small BLOCK so that the loop over the vocabulary runs several times."""
import pytest
import torch

import llm_kernels.sampling as sampling
from llm_kernels import logits_summary
from llm_kernels.sampling import logits_summary_reference

INF, NAN = float("inf"), float("nan")


def check_against_reference(x, out, seed, rows=None):
    """tokens exact, lse and the log-probability close, the finite flag exact;
    rows: the rows to compare values on (all by default)."""
    tokens, packed, lse = out
    ref_tokens, ref_packed, ref_lse = logits_summary_reference(x)
    S = x.shape[0]
    assert tokens.shape == (S,) and tokens.dtype == torch.int64
    assert packed.shape == (S, 3) and packed.dtype == torch.float64 and packed.is_contiguous()
    assert lse.shape == (S,) and lse.dtype == torch.float32
    assert torch.equal(packed[:, 2], ref_packed[:, 2]), f"finite flags (seed={seed})"
    rows = list(range(S)) if rows is None else rows
    msg = f"seed={seed}"
    assert tokens[rows].tolist() == ref_tokens[rows].tolist(), msg
    assert torch.equal(packed[rows, 0], ref_tokens[rows].double()), msg
    torch.testing.assert_close(lse[rows], ref_lse[rows], rtol=1e-5, atol=1e-5, equal_nan=True, msg=msg)
    torch.testing.assert_close(packed[rows, 1], ref_packed[rows, 1], rtol=1e-5, atol=2e-5, equal_nan=True,
                               msg=msg)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("S,V,block", [(1, 1000, 256), (5, 4999, 512), (3, 4096, 1024), (2, 300, 1024)])
def test_matches_reference(dtype, S, V, block, rng, poisoned):
    x = (4 * torch.randn(S, V, generator=rng)).to(dtype)  # half types round into ties too
    with poisoned():
        out = logits_summary(x, block=block)
    check_against_reference(x, out, rng.initial_seed())
    assert torch.all(out[1][:, 2] == 1.0)


def test_default_block_on_a_full_vocabulary(rng, poisoned):
    x = (5 * torch.randn(2, 151936, generator=rng)).to(torch.bfloat16)
    x[1, 151935] = 40.0  # the max in the last, partial chunk
    with poisoned():
        out = logits_summary(x)
    check_against_reference(x, out, rng.initial_seed())
    assert out[0][1].item() == 151935


# columns given the row's max, with BLOCK = 256: the first one must win
TIES = {
    "one chunk, two lanes": [3, 100],
    "same lane, later chunk": [50, 50 + 256],
    "later chunk, lower lane": [250, 256 + 4],
    "three chunks": [900, 20, 1500],
    "first and last column": [0, 1999],
    "in the last, partial chunk": [1990, 1998],
    "every column of a chunk": list(range(512, 768)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ties_first_index_wins(dtype, rng, poisoned):
    V = 2000
    x = torch.randn(len(TIES), V, generator=rng).to(dtype)  # all under 10
    for row, cols in enumerate(TIES.values()):
        x[row, cols] = 10.0
    with poisoned():
        tokens, packed, lse = logits_summary(x, block=256)
    first = [min(cols) for cols in TIES.values()]
    assert logits_summary_reference(x)[0].tolist() == first  # torch.argmax keeps the first
    assert dict(zip(TIES, tokens.tolist())) == dict(zip(TIES, first))
    check_against_reference(x, (tokens, packed, lse), rng.initial_seed())


def test_equal_maxima_in_a_row_of_constants(poisoned):
    x = torch.full((3, 1000), 2.5)
    x[1, 700:] = 3.0
    x[2] = -1e30
    with poisoned():
        out = logits_summary(x, block=128)
    assert out[0].tolist() == [0, 700, 0]
    check_against_reference(x, out, 0)


def nonfinite_rows(V, gen):
    """(name, row, holds NaN) for rows of non-finite entries."""
    def base():
        return torch.randn(V, generator=gen)

    def put(cols, value, row=None):
        row = base() if row is None else row
        row[cols] = value
        return row

    return [
        ("finite", base(), False),
        ("one NaN", put([777], NAN), True),
        ("NaN beside the max", put([5], NAN, put([6], 50.0)), True),
        ("all NaN", torch.full((V,), NAN), True),
        ("one +inf", put([1234], INF), False),
        ("two +inf", put([2100, 300], INF), False),
        ("+inf and NaN", put([40], NAN, put([10], INF)), True),
        ("one -inf", put([0], -INF), False),
        ("banned columns", put(list(range(0, V, 3)), -INF), False),
        ("all -inf", torch.full((V,), -INF), False),
        ("-inf prefix over chunks", put(slice(0, 2 * 256 + 17), -INF), False),
        ("-inf but one", put([1500], 10.0, put(slice(None), -INF)), False),
        ("-inf and +inf", put([7], INF, put(slice(0, 600), -INF)), False),
        ("huge finite", put([999], 3e38, put([998], -3e38)), False),
    ]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf in rows of inf
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nonfinite_rows(dtype, rng, poisoned):
    V = 2500
    rows = nonfinite_rows(V, rng)
    x = torch.stack([row for _, row, _ in rows]).to(dtype)
    with poisoned():
        tokens, packed, lse = logits_summary(x, block=256)
    names = [name for name, _, _ in rows]
    finite = {name: flag for name, flag in zip(names, packed[:, 2].tolist())}
    assert finite == {name: (1.0 if name in ("finite", "huge finite") else 0.0) for name in names}
    assert ((tokens >= 0) & (tokens < V)).all(), tokens  # also in NaN rows: a usable token
    assert torch.equal(packed[:, 0], tokens.double())
    no_nan = [i for i, (_, _, has_nan) in enumerate(rows) if not has_nan]
    check_against_reference(x, (tokens, packed, lse), rng.initial_seed(), rows=no_nan)
    nan_rows = [i for i in range(len(rows)) if i not in no_nan]  # NaN read as -inf there
    as_ninf = torch.where(x[nan_rows].isnan(), -INF, x[nan_rows].float())
    ref_tokens, _, ref_lse = logits_summary_reference(as_ninf)
    assert tokens[nan_rows].tolist() == ref_tokens.tolist()
    torch.testing.assert_close(lse[nan_rows], ref_lse, rtol=1e-5, atol=1e-5)
    by_name = dict(zip(names, zip(tokens.tolist(), lse.tolist())))
    assert by_name["all -inf"] == (0, -INF)
    assert by_name["two +inf"] == (300, INF)
    assert by_name["-inf but one"] == (1500, 10.0)


def test_strided_rows(rng, poisoned):
    base = torch.randn(6, 3000, generator=rng)
    x = base[1:5, 100:2700]  # a slice of a wider tensor: row stride 3000
    x[2, 5] = 9.0
    x[2, 2599] = 9.0
    assert x.stride() == (3000, 1)
    with poisoned():
        out = logits_summary(x, block=512)
    check_against_reference(x, out, rng.initial_seed())
    assert out[0][2].item() == 5
    bf = base.to(torch.bfloat16)[::2, :2900]  # every other row: stride 6000
    with poisoned():
        out = logits_summary(bf, block=512)
    check_against_reference(bf, out, rng.initial_seed())


def test_packed_prefix_is_contiguous(rng):
    x = torch.randn(5, 700, generator=rng)
    tokens, packed, lse = logits_summary(x, block=128)
    for n in range(6):
        assert packed[:n].is_contiguous()
    assert packed.stride() == (3, 1)
    assert torch.equal(packed[:, 0].long(), tokens)


def test_no_rows_returns_empty_without_a_launch(monkeypatch):
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError(f"launched with grid {grid}")

    monkeypatch.setattr(sampling, "_logits_summary_kernel", NoLaunch())
    for dtype in (torch.float32, torch.bfloat16):
        tokens, packed, lse = logits_summary(torch.empty(0, 1000, dtype=dtype))
        assert tokens.shape == (0,) and tokens.dtype == torch.int64
        assert packed.shape == (0, 3) and packed.dtype == torch.float64
        assert lse.shape == (0,) and lse.dtype == torch.float32


def test_cpu_path_is_the_reference(monkeypatch, rng):
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(sampling, "_launch", lambda *a: pytest.fail("the kernel ran on CPU"))
    x = torch.randn(3, 500, generator=rng).to(torch.bfloat16)
    x[1, 3] = NAN
    tokens, packed, lse = logits_summary(x)
    x32 = x.float()
    assert torch.equal(tokens, x32.argmax(-1))
    torch.testing.assert_close(lse, torch.logsumexp(x32, -1), rtol=0, atol=0, equal_nan=True)
    assert packed[:, 2].tolist() == [1.0, 0.0, 1.0]
    logprob = torch.log_softmax(x32, -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(packed[[0, 2], 1], logprob[[0, 2]].double(), rtol=1e-6, atol=1e-6)
