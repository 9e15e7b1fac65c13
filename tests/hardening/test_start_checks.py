"""A model that cannot serve is found at start, before any job is taken: a worker with
MODEL_NAME loads it first, and a truncated weight file ends the process non-zero (RunPod
marks the worker unhealthy) with the setting and the cause in its log; no job is taken."""
from __future__ import annotations

import os
import shutil

from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess

ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "64", "METRICS_LOG_INTERVAL_S": "0"}


def _truncated_copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    weights = [f for f in os.listdir(dst) if f.endswith(".safetensors")]
    assert weights
    path = os.path.join(dst, weights[0])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)  # a download cut short
    return dst


def test_truncated_weights_end_the_worker_at_start_and_no_job_is_taken(tiny_llama_dir, tmp_path, figures):
    broken = _truncated_copy(tiny_llama_dir, str(tmp_path / "truncated"))
    with FakeControlPlane() as fake:
        jobs = [fake.submit({"prompt": f"job {i}", "sampling_params": {"max_tokens": 4}}) for i in range(6)]
        proc = WorkerProcess({**fake.worker_env(), **ENV, "MODEL_NAME": broken})
        try:
            rc = proc.wait(120)
        finally:
            proc.stop()
        taken = [j for j in jobs if fake.jobs[j].worker is not None]
    out = proc.output
    assert rc != 0, out[-3000:]
    assert taken == [] and not fake.takes, "a worker whose model cannot load took jobs"
    assert "MODEL_NAME" in out and broken in out and "could not be loaded" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    figures.set("start_checks", truncated_weights_exit_code=rc, jobs_taken=len(taken))


def test_a_max_model_len_past_the_models_positions_stops_the_worker_naming_it(tiny_mistral_dir):
    with FakeControlPlane() as fake:
        job = fake.submit({"prompt": "Hi", "sampling_params": {"max_tokens": 4}})
        proc = WorkerProcess({**fake.worker_env(), **ENV, "MAX_MODEL_LEN": "100000", "MODEL_NAME": tiny_mistral_dir})
        try:
            rc = proc.wait(120)
        finally:
            proc.stop()
        assert fake.jobs[job].worker is None and not fake.takes
    assert rc == 2 and "invalid setting: MAX_MODEL_LEN=100000" in proc.output and "512" in proc.output, proc.output
    assert "Traceback" not in proc.output
