"""Local runs: `--test_input` iterates the stream as RunPod would and exits non-zero
on failure; a bad setting stops the worker naming the variable; `--rp_serve_api` works."""
import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from handler.local import load_job
from tests.fakes.worker_process import REPO, WorkerProcess

ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "64", "DEFAULT_MAX_TOKENS": "8", "DEFAULT_BATCH_SIZE": "2"}


def local_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}
    env.update(ENV, PYTHONPATH=REPO, **extra)
    return env


def run_cli(args, **env):
    return subprocess.run([sys.executable, "-m", "handler", *args], env=local_env(**env), cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_test_input_runs_the_stream_and_prints_the_aggregated_result(tiny_llama_dir):
    job = {"input": {"messages": [{"role": "user", "content": "안녕하세요"}], "stream": True,
                     "sampling_params": {"ignore_eos": True}}}
    p = run_cli(["--test_input", json.dumps(job, ensure_ascii=False)], MODEL_NAME=tiny_llama_dir)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout)
    assert result["status"] == "COMPLETED" and len(result["output"]) > 1  # real items, not a generator object
    assert "".join(i["text"] for i in result["output"]).strip()
    assert result["output"][-1]["finish_reason"] in ("stop", "length")
    assert "cold start: first token" in p.stderr


def test_test_input_exits_non_zero_when_the_job_fails(tmp_path):
    p = run_cli(["--test_input", '{"input": {"prompt": "Hi"}}'], MODEL_NAME=str(tmp_path / "missing"))
    assert p.returncode == 1
    result = json.loads(p.stdout)
    assert result["status"] == "FAILED"
    err = json.loads(result["error"])
    assert err["code"] == "model_load_failed" and "missing" in err["message"]


def test_a_bad_setting_stops_the_worker_naming_the_variable():
    p = run_cli(["--test_input", '{"input": {"prompt": "Hi"}}'], MAX_MODEL_LEN="lots")
    assert p.returncode == 2 and "MAX_MODEL_LEN='lots'" in p.stderr and p.stdout == ""


@pytest.mark.parametrize("name,value", [("LOG_LEVEL", "trace"), ("CUSTOM_CHAT_TEMPLATE", "{{ messages[0].content }")])
def test_a_bad_setting_is_refused_in_one_line_without_a_traceback(name, value):
    p = run_cli(["--test_input", '{"input": {"prompt": "Hi"}}'], **{name: value})
    assert p.returncode == 2 and f"invalid setting: {name}=" in p.stderr, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_print_settings_gives_the_markdown_table():
    p = run_cli(["--print-settings"])
    assert p.returncode == 0 and "| `MAX_CONCURRENCY` |" in p.stdout


def test_test_input_json_file_is_the_fallback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="test_input.json"):
        load_job(None)
    (tmp_path / "test_input.json").write_text('{"input": {"prompt": "Hi"}}')
    assert load_job(None) == {"input": {"prompt": "Hi"}, "id": "local_test"}
    with pytest.raises(ValueError):
        load_job('{"prompt": "no input key"}')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rp_serve_api_serves_our_handler(tiny_llama_dir):
    port = free_port()
    proc = WorkerProcess(local_env(MODEL_NAME=tiny_llama_dir, UVICORN_LOG_LEVEL="warning"),
                         ["--rp_serve_api", "--rp_api_port", str(port), "--rp_api_host", "127.0.0.1"])
    try:
        proc.wait_for_port(port, 60)
        body = json.dumps({"input": {"prompt": "The quick brown fox", "stream": True,
                                 "sampling_params": {"ignore_eos": True}}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/runsync", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            result = json.loads(resp.read())
    finally:
        proc.stop()
    assert result["status"] == "COMPLETED", result
    assert "".join(i["text"] for i in result["output"]).strip()
    assert result["output"][-1]["finish_reason"] in ("stop", "length")
