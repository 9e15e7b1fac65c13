"""Faults through the real worker: `python -m handler` (the runpod SDK loop) against the fake
control plane, FAULT_INJECTION set. Out-of-memory, NaN logits and a detokenizer exception hit
one job each at random steps; every other job's output is exactly that of a fault-free run.
Then a dead device fails the jobs in flight with engine_dead and the worker asks to be replaced.
A weight-loading failure fails jobs with model_load_failed and asks for a replacement too."""
from __future__ import annotations

import asyncio
import json
import os
import random

import pytest

from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.hardening.conftest import size
from tests.hardening.outcomes import error_object, final_stats, log_problems, output_text
from tests.models import TOKENIZER_TEXT

SEED = int(os.environ.get("HARDENING_SEED", "0"))
ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "128", "MAX_NUM_BATCHED_TOKENS": "48", "MAX_CONCURRENCY": "16",
       "JOB_KV_TOKENS": "64", "DEFAULT_BATCH_SIZE": "8", "METRICS_LOG_INTERVAL_S": "0", "LOAD_PROGRESS_INTERVAL_S": "1"}
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": TOKENIZER_TEXT[1]}]


def greedy(n: int) -> dict:
    return {"max_tokens": n, "temperature": 0, "ignore_eos": True}


JOBS = {
    "w-plain": {"prompt": TOKENIZER_TEXT[0], "sampling_params": greedy(30)},
    "w-stream": {"prompt": TOKENIZER_TEXT[2], "stream": True, "max_batch_size": 4, "sampling_params": greedy(36)},
    "w-chat": {"messages": CHAT, "sampling_params": greedy(28)},
    "w-openai": {"openai_route": "/v1/chat/completions",
                 "openai_input": {"messages": CHAT, "stream": True, "temperature": 0, "max_tokens": 24,
                                  "ignore_eos": True}},
    "w-long": {"prompt": " ".join(TOKENIZER_TEXT), "priority": 3, "sampling_params": greedy(40)},
    "f-oom": {"prompt": TOKENIZER_TEXT[3], "stream": True, "max_batch_size": 2, "sampling_params": greedy(40)},
    "f-nan": {"prompt": TOKENIZER_TEXT[4], "sampling_params": greedy(40)},
    "f-detok": {"prompt": TOKENIZER_TEXT[5], "stream": True, "max_batch_size": 3, "sampling_params": greedy(40)},
}
DEAD_JOBS = {f"d-{i}": {"prompt": TOKENIZER_TEXT[i], "stream": True, "max_batch_size": 1,
                        "sampling_params": greedy(200)} for i in range(2)}


def start(fake: FakeControlPlane, model_dir: str, faults: dict | None) -> WorkerProcess:
    env = {**fake.worker_env(), **ENV, "MODEL_NAME": model_dir}
    if faults:
        env["FAULT_INJECTION"] = json.dumps(faults)
    return WorkerProcess(env)


def streamed_text(job) -> str:
    return (output_text(job.stream) or "") if job.stream else ""


@pytest.fixture(scope="module")
def clean_run(tiny_llama_dir):
    with FakeControlPlane() as fake:
        for jid, job_input in JOBS.items():
            fake.submit(job_input, jid)
        proc = start(fake, tiny_llama_dir, None)
        rc = proc.serve_until(fake, fake.all_final, 120, "every job final")
    assert rc == 0 and not log_problems(proc.output), proc.output[-3000:]
    texts = {}
    for jid, job in fake.jobs.items():
        assert job.status == "COMPLETED", (jid, job.status_view())
        texts[jid] = output_text(job.output)
        assert texts[jid].strip(), jid
    return texts


@pytest.mark.parametrize("seed", [SEED + k for k in range(size(1, 3))])
def test_faults_through_the_worker_fail_only_their_jobs_then_a_dead_device_replaces_it(seed, tiny_llama_dir, clean_run,
                                                                                       figures):
    rng = random.Random(seed)
    at = {kind: rng.randint(2, 12) for kind in ("oom", "nan", "detokenize_error")}
    faults = {"oom_at_step": at["oom"], "oom_request_id": "f-oom", "nan_at_step": at["nan"], "nan_request_id": "f-nan",
              "nan_value": rng.choice(["nan", "inf"]), "detokenize_error_at_step": at["detokenize_error"],
              "detokenize_error_request_id": "f-detok", "dead_at_step": 1, "dead_request_id": "d-kill"}
    with FakeControlPlane() as fake:
        for jid, job_input in JOBS.items():
            fake.submit(job_input, jid)
        proc = start(fake, tiny_llama_dir, faults)
        try:
            fake.wait_for(lambda: fake.all_final(list(JOBS)), 120, "the first jobs final")
            for jid, job_input in DEAD_JOBS.items():
                fake.submit(job_input, jid)
            fake.wait_for(lambda: all(fake.jobs[j].stream for j in DEAD_JOBS), 60, "the d- jobs streaming")
            fake.submit({"prompt": "Hi", "sampling_params": greedy(4)}, "d-kill")  # the device dies running it
            rc = proc.wait(60)  # the worker asked to be replaced: the SDK ends its loop
            after = fake.submit({"prompt": "Hi", "sampling_params": greedy(4)}, "d-after")
        finally:
            proc.stop()
    out = proc.output
    assert rc == 1, out[-3000:]
    assert fake.violations == [] and not log_problems(out), (fake.violations, log_problems(out))

    codes = {"f-oom": ("out_of_memory", True), "f-nan": ("non_finite_logits", False),
             "f-detok": ("internal_error", False)}
    for jid, (code, retryable) in codes.items():
        job = fake.jobs[jid]
        err = error_object(job.error) if job.status == "FAILED" else None
        assert err and err["code"] == code and err["retryable"] is retryable, (jid, faults, job.status_view())
        partial = err.get("partial_text", "")
        assert clean_run[jid].startswith(partial), jid  # the text up to the fault, nothing else
        if JOBS[jid].get("stream"):  # what was streamed, then the rest (still buffered) in partial_text
            assert partial.startswith(streamed_text(job)), jid
        assert not job.stop_pod, jid  # a request's fault does not replace the worker
    for jid in JOBS.keys() - codes.keys():
        job = fake.jobs[jid]
        assert job.status == "COMPLETED" and output_text(job.output) == clean_run[jid], (jid, job.status_view())
    for jid in [*DEAD_JOBS, "d-kill"]:
        job = fake.jobs[jid]
        err = error_object(job.error) if job.status == "FAILED" else None
        assert err and err["code"] == "engine_dead" and err["retryable"] is True, (jid, job.status_view())
        assert job.stop_pod is True, jid  # RunPod is asked to replace the worker
    assert fake.jobs[after].status == "IN_QUEUE"  # a replaced worker takes nothing more
    assert "asking RunPod to replace this worker" in out
    stats = final_stats(proc.lines)
    assert stats["num_streams"] == 0, stats
    figures.add("faults_worker", "runs_passed")
    figures.add("faults_worker", "jobs", len(JOBS) + len(DEAD_JOBS) + 1)
    figures.add("faults_worker", "unaffected_jobs_identical", len(JOBS) - len(codes))
    figures.add("faults_worker", "engine_dead_jobs", len(DEAD_JOBS) + 1)


def test_a_weight_loading_failure_fails_jobs_with_model_load_failed_and_asks_for_a_replacement(tiny_llama_dir):
    from handler.local import run_job
    from handler.settings import load_settings
    from handler.worker import Worker

    worker = Worker(load_settings({**ENV, "MODEL_NAME": tiny_llama_dir, "LOG_LEVEL": "warning",
                                   "FAULT_INJECTION": json.dumps({"load_error_after_tensors": 3})}))
    config = worker.runpod_config()

    async def main():
        return [await run_job(worker.handle, {"id": f"j{i}", "input": {"prompt": "Hi"}}) for i in range(2)]

    results = asyncio.run(main())
    for r in results:
        err = error_object(r.get("error"))
        assert r["status"] == "FAILED" and err and err["code"] == "model_load_failed", r
        assert "Input/output error" in err["message"] and err["retryable"] is True  # another worker may load
    assert config["refresh_worker"] is True and worker.engine is None
