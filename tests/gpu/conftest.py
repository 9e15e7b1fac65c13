"""GPU kernel tests: real Qwen2.5-7B shapes on CUDA, skipped without it."""
import os
import sys
import warnings

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1.5e-2}


def rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check(out, ref, dtype, what):
    assert not torch.isnan(out).any(), f"{what}: NaN (unwritten output?)"
    err = rel_err(out, ref)
    assert err < TOL[dtype], f"{what}: rel err {err:.3g}"


@pytest.fixture
def gen():
    g = torch.Generator(device="cuda")
    g.seed()
    return g


@pytest.fixture(scope="module")
def qwen2_ckpt(tmp_path_factory):
    """A small random Qwen2 checkpoint (3 layers, hidden 256, 8 query heads over 2 KV heads),
    made once per module: the engine tests' model (fast paths, logprobs, mixed graphs, speculation)."""
    from tests import models

    return models.make_checkpoint(str(tmp_path_factory.mktemp("qwen2") / "qwen2"), "qwen2", seed=11,
                                  hidden_size=256, intermediate_size=512, num_attention_heads=8,
                                  num_key_value_heads=2, num_hidden_layers=3)


@pytest.fixture
def poison_cuda_alloc(monkeypatch):
    """Fresh CUDA allocations come back NaN-filled, so unwritten outputs fail."""
    real_empty = torch.empty

    def empty(*a, **k):
        t = real_empty(*a, **k)
        if t.is_cuda and t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", empty)


def slow(*values):
    """A parametrize case that runs only in the long GPU run (`-m slow`, or no -m at all):
    the default one, `pytest tests/gpu -m "not slow"`, proves each feature in a few minutes."""
    return pytest.param(*values, marks=pytest.mark.slow)


def cases(default: list[tuple], every: list[tuple]) -> list:
    """Parametrize cases: `default` run in the default GPU run, the rest of `every` only in the long one."""
    return list(default) + [slow(*c) for c in every if c not in default]


@pytest.fixture(autouse=True)
def _gpu_turn(request):
    """Under pytest-xdist the workers share the GPU; a test marked gpu_exclusive runs alone (sharing.py)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not torch.cuda.is_available():
        yield
        return
    from tests.gpu.sharing import gpu_turn

    with gpu_turn(request.node.get_closest_marker("gpu_exclusive") is not None):
        yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


def count_syncs(fn) -> tuple[tuple[int, int], list[str], object]:
    """((implicit synchronising calls, explicit waits for samples), where the implicit ones
    are, fn's result). The step's one synchronisation is PendingSamples.result's wait on an
    event, which torch's sync debug mode does not see: it is counted by hand."""
    from engine.sampler import PendingSamples

    waits = []
    real_result = PendingSamples.result

    def result(self):
        waits.append(1)
        return real_result(self)

    PendingSamples.result = result
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = fn()
    finally:
        PendingSamples.result = real_result
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    return (len(syncs), len(waits)), sorted({f"{w.filename}:{w.lineno}" for w in syncs}), out
