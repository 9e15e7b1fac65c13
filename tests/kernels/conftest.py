"""Kernel tests run the Triton kernels under the interpreter on CPU tensors.

TRITON_INTERPRET is set per test (llm_kernels/ builds its kernels at launch, so
the import order of the suite does not matter) and unset afterwards, so the
rest of a one-process suite keeps the plain reference path.
"""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield


@pytest.fixture
def rng():
    """A generator with a fresh seed per test (rng.initial_seed() in messages)."""
    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator().manual_seed(seed)
    return gen


@pytest.fixture
def poisoned(monkeypatch):
    """Inside `with poisoned():`, torch.empty / empty_like return NaN-filled
    (or extreme-integer) memory, so elements a kernel fails to write show up."""
    import contextlib

    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(t):
        if t.is_floating_point():
            t.fill_(float("nan"))
        elif t.dtype != torch.bool:
            t.fill_(torch.iinfo(t.dtype).min)
        return t

    @contextlib.contextmanager
    def ctx():
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
            m.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))
            yield

    return ctx
