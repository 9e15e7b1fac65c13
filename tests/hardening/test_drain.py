"""Drain: SIGTERM to a real worker process (the runpod SDK loop). Holding 8 jobs in flight with
more queued: the 8 complete in full, no queued job is taken, the process exits within the grace
period with every KV block free. With free slots and a job take in flight: no new take starts,
the jobs that take returns run within the drain. Jobs longer than DRAIN_TIMEOUT_S: at the
deadline each fails worker_shutdown (retryable) with its partial text, and the worker exits."""
from __future__ import annotations

import signal
import time

from tests.fakes.runpod_control_plane import FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.hardening.outcomes import assert_clean_exit, error_object, final_stats, output_text
from tests.models import TOKENIZER_TEXT

GRACE_S = 10.0  # docker stop's default before SIGKILL; the drain must fit well inside it
IN_FLIGHT, QUEUED, MAX_TOKENS = 8, 6, 160
ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "256", "MAX_CONCURRENCY": str(IN_FLIGHT), "JOB_KV_TOKENS": "64",
       "DEFAULT_BATCH_SIZE": "8", "METRICS_LOG_INTERVAL_S": "0",
       "DRAIN_TIMEOUT_S": "8"}  # the 8 jobs finish inside it (they need about 3s), and 8 < GRACE_S
STEP_DELAY_S = 0.02  # slowed engine steps: jobs that outlast the signal whatever the machine's speed


def job(i: int, stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
    return {"prompt": TOKENIZER_TEXT[i % len(TOKENIZER_TEXT)], "stream": stream, "max_batch_size": 4,
            "sampling_params": {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}}


def test_sigterm_with_8_jobs_in_flight_finishes_them_takes_nothing_more_and_exits_in_time(tiny_llama_dir, figures):
    with FakeControlPlane() as fake:
        flying = [fake.submit(job(i, stream=True), f"fly-{i}") for i in range(IN_FLIGHT)]
        queued = [fake.submit(job(i, stream=i % 2 == 0), f"queued-{i}") for i in range(QUEUED)]
        # slowed steps (160 x 10 ms): the first job cannot finish before the eighth streams
        proc = WorkerProcess({**fake.worker_env(), **ENV, "MODEL_NAME": tiny_llama_dir}, step_delay_s=0.01)
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
    assert_clean_exit(fake, proc, rc)
    assert exit_s < GRACE_S, f"the drain took {exit_s:.1f}s"
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


def test_sigterm_with_free_slots_and_a_take_in_flight_takes_nothing_new_and_runs_what_it_returns(tiny_llama_dir,
                                                                                                 figures):
    """MAX_CONCURRENCY 8 with 3 jobs in flight: the worker holds a job take open for the 5 free
    slots when SIGTERM comes; the 2 jobs that take then returns must not be lost."""
    env = {**ENV, "MAX_MODEL_LEN": "512", "DRAIN_TIMEOUT_S": "30"}
    with FakeControlPlane(hold_s=20.0) as fake:  # a take stays open until a job comes
        flying = [fake.submit(job(i, stream=True, max_tokens=200), f"fly-{i}") for i in range(3)]
        proc = WorkerProcess({**fake.worker_env(), **env, "MODEL_NAME": tiny_llama_dir}, step_delay_s=STEP_DELAY_S)
        try:
            fake.wait_for(lambda: all(fake.jobs[j].stream for j in flying), 90, "the 3 jobs streaming")
            fake.wait_for(lambda: fake.takes_held >= 1, 10, "a job take held open for the free slots")
            sent = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the signal is handled by now; the take is still in flight
            late = [fake.submit(job(i, stream=i == 0, max_tokens=16), f"late-{i}") for i in range(2)]
            rc = proc.wait(90)
            exit_s = time.monotonic() - sent
        finally:
            proc.stop()
    out = assert_clean_exit(fake, proc, rc)
    assert fake.all_final(), {j.id: j.status for j in fake.jobs.values()}  # nothing IN_PROGRESS without a result
    assert not [t for t in fake.take_times if t > sent], "a job take started after SIGTERM"
    for jid in [*flying, *late]:
        j = fake.jobs[jid]
        assert j.worker == "worker-1" and j.status == "COMPLETED", (jid, j.status_view())
        assert output_text(j.output).strip(), jid
    assert "a job take in flight when the worker stopped returned 2 job(s)" in out
    figures.set("drain_free_slots", in_flight_at_sigterm=len(flying), take_in_flight=True,
                returned_after_sigterm=len(late), completed=len(flying) + len(late), lost=0,
                exit_after_sigterm_s=round(exit_s, 2))


def test_the_drain_deadline_fails_the_jobs_still_running_worker_shutdown_with_their_partial_text(tiny_llama_dir,
                                                                                                figures):
    drain_s = 2.0
    env = {**ENV, "MAX_MODEL_LEN": "512", "DRAIN_TIMEOUT_S": str(drain_s)}
    with FakeControlPlane() as fake:  # 4 jobs of 400 tokens: about 8s each at the slowed step
        ids = [fake.submit(job(i, stream=i % 2 == 0, max_tokens=400), f"long-{i}") for i in range(4)]
        streaming = [jid for i, jid in enumerate(ids) if i % 2 == 0]
        proc = WorkerProcess({**fake.worker_env(), **env, "MODEL_NAME": tiny_llama_dir}, step_delay_s=STEP_DELAY_S)
        try:
            fake.wait_for(lambda: all(len(fake.jobs[j].stream) >= 2 for j in streaming), 90, "the jobs streaming")
            sent = time.monotonic()
            proc.proc.send_signal(signal.SIGTERM)
            rc = proc.wait(90)
            exit_s = time.monotonic() - sent
        finally:
            proc.stop()
    assert_clean_exit(fake, proc, rc)
    # the failures are posted at the deadline; the exit follows (the interpreter's own teardown, which
    # took 2-3s on a loaded CPU, comes after the results are out: a SIGKILL then loses nothing)
    ended = [fake.jobs[j].done_at - sent for j in ids]
    assert max(ended) < drain_s + 1.0, f"failures posted {max(ended):.1f}s after SIGTERM (DRAIN_TIMEOUT_S={drain_s})"
    assert exit_s < drain_s + 15, exit_s
    for jid in ids:
        j = fake.jobs[jid]
        err = error_object(j.error)
        assert j.status == "FAILED" and err is not None, (jid, j.status_view())
        assert err["code"] == "worker_shutdown" and err["retryable"] is True, err
        assert err["drain_timeout_s"] == drain_s and "DRAIN_TIMEOUT_S" in err["message"], err
        assert j.done_at - sent >= drain_s - 0.3, (jid, j.done_at - sent)  # at the deadline, not before
        streamed = output_text(j.stream) or ""
        assert err["partial_text"].strip() and err["partial_text"].startswith(streamed), (jid, err)
        assert (jid in streaming) == bool(streamed), jid
    stats = final_stats(proc.lines)
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and stats["num_running"] == stats["num_waiting"] == 0
    figures.set("drain_deadline", drain_timeout_s=drain_s, running_at_deadline=len(ids),
                failed_worker_shutdown_with_partial_text=len(ids), failed_after_sigterm_s=round(max(ended), 2),
                exit_after_sigterm_s=round(exit_s, 2))
