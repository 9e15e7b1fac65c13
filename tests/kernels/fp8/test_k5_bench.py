"""Benchmark K5's code paths (benchmarks/quant_formats.py) on the CPU under the interpreter, at
small shapes with a wall-clock timer: every row is formed, its kernels agree with their float32
math, and the fields the GPU run reports are there (the W8A8 ones empty without FP8 tensor cores)."""
import time

import torch

from benchmarks import quant_formats


def wall_clock(fns):
    start = time.perf_counter()
    for f in fns:
        f()
    return (time.perf_counter() - start) / len(fns)


def test_k5_rows_on_the_cpu():
    gen = torch.Generator().manual_seed(5)
    rows = quant_formats.k5((1e12, 1e14, 2e14), [1, 16, 65], shapes=[(64, 48)], device="cpu", gen=gen,
                            timer=wall_clock, fed=())
    assert [r["case"] for r in rows] == [f"fp8 64x48 M={m}" for m in (1, 16, 65)]
    assert [r["kernel"] for r in rows] == ["w8a16", "w8a16", "w8a16"]  # the interpreter runs the first
    for r in rows:
        assert not r["wrong"], r
        assert r["ratio_to_peer"] > 0 and r["ratio_to_floor"] > 0 and r["w8a16_ratio_to_cublas"] > 0
        assert r["target_peer"] == (1.3 if "M=65" not in r["case"] else 1.1)
        assert r["scaled_mm_us"] is None and r["act_quant_share"] is None and r["w8a8_us"] is None
        assert r["w8a16_config"] == "None"  # the interpreter tunes nothing: the list's first runs


def test_fed_rows_hand_the_quantization_over_where_the_step_takes_it(monkeypatch):
    """A fed shape gets a second row a token count; with W8A8 the only kernel (the interpreter's
    own list has the weight-only one) its step is handed the input's quantization."""
    from llm_kernels.fp8 import weight as fp8_weight

    gen = torch.Generator().manual_seed(6)
    rows = quant_formats.k5((1e12, 1e14, 2e14), [4], shapes=[(64, 48)], device="cpu", gen=gen, timer=wall_clock,
                            fed=[(64, 48)])
    assert [r["case"] for r in rows] == ["fp8 64x48 M=4", "fp8 64x48 M=4 fed"]
    assert rows[1]["kernel"] == "w8a16" and rows[1]["handed_over"] is False and not rows[1]["wrong"]
    assert rows[1]["peer_us"] == rows[0]["peer_us"] and rows[1]["ratio_to_peer"] > 0
    monkeypatch.setattr(fp8_weight, "candidates", lambda *a: ("w8a8",))
    monkeypatch.setattr(quant_formats, "scaled_mm_available", lambda device: False)
    rows = quant_formats.k5((1e12, 1e14, 2e14), [4], shapes=[(64, 48)], device="cpu", gen=gen, timer=wall_clock,
                            fed=[(64, 48)])
    assert rows[1]["kernel"] == "w8a8" and rows[1]["handed_over"] is True and not rows[1]["wrong"], rows[1]
