"""MODEL_NAME found in a Hugging Face hub cache (RunPod's cached models: lowercased
`models--org--name` under /runpod-volume/huggingface-cache/hub; a network volume filled by
huggingface_hub under BASE_PATH): which snapshot loads, that it loads with no hub call and is
served under MODEL_NAME as written, and that an incomplete snapshot stops the worker at start."""
import json
import logging
import os
import shutil
import socket

import pytest

from handler.cached_model import find_cached_model
from handler.errors import JobError
from handler.worker import Worker
from tests.fakes.hub_cache import lay_out
from tests.handler.conftest import error_of, run, settings_for

NAME = "Org/Tiny-Llama"
OLD, NEW = "a" * 40, "b" * 40


@pytest.fixture
def volume(tmp_path, monkeypatch):
    """BASE_PATH on a temp folder, its hub cache where RunPod mounts cached models (relative to
    the volume), and no other Hugging Face cache in sight."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr("handler.cached_model.RUNPOD_HUB_CACHE", str(tmp_path / "no-runpod-cache"))
    hub = tmp_path / "volume" / "huggingface-cache" / "hub"
    hub.mkdir(parents=True)
    return tmp_path / "volume", hub


@pytest.fixture
def offline(monkeypatch):
    """No hub call: every snapshot_download must stay on local files, and no socket may connect
    to the network."""
    import huggingface_hub

    real = huggingface_hub.snapshot_download

    def local_only(*args, **kw):
        assert kw.get("local_files_only") is True, "snapshot_download reached for the hub"
        return real(*args, **kw)

    def no_download(*args, **kw):
        raise AssertionError("hf_hub_download called")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", local_only)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    monkeypatch.setattr(huggingface_hub.file_download, "hf_hub_download", no_download)
    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network connection to {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_runpod_cached_model_loads_offline_and_is_served_under_model_name(loop, tiny_llama_dir, volume, offline,
                                                                          caplog):
    base, hub = volume
    repo = lay_out(hub, "models--org--tiny-llama", tiny_llama_dir, {OLD: 1_000_000, NEW: 2_000_000},
                   refs={"main": OLD})
    w = Worker(settings_for(NAME, BASE_PATH=str(base)))
    with caplog.at_level(logging.INFO):
        w.loader.load_now()  # at start, as a worker with MODEL_NAME does
    try:
        assert w.engine.engine.model_path == os.path.join(repo, "snapshots", OLD)  # refs/main's, not the newest
        lines = [r.getMessage() for r in caplog.records]
        used = [line for line in lines if "cached model" in line]
        assert len(used) == 1 and repo in used[0] and OLD in used[0] and NAME in used[0], lines
        ready = next(line for line in lines if line.startswith("engine ready"))
        assert NAME in ready and "snapshots" not in ready and "models--" not in ready
        r = run(loop, w, {"openai_route": "/v1/models"})
        assert r["output"][0]["data"][0]["id"] == NAME
        r = run(loop, w, {"openai_route": "/v1/chat/completions", "openai_input": {
            "model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
            "ignore_eos": True}})
        assert r["status"] == "COMPLETED" and r["output"][0]["model"] == NAME
        assert r["output"][0]["choices"][0]["message"]["content"]
    finally:
        loop.run_until_complete(w.aclose())


def test_which_snapshot(tmp_path, tiny_llama_dir, volume, offline):
    base, hub = volume
    src = str(tmp_path / "src")  # the configs alone: choosing reads no weight
    os.makedirs(src)
    shutil.copy(os.path.join(tiny_llama_dir, "config.json"), src)
    repo = lay_out(hub, "models--org--tiny-llama", src, {OLD: 1_000_000, NEW: 2_000_000}, refs={"v1": OLD})

    def found(**env):
        cached = find_cached_model(settings_for(NAME, BASE_PATH=str(base), **env))
        return cached and (cached.repo_folder, os.path.basename(cached.snapshot), cached.chosen_by)

    assert found() == (repo, NEW, "the newest snapshot")  # no refs/main
    assert found(MODEL_REVISION=OLD) == (repo, OLD, "MODEL_REVISION")  # a commit hash
    assert found(MODEL_REVISION="v1") == (repo, OLD, "MODEL_REVISION")  # a tag or branch under refs/
    assert found(MODEL_REVISION="c" * 40) is None  # not cached: the hub as before
    assert found(MODEL_REVISION="v2") is None
    (hub / "models--org--tiny-llama" / "refs" / "main").write_text(OLD)
    assert found() == (repo, OLD, "refs/main")
    assert find_cached_model(settings_for("Org/Other", BASE_PATH=str(base))) is None
    assert find_cached_model(settings_for(str(tmp_path / "src"), BASE_PATH=str(base))) is None  # a folder


def test_network_volume_in_huggingface_hubs_own_layout(tmp_path, tiny_llama_dir, volume, offline, monkeypatch):
    """A cache huggingface_hub filled itself keeps the id's case; HF_HOME's cache is searched too."""
    _, _ = volume
    hub = tmp_path / "hf-home" / "hub"
    repo = lay_out(hub, "models--Org--Tiny-Llama", tiny_llama_dir, {NEW: 2_000_000}, refs={"main": NEW})
    cached = find_cached_model(settings_for(NAME))
    assert cached.repo_folder == repo and os.path.basename(cached.snapshot) == NEW


@pytest.mark.parametrize("damage", ["config.json", "shard"])
def test_an_incomplete_snapshot_fails_at_start_naming_model_name(loop, tmp_path, tiny_llama_dir, volume, offline,
                                                                 damage):
    base, hub = volume
    src = str(tmp_path / "src")
    shutil.copytree(tiny_llama_dir, src)
    if damage == "shard":  # the index names a second shard that never arrived
        assert not os.path.exists(os.path.join(src, "model.safetensors.index.json"))  # one file: index two
        with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}, f)
        missing = "model-00002-of-00002.safetensors"
    else:
        os.remove(os.path.join(src, "config.json"))
        missing = "config.json"
    repo = lay_out(hub, "models--org--tiny-llama", src, {NEW: 2_000_000}, refs={"main": NEW})
    w = Worker(settings_for(NAME, BASE_PATH=str(base)))
    with pytest.raises(JobError) as failed:
        w.loader.load_now()
    err = failed.value
    snapshot = os.path.join(repo, "snapshots", NEW)
    assert err.code == "model_load_failed" and f"MODEL_NAME={NAME}" in err.message
    assert snapshot in err.message and missing in err.message and "incomplete" in err.message
    w2 = Worker(settings_for(NAME, BASE_PATH=str(base)))  # loaded on a job's demand: the job says the same
    err = error_of(run(loop, w2, {"prompt": "Hi"}))
    assert err["code"] == "model_load_failed" and snapshot in err["message"] and f"MODEL_NAME={NAME}" in err["message"]
