"""The tuner's choices on disk (llm_kernels/tune_cache.py): a later process takes
them without timing, only for the same GPU and software, only while still a
candidate; a broken or unwritable cache costs a warning, never a failure."""
import json
import logging
import os

import pytest
import torch

from llm_kernels import dispatch, tune_cache
from llm_kernels.dispatch import autotune
from tests.kernels.conftest import cfgs

H200 = {"gpu": "NVIDIA H200", "capability": "9.0", "sms": 132, "torch": "2.11.0", "cuda": "13.0",
        "triton": "3.6.0", "kernels": "abc"}


@pytest.fixture
def gpu_identity(monkeypatch):
    """Activation as on a CUDA device whose identity is the test's (no CUDA here)."""
    ident = dict(H200)
    monkeypatch.setattr(tune_cache, "identity", lambda device: dict(ident))
    monkeypatch.setattr(tune_cache, "_store", None)
    return ident


def new_process(monkeypatch, directory):
    """What a fresh process has: no choices in memory, the cache activated again."""
    monkeypatch.setattr(dispatch, "_TUNED", {})
    monkeypatch.setattr(dispatch, "TIMINGS", {})
    monkeypatch.setattr(tune_cache, "_store", None)
    return tune_cache.activate(str(directory), "cuda")


def test_a_choice_is_taken_by_the_next_process_without_timing(fake_gpu, name, gpu_identity, tmp_path,
                                                             monkeypatch):
    gpu = fake_gpu({"a": 5e-6, "b": 2e-6, "c": 3e-6})
    path = tune_cache.activate(str(tmp_path), "cuda")
    assert os.path.dirname(path) == str(tmp_path) and "NVIDIA_H200" in os.path.basename(path)
    assert autotune(name, (1, torch.bfloat16), cfgs("a", "b", "c"), gpu.launch) == {"name": "b"}
    assert (name, 1, torch.bfloat16) in dispatch.TIMINGS
    tune_cache.save()
    new_process(monkeypatch, tmp_path)
    gpu.log.clear()
    best = autotune(name, (1, torch.bfloat16), lambda: cfgs("a", "b", "c"), gpu.launch)
    assert best == {"name": "b"} and not gpu.log and not dispatch.TIMINGS  # nothing launched or timed
    assert dispatch.chosen(name, (1, torch.bfloat16)) == best
    # inside a graph capture too: the stored choice, and kept (the first candidate would not be)
    monkeypatch.setattr(dispatch, "_TUNED", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert autotune(name, (1, torch.bfloat16), cfgs("a", "b", "c"), gpu.launch) == {"name": "b"}
    assert dispatch.chosen(name, (1, torch.bfloat16)) == {"name": "b"}


def test_a_choice_no_longer_a_candidate_is_tuned_again(fake_gpu, name, gpu_identity, tmp_path,
                                                       monkeypatch):
    gpu = fake_gpu({"a": 5e-6, "b": 2e-6, "c": 3e-6})
    tune_cache.activate(str(tmp_path), "cuda")
    autotune(name, (2,), cfgs("a", "b"), gpu.launch)
    tune_cache.save()
    new_process(monkeypatch, tmp_path)
    assert autotune(name, (2,), cfgs("a", "c"), gpu.launch) == {"name": "c"}
    assert (name, 2) in dispatch.TIMINGS
    tune_cache.save()
    new_process(monkeypatch, tmp_path)
    assert tune_cache.lookup((name, 2), cfgs("a", "b", "c")) == {"name": "c"}  # the new choice replaced it


@pytest.mark.parametrize("field, other", [("gpu", "NVIDIA H100 80GB HBM3"), ("triton", "3.5.1"),
                                          ("kernels", "def"), ("sms", 114)])
def test_another_gpu_or_software_never_takes_a_choice(fake_gpu, name, gpu_identity, tmp_path,
                                                      monkeypatch, field, other):
    gpu = fake_gpu({"a": 5e-6, "b": 2e-6})
    first = tune_cache.activate(str(tmp_path), "cuda")
    autotune(name, (3,), cfgs("a", "b"), gpu.launch)
    tune_cache.save()
    gpu_identity[field] = other
    second = new_process(monkeypatch, tmp_path)
    assert second != first
    autotune(name, (3,), cfgs("a", "b"), gpu.launch)
    assert (name, 3) in dispatch.TIMINGS  # timed again


def test_keys_and_configs_with_dtypes_and_tuples_round_trip(gpu_identity, tmp_path, monkeypatch):
    tune_cache.activate(str(tmp_path), "cuda")
    key = ("write_kv", 16, 28, 128, torch.bfloat16, torch.float8_e4m3fn, 16)
    configs = [(1, 4), (2, 8), (4, 4)]
    tune_cache.record(key, (2, 8))
    tune_cache.save()
    new_process(monkeypatch, tmp_path)
    got = tune_cache.lookup(key, configs)
    assert got == (2, 8) and got is configs[1]  # the caller's own object, a tuple again
    assert tune_cache.lookup(key[:4] + (torch.float16,) + key[5:], configs) is None
    # a dict config's key order does not matter
    tune_cache.record(("k",), {"BM": 16, "BN": 64, "swap": True})
    assert tune_cache.lookup(("k",), [{"swap": True, "BN": 64, "BM": 16}]) == {"BM": 16, "BN": 64, "swap": True}


def test_a_broken_file_is_ignored_with_a_warning_and_replaced(fake_gpu, name, gpu_identity, tmp_path,
                                                              monkeypatch, caplog):
    gpu = fake_gpu({"a": 5e-6, "b": 2e-6})
    path = tune_cache.activate(str(tmp_path), "cuda")
    tune_cache.record((name, 4), {"name": "a"})
    tune_cache.save()
    with open(path, "w") as f:
        f.write('{"format": 1, "entr')  # a worker killed mid-write elsewhere, say
    with caplog.at_level(logging.WARNING, logger="llm_kernels.tune_cache"):
        new_process(monkeypatch, tmp_path)
    assert "unreadable" in caplog.text
    assert autotune(name, (4,), cfgs("a", "b"), gpu.launch) == {"name": "b"}  # tuned, no failure
    tune_cache.save()
    with open(path) as f:
        assert json.load(f)["entries"] == {tune_cache.key_text((name, 4)): {"name": "b"}}


def test_an_unwritable_folder_keeps_choices_in_the_process(fake_gpu, name, gpu_identity, tmp_path,
                                                           caplog):
    gpu = fake_gpu({"a": 5e-6, "b": 2e-6})
    (tmp_path / "file").write_text("")
    tune_cache.activate(str(tmp_path / "file" / "cache"), "cuda")  # under a file: no folder can be made
    with caplog.at_level(logging.WARNING, logger="llm_kernels.tune_cache"):
        assert autotune(name, (5,), cfgs("a", "b"), gpu.launch) == {"name": "b"}
        tune_cache.save()
        tune_cache.save()
    assert caplog.text.count("cannot be written") == 1
    assert dispatch.chosen(name, (5,)) == {"name": "b"}


def test_processes_saving_one_file_keep_each_others_choices(gpu_identity, tmp_path, monkeypatch):
    tune_cache.activate(str(tmp_path), "cuda")
    a = tune_cache.active()
    b = tune_cache.Store(a.path, dict(gpu_identity))  # another worker, started before a saved
    a.record(("k", 1), {"x": 1})
    b.record(("k", 2), {"x": 2})
    a.save()
    b.save()
    a.record(("k", 3), {"x": 3})
    a.save()
    with open(a.path) as f:
        entries = json.load(f)["entries"]
    assert set(entries) == {tune_cache.key_text(("k", i)) for i in (1, 2, 3)}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tuned-")]  # no temporary file left


def test_new_choices_reach_the_disk_without_an_explicit_save(gpu_identity, tmp_path, monkeypatch):
    path = tune_cache.activate(str(tmp_path), "cuda")
    monkeypatch.setattr(tune_cache, "SAVE_EVERY_S", 3600.0)
    tune_cache.record(("k", 1), 1)
    assert not os.path.exists(path)  # batched: not one write per choice
    monkeypatch.setattr(tune_cache, "SAVE_EVERY_S", 0.0)
    tune_cache.record(("k", 2), 2)
    with open(path) as f:
        assert len(json.load(f)["entries"]) == 2


def test_the_folder_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_KERNELS_CACHE_DIR", str(tmp_path / "here"))
    assert tune_cache.default_dir() == str(tmp_path / "here")
    monkeypatch.setenv("LLM_KERNELS_CACHE_DIR", "")
    assert tune_cache.default_dir() is None  # off
    monkeypatch.delenv("LLM_KERNELS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tune_cache.default_dir() == str(tmp_path / "xdg" / "llm_kernels")


def test_off_means_nothing_is_stored(fake_gpu, name, monkeypatch, tmp_path):
    monkeypatch.setattr(tune_cache, "_store", None)
    assert tune_cache.activate(None, "cuda") is None
    gpu = fake_gpu({"a": 5e-6, "b": 2e-6})
    assert autotune(name, (6,), cfgs("a", "b"), gpu.launch) == {"name": "b"}
    assert tune_cache.active() is None and tune_cache.lookup((name, 6), cfgs("a", "b")) is None


def test_the_source_hash_follows_the_package():
    digest = tune_cache.source_hash()
    assert len(digest) == 64 and digest == tune_cache.source_hash()


def test_the_source_hash_covers_subpackages(tmp_path, monkeypatch):
    """An edit in a subpackage (the W4A16 kernels live in llm_kernels/w4a16/) is a new cache."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 1\n")
    monkeypatch.setattr(tune_cache, "__file__", str(pkg / "tune_cache.py"))
    before = tune_cache.source_hash()
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    assert tune_cache.source_hash() != before
