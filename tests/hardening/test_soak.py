"""Soak: hundreds of jobs through the real runpod SDK worker loop (`python -m handler`) against
the fake control plane, arriving in waves: prompts and chats of mixed lengths, streamed and
not, OpenAI routes, priorities, cancellations (queued and running), invalid inputs, timeouts,
prompts too long, repeated request_ids. Figures: jobs lost, COMPLETED with empty output,
failures without a code, KV blocks not free at exit, resident memory growth (all but the last 0).
CI runs 120 jobs; HARDENING_FULL=1 runs 600."""
from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest

from tests.fakes.runpod_control_plane import FINAL, FakeControlPlane
from tests.fakes.worker_process import WorkerProcess
from tests.hardening.conftest import FULL, size
from tests.hardening.outcomes import error_object, final_stats, log_problems, output_text, rss_mb
from tests.models import TOKENIZER_TEXT

JOBS = size(120, 600)
SEED = 1234
# over the second half of the jobs: the worker's own state must not grow with the number of jobs. The
# first half warms what is bounded but filled as shapes arrive: e.g. the CPU matmul's kernel per row-count
# bucket (llm_kernels/dense.py; unbucketed it grew ~0.25 MB a job here without end)
RSS_GROWTH_LIMIT_MB = 64.0
ENV = {"MAX_MODEL_LEN": "256", "NUM_KV_BLOCKS": "96", "BLOCK_SIZE": "16", "MAX_CONCURRENCY": "24",
       "JOB_KV_TOKENS": "64", "DEFAULT_MAX_TOKENS": "16", "DEFAULT_BATCH_SIZE": "8", "METRICS_LOG_INTERVAL_S": "0",
       "RESULT_CACHE_SIZE": "64"}
WORDS = " ".join(TOKENIZER_TEXT).split()
OK = {"ok", "empty_output"}  # a random model may say nothing but whitespace: that must fail, never complete

def nested(depth: int):
    value = "deep"
    for _ in range(depth):
        value = [value]
    return value


INVALID = [  # (input, the field the error must name)
    ({"prompt": 5}, "prompt"), ({"prompt": ""}, "prompt"), ({"promt": "typo"}, "promt"),
    ({"prompt": "x", "sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"prompt": "x", "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ({"prompt": "x", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ({"prompt": "x", "sampling_params": {"stop_token_ids": [-1]}}, "sampling_params.stop_token_ids"),
    ({"messages": []}, "messages"), ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"prompt": "x", "stream": "yes"}, "stream"), ({"prompt": "x", "priority": "high"}, "priority"),
    ({"prompt": "x\ud800y"}, "prompt"), ({"openai_route": "/v1/nope", "openai_input": {}}, "openai_route"),
    ({"prompt": "x", "timeout_s": -1}, "timeout_s"), ({"prompt": "x", "max_batch_size": 0}, "max_batch_size"),
    ({"prompt": "x", "on_truncation": "drop"}, "on_truncation"), ("not an object", "input"),
    ({"prompt": nested(40)}, "prompt"),
]


@dataclass
class Planned:
    id: str
    input: object
    kind: str
    expect: set
    field: str | None = None
    cancel: str | None = None  # "queued" | "running"
    same_as: str | None = None  # an earlier job with the same request_id and input


def _words(rng: random.Random, lo: int, hi: int) -> str:
    start = rng.randrange(len(WORDS))
    return " ".join(WORDS[(start + k) % len(WORDS)] for k in range(rng.randint(lo, hi)))


def _sampling(rng: random.Random, max_tokens: int) -> dict:
    p = {"max_tokens": max_tokens, "ignore_eos": rng.random() < 0.8}
    if rng.random() < 0.5:
        p["temperature"] = 0
    else:
        p.update(temperature=rng.uniform(0.5, 1.2), top_p=rng.uniform(0.7, 1.0), seed=rng.randrange(1000))
    return p


def plan_jobs(n: int, rng: random.Random) -> list[Planned]:
    kinds = ["prompt"] * 24 + ["stream"] * 20 + ["chat"] * 10 + ["openai"] * 10 + ["invalid"] * 10 + \
            ["cancel"] * 8 + ["rid"] * 10 + ["timeout"] * 3 + ["too_long"] * 3 + ["truncate"] * 4
    plans: list[Planned] = []
    for i in range(n):
        kind, jid = rng.choice(kinds), f"soak-{i:04d}"
        if kind == "cancel" and i >= n * 0.8:
            kind = "stream"
        prio = rng.randint(-3, 3)
        mt = rng.randint(1, 40)
        if kind == "prompt":
            plans.append(Planned(jid, {"prompt": _words(rng, 1, 40), "priority": prio,
                                       "sampling_params": _sampling(rng, mt)}, kind, OK))
        elif kind == "stream":
            plans.append(Planned(jid, {"prompt": _words(rng, 1, 50), "stream": True, "priority": prio,
                                       "max_batch_size": rng.randint(1, 8), "sampling_params": _sampling(rng, mt)},
                                 kind, OK))
        elif kind == "chat":
            msgs = [{"role": "system", "content": _words(rng, 1, 10)}, {"role": "user", "content": _words(rng, 1, 40)}]
            plans.append(Planned(jid, {"messages": msgs, "stream": rng.random() < 0.5, "priority": prio,
                                       "sampling_params": _sampling(rng, mt)}, kind, OK))
        elif kind == "openai":
            chat = rng.random() < 0.5
            oi = {"model": "tiny", "max_tokens": mt, "stream": rng.random() < 0.5, "ignore_eos": True,
                  "temperature": 0}
            oi.update({"messages": [{"role": "user", "content": _words(rng, 1, 30)}]} if chat
                      else {"prompt": _words(rng, 1, 30)})
            route = "/v1/chat/completions" if chat else "/v1/completions"
            plans.append(Planned(jid, {"openai_route": route, "openai_input": oi}, kind, OK))
        elif kind == "invalid":
            job_input, fieldname = rng.choice(INVALID)
            plans.append(Planned(jid, job_input, kind, {"invalid_input"}, field=fieldname))
        elif kind == "cancel":  # long, and not among the last jobs: it runs among others until stopped
            plans.append(Planned(jid, {"prompt": _words(rng, 1, 3), "stream": True, "max_batch_size": 1,
                                       "sampling_params": {"max_tokens": 240, "ignore_eos": True}}, kind,
                                 {"cancelled"}, cancel=rng.choice(["queued", "running"])))
        elif kind == "rid":
            earlier = [p for p in plans if p.kind == "rid" and p.same_as is None and p.field is None]  # originals
            if earlier and rng.random() < 0.6:
                first = rng.choice(earlier)
                if rng.random() < 0.7:  # the same input again: the stored (or running) result
                    plans.append(Planned(jid, dict(first.input), kind, OK, same_as=first.id))
                else:  # other input under a used id: refused (or run, if the first one failed and let go)
                    other = {**first.input, "prompt": _words(rng, 2, 10)}
                    plans.append(Planned(jid, other, kind, OK | {"invalid_input"}, field="request_id"))
            else:
                plans.append(Planned(jid, {"prompt": _words(rng, 1, 30), "request_id": f"rid-{i}",
                                           "sampling_params": {"max_tokens": mt, "temperature": 0,
                                                               "ignore_eos": True}}, kind, OK))
        elif kind == "timeout":
            plans.append(Planned(jid, {"prompt": _words(rng, 1, 10), "timeout_s": 0.2, "stream": rng.random() < 0.5,
                                       "sampling_params": {"max_tokens": 200, "ignore_eos": True}}, kind,
                                 {"timeout", "ok"}))
        elif kind == "too_long":
            plans.append(Planned(jid, {"prompt": "fox " * rng.randint(300, 600)}, kind, {"prompt_too_long"}))
        else:  # truncate: the "error" policy fails a job that hit max_tokens
            plans.append(Planned(jid, {"prompt": _words(rng, 1, 20), "on_truncation": "error",
                                       "sampling_params": {"max_tokens": mt, "ignore_eos": True}}, kind,
                                 {"truncated", "empty_output"}))
    return plans


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.samples, self.stop = pid, [], threading.Event()

    def run(self):
        while not self.stop.wait(0.25):
            value = rss_mb(self.pid)
            if value is not None:
                self.samples.append(value)


def outcome(job) -> str:
    if job.status == "COMPLETED":
        return "ok" if (output_text(job.output) or "").strip() else "completed_empty"
    if job.status == "CANCELLED":
        return "cancelled"
    if job.status == "FAILED":
        err = error_object(job.error)
        return err["code"] if err else "failed_without_code"
    return "lost"


@pytest.mark.slow
def test_soak_through_the_sdk_worker_loop(tiny_llama_dir, figures):
    rng = random.Random(SEED)
    plans = plan_jobs(JOBS, rng)
    limit_s = 120 + JOBS * (1.0 if FULL else 0.6)
    t0 = time.monotonic()
    with FakeControlPlane(hold_s=2.0) as fake:  # long polls: a stop reaches the worker at once, as on RunPod
        proc = WorkerProcess({**fake.worker_env(), **ENV, "MODEL_NAME": tiny_llama_dir})
        rss = RssSampler(proc.proc.pid)
        rss.start()
        try:
            submitted, running_cancels, warm_rss = 0, [], None
            while time.monotonic() - t0 < limit_s:
                with fake.cond:
                    waiting = len(fake.queue)
                    done = sum(j.status in FINAL for j in fake.jobs.values())
                if submitted < len(plans) and waiting < 8:  # the next wave
                    for p in plans[submitted: submitted + rng.randint(1, 20)]:
                        with fake.cond:  # a queued cancel lands before any worker can take the job
                            fake.submit(p.input, p.id)
                            if p.cancel == "queued":
                                fake.cancel(p.id)
                        if p.cancel == "running":
                            running_cancels.append(p.id)
                        submitted += 1
                for jid in [j for j in running_cancels if fake.jobs[j].stream]:
                    fake.cancel(jid)  # it is streaming: the worker holds it
                    running_cancels.remove(jid)
                if warm_rss is None and done >= len(plans) // 2 and rss.samples:
                    warm_rss = rss.samples[-1]
                if submitted == len(plans) and not running_cancels and fake.all_final():
                    break
                time.sleep(0.02)
            run_s = time.monotonic() - t0
            end_rss = rss_mb(proc.proc.pid)
            proc.proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            rc = proc.wait(60)
            exit_s = time.monotonic() - sent
        finally:
            rss.stop.set()
            proc.stop()
    out = proc.output

    outcomes = {p.id: outcome(fake.jobs[p.id]) if p.id in fake.jobs else "lost" for p in plans}
    unexpected = []
    for p in plans:
        job, got = fake.jobs.get(p.id), outcomes[p.id]
        if got not in p.expect:
            unexpected.append((p.id, p.kind, got, job.status_view() if job else None))
            continue
        if got == "invalid_input":
            err = error_object(job.error)
            if not (err.get("field") or "").startswith(p.field):
                unexpected.append((p.id, p.kind, f"field {err.get('field')!r}, not {p.field!r}", err))
        if job.status == "COMPLETED" and job.stream != job.output:
            unexpected.append((p.id, p.kind, "streamed items differ from the output", None))
        if p.same_as and got == "ok" and outcomes[p.same_as] == "ok":
            if output_text(job.output) != output_text(fake.jobs[p.same_as].output):
                unexpected.append((p.id, p.kind, f"text differs from {p.same_as} (same request_id)", None))
    counts = Counter(outcomes.values())
    stopped = out.count("| Job stopped.")  # the SDK's log line when it cancels a running job's task
    stats = final_stats(proc.lines)
    kv_not_free = stats["kv_blocks_total"] - stats["kv_blocks_free"]
    growth = round(end_rss - warm_rss, 1) if end_rss and warm_rss else None
    figures.set("soak", jobs=len(plans), wall_s=round(run_s, 1), jobs_per_s=round(len(plans) / run_s, 2),
                lost=counts["lost"], completed_empty=counts["completed_empty"],
                failed_without_code=counts["failed_without_code"], unexpected=len(unexpected),
                kv_blocks_not_free_at_exit=kv_not_free, rss_warm_mb=round(warm_rss or 0, 1),
                rss_end_mb=round(end_rss or 0, 1), rss_peak_mb=round(max(rss.samples, default=0), 1),
                rss_growth_mb=growth, outcomes=dict(sorted(counts.items())),
                kinds=dict(sorted(Counter(p.kind for p in plans).items())),
                running_jobs_stopped=stopped, results_after_cancel=sum(j.late_results for j in fake.jobs.values()),
                exit_code=rc, exit_after_sigterm_s=round(exit_s, 2))

    assert counts["lost"] == 0, [p.id for p in plans if outcomes[p.id] == "lost"]
    assert counts["completed_empty"] == 0 and counts["failed_without_code"] == 0, counts
    assert unexpected == [], unexpected[:10]
    late = [(p.id, p.kind, p.cancel, fake.jobs[p.id].status) for p in plans if fake.jobs[p.id].late_results]
    # a job that ends before its stop reaches the worker posts its result, which RunPod ignores (the job
    # stays CANCELLED); any other second result is a bug
    late = [(p.id, p.kind, fake.jobs[p.id].status) for p in plans if fake.jobs[p.id].late_results]
    assert [x for x in late if x[1] != "cancel"] == [], late
    for p in plans:
        if p.cancel == "running":  # stopped in the worker, or finished before the stop came
            assert f"{p.id} | Job stopped." in out or fake.jobs[p.id].late_results == 1, p.id
    assert fake.violations == [] and not log_problems(out), (fake.violations, log_problems(out)[:5])
    assert rc == 0, out[-3000:]
    assert kv_not_free == 0 and stats["num_running"] == stats["num_waiting"] == stats["num_streams"] == 0, stats
    assert growth is not None and growth < RSS_GROWTH_LIMIT_MB, (warm_rss, end_rss)
    for kind in ("ok", "invalid_input", "cancelled", "prompt_too_long"):
        assert counts[kind] > 0, counts  # the mix really ran
