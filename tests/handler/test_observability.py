"""Observability: the Prometheus metrics (engine state live, jobs by status and code, tokens,
TTFT and TPOT), served over HTTP on METRICS_PORT by `python -m handler`, the `metrics {...}`
summary line every METRICS_LOG_INTERVAL_S, the job id on every job's lines, one finished line each;
the metrics server binds METRICS_HOST (loopback by default)."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from handler.local import run_job
from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.handler.conftest import error_of, run
from tests.handler.test_overload import slow_steps

SURE = {"max_tokens": 6, "ignore_eos": True}
PROMPT = list(range(10, 58))  # three full blocks: a repeat finds two in the prefix cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, host: str = "127.0.0.1") -> dict:
    """{(name, sorted labels): value} of the /metrics page."""
    body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_over_http_follow_the_engine_and_the_jobs(loop, make_worker):
    w = make_worker(MAX_NUM_SEQS="1")
    port = free_port()
    w.metrics.start_server(port, addr="127.0.0.1")
    try:
        results = [run(loop, w, {"prompt": PROMPT, "sampling_params": SURE}, f"ok-{i}") for i in range(2)]
        results.append(run(loop, w, {"prompt": "x", "sampling_params": {"top_k": -3}}, "bad"))
        m = scrape(port)
        assert value(m, "worker_jobs_total", status="completed", code="ok") == 2
        assert value(m, "worker_jobs_total", status="failed", code="invalid_input") == 1
        usage = [r["output"][-1]["usage"] for r in results[:2]]
        assert value(m, "worker_tokens_total", kind="prompt") == sum(u["prompt_tokens"] for u in usage)
        assert value(m, "worker_tokens_total", kind="completion") == sum(u["completion_tokens"] for u in usage) == 12
        assert value(m, "worker_time_to_first_token_seconds_count") == 2  # the invalid job had no token
        assert value(m, "worker_time_per_output_token_seconds_count") == 2
        assert 0 < value(m, "worker_time_per_output_token_seconds_sum") < value(m, "worker_job_duration_seconds_sum")
        stats = w.engine.stats()
        assert value(m, "worker_kv_blocks_total") == 64 and value(m, "worker_kv_blocks_used") == 0
        assert value(m, "worker_prefix_cache_hit_tokens_total") == stats["prefix_cache_hit_tokens"] == 32
        assert stats["prefix_cache_hit_rate"] > 0
        assert value(m, "worker_prefix_cache_hit_rate") == pytest.approx(stats["prefix_cache_hit_rate"])
        assert value(m, "worker_queue_depth") == value(m, "worker_requests_running") == 0

        slow_steps(w, 0.03)  # while jobs run, a scrape sees them (read live, not at the last job's end)

        async def busy():
            jobs = [asyncio.ensure_future(run_job(w.handle, {"id": f"busy-{i}", "input": {
                "prompt": "Hi", "sampling_params": {"max_tokens": 40, "ignore_eos": True}}})) for i in range(2)]
            while (w.engine.stats()["num_running"], w.engine.stats()["num_waiting"]) != (1, 1):
                await asyncio.sleep(0.005)
            seen = await asyncio.to_thread(scrape, port)
            await asyncio.gather(*jobs)
            return seen

        seen = loop.run_until_complete(busy())
        assert value(seen, "worker_requests_running") == 1 and value(seen, "worker_queue_depth") == 1
        assert value(seen, "worker_kv_blocks_used") >= 1 and value(seen, "worker_jobs_in_flight") == 2
    finally:
        w.metrics.stop_server()


def test_the_summary_line_comes_every_interval(loop, make_worker, caplog):
    caplog.set_level(logging.INFO, logger="handler")
    w = make_worker(METRICS_LOG_INTERVAL_S="0.2")
    r = run(loop, w, {"prompt": PROMPT, "sampling_params": SURE})
    t0 = time.monotonic()
    loop.run_until_complete(asyncio.sleep(0.7))
    lines = [rec for rec in caplog.records
             if rec.name == "handler.metrics" and rec.getMessage().startswith("metrics {")]
    assert 2 <= len(lines) <= 5, [rec.getMessage() for rec in lines]
    gaps = [b.created - a.created for a, b in zip(lines, lines[1:])]
    assert all(0.15 < g < 0.45 for g in gaps), gaps
    summary = json.loads(lines[-1].getMessage().removeprefix("metrics "))
    usage = r["output"][-1]["usage"]
    assert summary["jobs"] == {"completed": 1}
    assert summary["tokens"] == {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]}
    assert summary["kv_blocks_total"] == 64 and summary["kv_blocks_used"] == 0 and summary["queue_depth"] == 0
    assert summary["ttft_s"]["count"] == 1 and summary["tpot_s"]["count"] == 1 and summary["job_s"]["mean"] > 0
    assert "prefix_cache_hit_rate" in summary and time.monotonic() - t0 < 2


def test_every_job_line_carries_its_id_and_each_job_ends_in_one_finished_line(loop, make_worker, caplog):
    caplog.set_level(logging.DEBUG, logger="handler")
    w = make_worker(LOAD_PROGRESS_INTERVAL_S="0.05")
    jobs = {
        "j-ok": {"prompt": "Hi", "sampling_params": SURE},
        "j-stream": {"messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_batch_size": 2,
                     "sampling_params": SURE},
        "j-invalid": {"prompt": "x", "sampling_params": {"temperature": -1}},
        "j-timeout": {"prompt": "Hi", "timeout_s": 0.3, "sampling_params": {"max_tokens": 240, "ignore_eos": True}},
        "j-summary": {"summarize": {"text": "Alice sends the report on Friday. " * 4, "max_tokens": 4},
                      "sampling_params": {"ignore_eos": True}},
        "j-rid": {"prompt": "Hi", "request_id": "r-1", "sampling_params": SURE},
    }

    async def main():
        return await asyncio.gather(*(run_job(w.handle, {"id": jid, "input": job}) for jid, job in jobs.items()))

    results = dict(zip(jobs, loop.run_until_complete(main())))
    results["j-rid-again"] = run(loop, w, jobs["j-rid"], "j-rid-again")
    worker_level = ("loading the model", "engine ready", "metrics ")
    finished: dict[str, list] = {}
    for rec in caplog.records:
        if not rec.name.startswith("handler"):
            continue
        msg = rec.getMessage()
        if msg.startswith(worker_level):
            assert not hasattr(rec, "job_id")
            continue
        assert getattr(rec, "job_id", None) in results and msg.startswith(f"[job {rec.job_id}] "), msg
        if hasattr(rec, "job_finished"):
            finished.setdefault(rec.job_id, []).append((rec, msg))
    assert set(finished) == set(results)
    for jid, r in results.items():
        (rec, msg), = finished[jid]  # exactly one each
        line = json.loads(msg[msg.index(' {"status"') + 1:])
        assert line == rec.job_finished
        assert {"status", "code", "prompt_tokens", "completion_tokens", "queue_s", "first_token_s", "total_s",
                "tpot_s", "cached_result"} <= set(line)
        if r["status"] == "COMPLETED":
            usage = r["output"][-1]["usage"]
            assert (line["status"], line["code"]) == ("completed", "ok")
            if jid == "j-rid-again":
                assert line["cached_result"] is True and line["completion_tokens"] == 0
                continue
            assert line["completion_tokens"] == usage["completion_tokens"] and line["first_token_s"] > 0
            assert line["prompt_tokens"] == usage["prompt_tokens"] and line["tpot_s"] > 0
            assert line["first_token_s"] <= line["total_s"]
        else:
            err = error_of(r)
            assert (line["status"], line["code"]) == ("failed", err["code"]) and err["message"] in msg
            assert rec.levelno == (logging.INFO if err["code"] == "invalid_input" else logging.WARNING)
    assert error_of(results["j-timeout"])["code"] == "timeout" and results["j-summary"]["status"] == "COMPLETED"


def reachable(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_metrics_bind_loopback_unless_another_host_is_given():
    from handler.metrics import Metrics
    from handler.settings import load_settings

    assert load_settings({}).metrics_host == "127.0.0.1"
    assert load_settings({"METRICS_HOST": "0.0.0.0"}).metrics_host == "0.0.0.0"
    for host, other in ((None, "127.0.0.2"), ("127.0.0.2", "127.0.0.1")):
        m, port = Metrics(), free_port()
        if host is None:
            m.start_server(port)
        else:
            m.start_server(port, host)
        try:
            assert reachable(host or "127.0.0.1", port) and scrape(port, host or "127.0.0.1")
            assert not reachable(other, port), f"metrics reachable on {other} too"  # 0.0.0.0 would answer there
        finally:
            m.stop_server()
    with pytest.raises(OSError, match="METRICS_HOST"):
        Metrics().start_server(free_port(), "no-such-host.invalid")


def run_worker_with_metrics(tiny_llama_dir, port: int, **extra) -> tuple[dict, str, WorkerProcess]:
    """`python -m handler` with METRICS_PORT: the scrape after two jobs, the summary line, the process."""
    env = {"MODEL_NAME": tiny_llama_dir, "MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "64", "DEFAULT_MAX_TOKENS": "8",
           "METRICS_PORT": str(port), "METRICS_LOG_INTERVAL_S": "0.3", **extra}
    host = extra.get("METRICS_HOST", "127.0.0.1")
    with FakeControlPlane() as fake:
        fake.submit({"prompt": "Hi", "sampling_params": {"ignore_eos": True}}, "a")
        fake.submit({"prompt": "x", "sampling_params": {"top_p": 7}}, "b")
        proc = WorkerProcess({**fake.worker_env(), **env})
        try:
            fake.wait_for(lambda: all(j.status in ("COMPLETED", "FAILED") for j in fake.jobs.values()), 90, "done")
            m = scrape(port, host)
            assert not reachable("127.0.0.2" if host == "127.0.0.1" else "127.0.0.1", port)
            line = proc.wait_for_line("metrics {", 10)
            proc.proc.terminate()
            proc.wait(60)
        finally:
            proc.stop()
    return m, line, proc


def test_python_m_handler_binds_metrics_host(tiny_llama_dir):
    port = free_port()
    m, _, proc = run_worker_with_metrics(tiny_llama_dir, port, METRICS_HOST="127.0.0.2")
    assert value(m, "worker_jobs_total", status="completed", code="ok") == 1
    assert f"metrics served on port {port} of 127.0.0.2" in proc.output


def test_python_m_handler_serves_metrics_on_metrics_port(tiny_llama_dir):
    port = free_port()
    m, line, proc = run_worker_with_metrics(tiny_llama_dir, port)  # no METRICS_HOST: loopback only
    assert value(m, "worker_jobs_total", status="completed", code="ok") == 1
    assert value(m, "worker_jobs_total", status="failed", code="invalid_input") == 1
    assert value(m, "worker_kv_blocks_total") == 64 and value(m, "worker_tokens_total", kind="completion") == 8
    assert f"metrics served on port {port}" in proc.output
    summary = json.loads("{" + line.split("| metrics {", 1)[1])
    assert summary["kv_blocks_total"] == 64 and "queue_depth" in summary
