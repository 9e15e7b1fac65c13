"""Drain: SIGTERM to a real worker process (the runpod SDK loop) holding 8 jobs in flight with
more queued: the 8 complete in full, no queued job is taken, the process exits within the grace
period with every KV block free."""
from __future__ import annotations

import signal
import time

from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.hardening.outcomes import final_stats, log_problems, output_text
from tests.models import TOKENIZER_TEXT

GRACE_S = 10.0  # docker stop's default before SIGKILL; the drain must fit well inside it
IN_FLIGHT, QUEUED, MAX_TOKENS = 8, 6, 160
ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "256", "MAX_CONCURRENCY": str(IN_FLIGHT), "JOB_KV_TOKENS": "64",
       "DEFAULT_BATCH_SIZE": "8", "METRICS_LOG_INTERVAL_S": "0"}


def job(i: int, stream: bool) -> dict:
    return {"prompt": TOKENIZER_TEXT[i % len(TOKENIZER_TEXT)], "stream": stream, "max_batch_size": 4,
            "sampling_params": {"max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}}


def test_sigterm_with_8_jobs_in_flight_finishes_them_takes_nothing_more_and_exits_in_time(tiny_llama_dir, figures):
    with FakeControlPlane() as fake:
        flying = [fake.submit(job(i, stream=True), f"fly-{i}") for i in range(IN_FLIGHT)]
        queued = [fake.submit(job(i, stream=i % 2 == 0), f"queued-{i}") for i in range(QUEUED)]
        proc = WorkerProcess({**fake.worker_env(), **ENV, "MODEL_NAME": tiny_llama_dir})
        try:
            fake.wait_for(lambda: all(fake.jobs[j].stream for j in flying), 90, "the 8 jobs streaming")
            with fake.cond:
                assert all(fake.jobs[j].status == "IN_PROGRESS" for j in flying)
                assert all(fake.jobs[j].status == "IN_QUEUE" for j in queued)  # MAX_CONCURRENCY holds 8
            sent = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            late = fake.submit(job(0, stream=False), "after-sigterm")
            rc = proc.wait(GRACE_S + 30)
            exit_s = time.monotonic() - sent
        finally:
            proc.stop()
    out = proc.output
    assert rc == 0, out[-3000:]
    assert exit_s < GRACE_S, f"the drain took {exit_s:.1f}s"
    assert fake.violations == [] and not log_problems(out), (fake.violations, log_problems(out))
    for jid in flying:
        j = fake.jobs[jid]
        assert j.status == "COMPLETED" and j.done_at > sent, (jid, j.status_view())  # in flight at SIGTERM
        last = j.output[-1]
        assert last["finish_reason"] == "length" and last["usage"]["completion_tokens"] == MAX_TOKENS, jid
        assert output_text(j.output).strip() and j.stream == j.output, jid
    for jid in [*queued, late]:
        assert fake.jobs[jid].status == "IN_QUEUE" and fake.jobs[jid].worker is None, jid  # never taken
    stats = final_stats(proc.lines)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["num_running"] == stats["num_waiting"] == 0
    figures.set("drain", in_flight_at_sigterm=IN_FLIGHT, queued=QUEUED + 1, completed=IN_FLIGHT, taken_after=0,
                exit_after_sigterm_s=round(exit_s, 2), grace_s=GRACE_S)
