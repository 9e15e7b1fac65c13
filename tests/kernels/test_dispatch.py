"""Dispatch: CPU tensors take the reference unless TRITON_INTERPRET=1."""
import torch

import kernels.norm as norm
from kernels._dispatch import use_triton


def test_cpu_tensors_use_triton_only_under_interpreter(monkeypatch):
    x = torch.randn(2, 8)
    assert use_triton(x)  # the autouse fixture set TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not use_triton(x)


def test_reference_path_runs_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    calls = []
    monkeypatch.setattr(norm, "_launch", lambda *a: calls.append(a))
    x, w = torch.randn(3, 16), torch.randn(16)
    out = norm.rms_norm(x, w, 1e-6)
    assert not calls and torch.allclose(out, norm.rms_norm_reference(x, w, 1e-6))
