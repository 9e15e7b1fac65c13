"""benchmarks/lora.py (L2) off the GPU: its floor's bytes, the batch it times, its peer (the
per-adapter loop of torch ops, checked against the reference here so that a wrong peer cannot
flatter the kernel), and its refusal to run without CUDA."""
import sys

import pytest
import torch
from tests.kernels.lora.cases import inputs

from benchmarks import lora as bench
from llm_kernels.lora import add_lora_reference


def test_floor_counts_adapters_x_and_out_both_ways():
    K, slices = bench.LAYERS["gate_up"]
    nbytes = bench.floor_bytes(64, K, slices, 8, 16)
    assert nbytes == 2 * (8 * 16 * (2 * 3584 + 37888) + 64 * 3584 + 2 * 64 * 37888)
    assert 21e6 < nbytes < 22e6  # about 5 us at an H200's 4.25 TB/s


def test_batch_spreads_every_token_over_the_adapters():
    slots = bench.batch_slots(64, 8, torch.Generator().manual_seed(0))
    assert slots.dtype == torch.int32 and torch.bincount(slots).tolist() == [8] * 8
    assert not torch.equal(slots[:8], torch.arange(8, dtype=torch.int32))  # shuffled, not in blocks


@pytest.mark.parametrize("slices", [(52,), (30, 12, 10)], ids=["one", "qkv"])
def test_peer_loop_is_the_reference(slices, rng):
    out, x, a, b, slots = inputs(37, 40, 52, torch.float32, rng, slices=len(slices))
    ref, peer = out.clone(), out.clone()
    add_lora_reference(ref, x, a, b, slots, slices)
    bench.peer_loop(peer, x, a, b, bench.groups(slots), slices)
    assert bench.update_err(peer, out, ref) < 1e-5
    assert all(s >= 0 for s, _ in bench.groups(slots))


def test_refuses_without_cuda(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["benchmarks/lora.py", "--out", str(tmp_path / "l2.json")])
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert "CUDA" in str(exc.value.code) and not (tmp_path / "l2.json").exists()
