"""Every adapter of LORA_MODULES is found and checked when the model loads: a bad one stops the
worker at start naming LORA_MODULES, the adapter and the reason (exit status 2, as a bad setting;
1 when it could not be fetched), and the jobs of a worker loading on demand fail model_load_failed
saying the same. An adapter's path is found as MODEL_NAME is: a local folder within
ALLOWED_MODEL_ROOTS, a hub id in a hub cache (RunPod's cached models, the volume: offline), else
the base model's own hub download."""
import json
import logging
import os
import shutil

import pytest

from engine.errors import LoRAError, ModelLoadError
from handler.engine_setup import load_failure_exit
from handler.errors import JobError
from handler.worker import Worker
from tests.fakes.hub_cache import lay_out
from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.handler.conftest import error_of, run, settings_for, text_of
from tests.handler.test_cached_model import offline, volume  # noqa: F401 - fixtures: no hub, a temp volume

COMMIT = "c" * 40
GREEDY = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}


def _start_failure(settings) -> tuple[JobError, BaseException]:
    w = Worker(settings)
    with pytest.raises(JobError) as failed:
        w.loader.load_now()  # as a worker with MODEL_NAME does at start
    return failed.value, failed.value.__cause__


@pytest.fixture
def broken(adapter_dirs, tmp_path):
    """Adapters this worker cannot serve, by the reason it gives."""
    config = tmp_path / "bad-config"
    shutil.copytree(adapter_dirs["sql"], config)
    (config / "adapter_config.json").write_text("{not json")
    return {"rank_too_large": adapter_dirs["sql"],  # rank 8, MAX_LORA_RANK 4 below
            "missing_file": str(tmp_path / "no-such-adapter"), "bad_config": str(config)}


@pytest.mark.parametrize("reason", ["rank_too_large", "missing_file", "bad_config"])
def test_a_bad_adapter_fails_the_start_naming_it(tiny_llama_dir, adapter_dirs, broken, reason, caplog, loop):
    env = {"MAX_LORA_RANK": "4" if reason == "rank_too_large" else "8",
           "LORA_MODULES": json.dumps([{"name": "good", "path": adapter_dirs["chat"]},
                                       {"name": "bad", "path": broken[reason]}])}
    err, cause = _start_failure(settings_for(tiny_llama_dir, **env))
    assert err.code == "model_load_failed" and "'bad'" in err.message
    assert isinstance(cause, LoRAError) and cause.details["adapter"] == "bad" and cause.reason == reason
    with caplog.at_level(logging.ERROR, logger="handler"):
        assert load_failure_exit(settings_for(tiny_llama_dir, **env), err) == 2
    line = caplog.records[-1].getMessage()
    assert line.startswith("invalid setting: LORA_MODULES") and "'bad'" in line and reason in line
    w = Worker(settings_for(tiny_llama_dir, **env))  # loading on a job's demand: the job says the same
    failed = error_of(run(loop, w, {"prompt": "Hi"}))
    assert failed["code"] == "model_load_failed" and "'bad'" in failed["message"]


def test_an_adapter_outside_the_allowed_roots_is_refused(tiny_llama_dir, adapter_dirs, tmp_path):
    settings = settings_for(tiny_llama_dir, MAX_LORA_RANK="8", LORA_MODULES=f"sql={adapter_dirs['sql']}",
                            ALLOWED_MODEL_ROOTS=f"{tiny_llama_dir}:{tmp_path}")
    _, cause = _start_failure(settings)
    assert isinstance(cause, LoRAError) and cause.reason == "not_allowed" and "ALLOWED_MODEL_ROOTS" in cause.message


def test_the_worker_exits_2_at_start_naming_the_adapter(tiny_llama_dir, adapter_dirs):
    """`python -m handler` with MODEL_NAME on RunPod's loop (a fake control plane): the adapter is
    checked with the model, before any job is taken; the process exits 2 naming it."""
    env = {"MODEL_NAME": tiny_llama_dir, "MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "32", "METRICS_LOG_INTERVAL_S": "0",
           "MAX_LORA_RANK": "4", "LORA_MODULES": f"good={adapter_dirs['chat']} big={adapter_dirs['sql']}"}
    with FakeControlPlane() as fake:
        job = fake.submit({"prompt": "Hi", "lora": "good", "sampling_params": {"max_tokens": 4}})
        proc = WorkerProcess({**fake.worker_env(), **env})
        try:
            rc = proc.wait(120)
        finally:
            proc.stop()
        assert fake.jobs[job].worker is None and not fake.takes, "a worker with a bad adapter took a job"
    out = proc.output
    assert rc == 2, out[-3000:]
    assert "invalid setting: LORA_MODULES: the LoRA adapter 'big'" in out and "rank_too_large" in out, out[-3000:]
    assert "Traceback" not in out


@pytest.mark.parametrize("where", ["runpod", "volume"])
def test_an_adapter_in_a_hub_cache_loads_offline(tiny_llama_dir, adapter_dirs, volume, offline,  # noqa: F811
                                                 monkeypatch, tmp_path, loop, where):
    """A hub id of LORA_MODULES found in RunPod's cached models (lowercased folder) or in the
    volume's hub cache (huggingface_hub's own case): its snapshot loads with no hub call."""
    base, hub = volume
    if where == "runpod":
        hub = tmp_path / "runpod-cache"
        monkeypatch.setattr("handler.cached_model.RUNPOD_HUB_CACHE", str(hub))
    folder = "models--org--sql-lora" if where == "runpod" else "models--Org--SQL-LoRA"
    repo = lay_out(hub, folder, adapter_dirs["sql"], {COMMIT: 1_000_000}, refs={"main": COMMIT})
    w = Worker(settings_for(tiny_llama_dir, BASE_PATH=str(base), MAX_LORA_RANK="8", LORA_MODULES="sql=Org/SQL-LoRA"))
    try:
        w.loader.load_now()
        assert w.adapters.request("sql").lora_path == os.path.join(repo, "snapshots", COMMIT)
        local = Worker(settings_for(tiny_llama_dir, MAX_LORA_RANK="8", LORA_MODULES=f"sql={adapter_dirs['sql']}"))
        job = {"prompt": "The quick brown fox", "lora": "sql", "sampling_params": GREEDY}
        assert text_of(run(loop, w, job)) == text_of(run(loop, local, job))
        loop.run_until_complete(local.aclose())
        cards = run(loop, w, {"openai_route": "/v1/models"})["output"][0]["data"]
        assert cards[1]["root"] == "Org/SQL-LoRA"  # as LORA_MODULES names it
    finally:
        loop.run_until_complete(w.aclose())


def test_an_uncached_hub_id_takes_the_base_models_download(tiny_llama_dir, adapter_dirs, volume,  # noqa: F811
                                                          monkeypatch, caplog):
    """No hub cache holds it: engine.model.loader.resolve_model_path fetches it, as it does MODEL_NAME
    (HF_TOKEN, HF_HUB_OFFLINE, the Hugging Face cache); a failure exits 1 (another start may fetch it)."""
    from engine.model import loader

    asked, real = [], loader.resolve_model_path

    def fetched(model, revision=None):
        if os.path.isdir(model):  # the base model's folder
            return real(model, revision)
        asked.append(model)
        return adapter_dirs["sql"]

    monkeypatch.setattr(loader, "resolve_model_path", fetched)
    w = Worker(settings_for(tiny_llama_dir, MAX_LORA_RANK="8", LORA_MODULES="sql=org/sql-lora"))
    w.loader.load_now()
    assert asked == ["org/sql-lora"] and w.adapters.request("sql").lora_path == adapter_dirs["sql"]

    def offline_hub(model, revision=None):
        if os.path.isdir(model):
            return real(model, revision)
        raise ModelLoadError(f"model {model!r} could not be fetched from the hub: offline")

    monkeypatch.setattr(loader, "resolve_model_path", offline_hub)
    settings = settings_for(tiny_llama_dir, MAX_LORA_RANK="8", LORA_MODULES="sql=org/sql-lora")
    err, cause = _start_failure(settings)
    assert isinstance(cause, LoRAError) and cause.reason == "fetch_failed" and "org/sql-lora" in err.message
    with caplog.at_level(logging.ERROR, logger="handler"):
        assert load_failure_exit(settings, err) == 1
    assert "could not be fetched" in caplog.records[-1].getMessage()
