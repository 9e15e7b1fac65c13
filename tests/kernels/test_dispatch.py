"""Dispatch: CPU tensors take the reference unless TRITON_INTERPRET=1; kernels and
their helpers are built in the launch's mode; the tuner's choice from (fake) timings."""
import os

import pytest
import torch
import triton.language as tl

import llm_kernels.norm as norm
from llm_kernels import dispatch
from llm_kernels.dispatch import autotune, jit_helper, lazy_jit, use_triton
from tests.kernels.conftest import cfgs


def test_cpu_tensors_use_triton_only_under_interpreter(monkeypatch):
    x = torch.randn(2, 8)
    assert use_triton(x)  # the autouse fixture set TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not use_triton(x)


def test_reference_path_runs_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    launches = []
    monkeypatch.setattr(dispatch.LazyKernel, "__getitem__", lambda self, grid: launches.append(grid))
    x, w = torch.randn(3, 16), torch.randn(16)
    out = norm.rms_norm(x, w, 1e-6)
    assert not launches and torch.allclose(out, norm.rms_norm_reference(x, w, 1e-6))


@jit_helper
def _twice(x):
    return 2 * x


@lazy_jit
def _twice_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, _twice(tl.load(x_ptr + i, mask=i < N)), mask=i < N)


def _run_twice(n=5):
    x, out = torch.randn(n), torch.full((n,), float("nan"))
    _twice_kernel[(1,)](x, out, n, BLOCK=8)
    assert torch.equal(out, 2 * x)


def test_kernels_and_helpers_are_built_in_the_mode_of_each_launch(monkeypatch):
    """A compiled-mode build between two interpreted launches leaves the interpreter working:
    the kernel finds its @jit_helper in its module's globals, built in the launch's mode."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    _run_twice()
    assert isinstance(globals()["_twice"], InterpretedFunction)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _twice_kernel[(1,)]  # builds the compiled kernel (no launch, no GPU needed)
    assert isinstance(globals()["_twice"], JITFunction)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _run_twice(7)


# ---------------------------------------------------------------- the tuner, from fake timings

def test_cold_l2_times_are_net_of_the_flush(fake_gpu, name):
    """Each candidate is timed after a flush; the flush alone, timed next to each
    candidate, comes off (its median): the recorded times are the kernels' own."""
    gpu = fake_gpu({"a": 12e-6, "b": 11e-6, "c": 11.5e-6})
    best = autotune(name, (1,), cfgs("a", "b", "c"), gpu.launch, checked=("bf16",), cold_l2_device="cuda")
    assert best == {"name": "b"}
    timed = dispatch.TIMINGS[(name, 1)]
    assert [c["name"] for c, _ in timed] == ["a", "b", "c"]
    assert [round(t * 1e6, 6) for _, t in timed] == [12.0, 11.0, 11.5]
    assert dispatch.chosen(name, (1,)) == best
    assert autotune(name, (1,), lambda: pytest.fail("configs made again"), gpu.launch) == best


def test_flush_baseline_is_the_median_of_its_timings(fake_gpu, name):
    """One slow flush timing (a clock dip) moves the baseline by nothing: the median."""
    # graph_time calls alternate: flush alone, then flush + candidate
    flushes = [40e-6, 40e-6, 55e-6, 40e-6, 40e-6, 40e-6]
    gpu = fake_gpu({"a": 12e-6, "b": 11e-6, "c": 11.5e-6}, flushes=flushes)
    autotune(name, (2,), cfgs("a", "b", "c"), gpu.launch, cold_l2_device="cuda")
    assert [round(t * 1e6, 6) for _, t in dispatch.TIMINGS[(name, 2)]] == [12.0, 11.0, 11.5]


def test_hot_timings_have_no_flush(fake_gpu, name):
    gpu = fake_gpu({"a": 3e-6, "b": 2e-6})
    assert autotune(name, (3,), cfgs("a", "b"), gpu.launch) == {"name": "b"}
    assert "flush" not in gpu.log
    assert [t for _, t in dispatch.TIMINGS[(name, 3)]] == [3e-6, 2e-6]


def test_checked_configs_that_fail_or_disagree_are_left_out_and_remembered(fake_gpu, name):
    gpu = fake_gpu({"a": 5e-6, "bad": RuntimeError("ptxas"), "wrong": 1e-6, "b": 4e-6}, outputs={"wrong": 9.0})
    best = autotune(name, (4,), cfgs("a", "bad", "wrong", "b"), gpu.launch, checked=("bf16", 128))
    assert best == {"name": "b"}
    failed = {key[1]: why for key, why in dispatch.FAILED.items()}
    assert set(failed) == {(("name", "bad"),), (("name", "wrong"),)}
    assert "ptxas" in failed[(("name", "bad"),)] and "disagrees" in failed[(("name", "wrong"),)]
    assert all(key[0] == name and key[2:] == ("bf16", 128) for key in dispatch.FAILED)
    gpu.log.clear()
    autotune(name, (5,), cfgs("a", "bad", "b"), gpu.launch, checked=("bf16", 128))
    assert "bad" not in gpu.log  # remembered: not built again for another shape


def test_unchecked_config_out_of_shared_memory_times_infinite(fake_gpu, name):
    from triton.runtime.errors import OutOfResources

    gpu = fake_gpu({"a": 5e-6, "big": OutOfResources(300000, 232448, "shared memory")})
    assert autotune(name, (6,), cfgs("big", "a"), gpu.launch) == {"name": "a"}
    assert dispatch.TIMINGS[(name, 6)][0][1] == float("inf")
    gpu = fake_gpu({"a": 5e-6, "broken": RuntimeError("bug")})
    with pytest.raises(RuntimeError, match="bug"):
        autotune(name, (7,), cfgs("a", "broken"), gpu.launch)


def test_first_config_under_interpreter_and_in_a_capture_not_kept(fake_gpu, name, monkeypatch):
    gpu = fake_gpu({"a": 5e-6, "b": 1e-6})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert autotune(name, (8,), cfgs("a", "b"), gpu.launch) == {"name": "a"}
    assert dispatch.chosen(name, (8,)) is None and not gpu.log
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert autotune(name, (8,), lambda: cfgs("a", "b"), gpu.launch) == {"name": "a"}
    assert dispatch.chosen(name, (8,)) is None and not gpu.log
