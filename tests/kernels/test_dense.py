"""llm_kernels.dense_linear: the CPU's reduced-precision matmul at a bounded set of row
counts, with the real rows' values unchanged."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from llm_kernels.dense import EXACT_ROWS, dense_linear, padded_rows


def test_padded_rows_are_exact_when_small_and_few_an_octave():
    assert [padded_rows(m) for m in range(1, EXACT_ROWS + 1)] == list(range(1, EXACT_ROWS + 1))
    for m in range(EXACT_ROWS + 1, 9000):
        p = padded_rows(m)
        assert m <= p <= m * 9 / 8, (m, p)
    for octave in range(5, 13):  # [32, 64) .. [4096, 8192)
        counts = {padded_rows(m) for m in range(1 << octave, 1 << (octave + 1))}
        assert len(counts - {1 << (octave + 1)}) <= 8, (octave, sorted(counts))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_dense_linear_equals_f_linear_bitwise(dtype):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 40, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype)
    for m in (1, 7, 32, 33, 37, 65, 100, 129, 333, 700):
        x = torch.randn(m, 40, generator=g).to(dtype)
        for bias in (None, b):
            want = F.linear(x, w, bias)
            got = dense_linear(x, w, bias)
            assert got.shape == want.shape and got.dtype == dtype
            assert torch.equal(got, want), (m, bias is None)
    x3 = torch.randn(3, 45, 40, generator=g).to(dtype)  # leading dims are flattened and restored
    assert torch.equal(dense_linear(x3, w, b), F.linear(x3, w, b))


MEMORY_SCRIPT = r"""
import random, torch
from llm_kernels.dense import dense_linear
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
w = torch.randn(256, 64, dtype=torch.bfloat16)
rng = random.Random(0)
for m in range(1, 400):  # warm every bucket below 400 rows and the allocator
    dense_linear(torch.randn(m, 64, dtype=torch.bfloat16), w)
start = rss_mb()
for _ in range(1500):  # ~1,500 distinct row counts up to 3,000
    dense_linear(torch.randn(rng.randint(400, 3000), 64, dtype=torch.bfloat16), w)
print(rss_mb() - start)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmRSS from /proc")
def test_memory_stays_bounded_over_many_row_counts():
    # F.linear in bfloat16 on the CPU kept ~0.3 MB per distinct row count (~400 MB
    # for these); the buckets between 400 and 3,000 rows are 26 shapes
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": root}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    growth = float(out.stdout.strip().splitlines()[-1])
    assert growth < 40, growth
