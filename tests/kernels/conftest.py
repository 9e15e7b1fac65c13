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


# ---------------------------------------------------------------- the tuner, from fake timings

FLUSH_S = 40e-6


class FakeGPU:
    """graph_time runs the timed function once and adds up what it did: the flush
    (FLUSH_S, or the next of `flushes`) and each config's cost."""

    def __init__(self, costs, outputs=None, flushes=None):
        self.costs, self.outputs, self.log = costs, outputs or {}, []
        self.flushes = iter(flushes) if flushes else None
        self.flush = type("Flush", (), {"zero_": lambda _: self.log.append("flush")})()

    def launch(self, cfg):
        self.log.append(cfg["name"])
        if isinstance(self.costs[cfg["name"]], Exception):
            raise self.costs[cfg["name"]]
        return torch.full((4,), self.outputs.get(cfg["name"], 1.0))

    def graph_time(self, fn, calls=10, reps=7):
        self.log.clear()
        fn()
        flush = next(self.flushes) if self.flushes else FLUSH_S
        return sum(flush if e == "flush" else self.costs[e] for e in self.log)


@pytest.fixture
def fake_gpu(monkeypatch):
    """make(costs) -> a FakeGPU the tuner times with; no tuning cache unless a test activates one."""
    from llm_kernels import dispatch, tune_cache

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(tune_cache, "_store", None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(dispatch, "TIMINGS", {})
    monkeypatch.setattr(dispatch, "FAILED", {})

    def make(costs, **kw):
        gpu = FakeGPU(costs, **kw)
        monkeypatch.setattr(dispatch, "graph_time", gpu.graph_time)
        monkeypatch.setattr(dispatch, "l2_flush_buffer", lambda device: gpu.flush)
        return gpu

    return make


@pytest.fixture
def name():
    """A tuner name of the test's own (chosen configs are kept for the whole process)."""
    return f"fake-{os.urandom(4).hex()}"


def cfgs(*names):
    return [{"name": n} for n in names]
