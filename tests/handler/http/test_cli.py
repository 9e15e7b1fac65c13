"""`python -m handler --serve --port N`: the local endpoint as a user starts it, spoken to over
HTTP: a failing job comes back FAILED with its coded error object (the SDK's --rp_serve_api
reports it COMPLETED), a good one COMPLETED; SIGTERM stops it cleanly."""
from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request

from tests.fakes.worker_process import WorkerProcess
from tests.handler.test_local import free_port, local_env


def request(url: str, body=None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_serve_reports_a_failing_job_failed_and_a_good_one_completed(tiny_llama_dir):
    port = free_port()
    proc = WorkerProcess(local_env(MODEL_NAME=tiny_llama_dir), ["--serve", "--port", str(port)])
    try:
        proc.wait_for_port(port, 60)
        base = f"http://127.0.0.1:{port}/v2/my-endpoint"
        bad = request(base + "/runsync", {"input": {"prompt": "Hi", "sampling_params": {"top_p": 1.5}}})
        good = request(base + "/runsync", {"input": {"prompt": "The quick brown fox", "stream": True,
                                                     "sampling_params": {"ignore_eos": True}}})
        later = request(f"{base}/status/{bad[1]['id']}")
        health = request(base + "/health")
        proc.proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
    finally:
        proc.stop()
    for code, view in (bad, later):
        assert code == 200 and view["status"] == "FAILED" and "output" not in view, view
        err = json.loads(view["error"])
        assert err["code"] == "invalid_input" and err["field"] == "sampling_params.top_p"
    code, view = good
    assert code == 200 and view["status"] == "COMPLETED", view
    assert "".join(i["text"] for i in view["output"]).strip() and view["output"][-1]["finish_reason"]
    assert health[1]["jobs"]["failed"] == 1 and health[1]["jobs"]["completed"] == 1
    assert rc == 0, proc.output[-3000:]
