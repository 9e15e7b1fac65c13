"""Worker metrics through prometheus_client: served on METRICS_PORT when set,
otherwise summarized in a log line."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    """Counters and histograms of jobs and tokens, gauges of the engine's state."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs = Counter("worker_jobs", "Jobs finished, by status and error code", ["status", "code"], registry=r)
        self.job_seconds = Histogram("worker_job_duration_seconds", "Job duration", buckets=_BUCKETS, registry=r)
        self.ttft = Histogram("worker_time_to_first_token_seconds", "From job start to first token",
                              buckets=_BUCKETS, registry=r)
        self.tokens = Counter("worker_tokens", "Tokens processed", ["kind"], registry=r)
        self.in_flight = Gauge("worker_jobs_in_flight", "Jobs running in the handler", registry=r)
        self.kv_free = Gauge("worker_kv_blocks_free", "Free KV blocks (cached ones included)", registry=r)
        self.kv_total = Gauge("worker_kv_blocks_total", "KV blocks", registry=r)
        self.engine_running = Gauge("worker_engine_running", "Requests running in the engine", registry=r)
        self.engine_waiting = Gauge("worker_engine_waiting", "Requests waiting in the engine", registry=r)
        self.load_seconds = Gauge("worker_model_load_seconds", "Time the model load took", registry=r)
        self.concurrency = Gauge("worker_concurrency", "Concurrency the job scaler was given", registry=r)

    def job_finished(self, status: str, code: str, seconds: float, ttft: float | None,
                     prompt_tokens: int, completion_tokens: int) -> None:
        self.jobs.labels(status, code).inc()
        self.job_seconds.observe(seconds)
        if ttft is not None:
            self.ttft.observe(ttft)
        self.tokens.labels("prompt").inc(prompt_tokens)
        self.tokens.labels("completion").inc(completion_tokens)

    def engine_state(self, stats: dict) -> None:
        self.kv_free.set(stats.get("kv_blocks_free", 0))
        self.kv_total.set(stats.get("kv_blocks_total", 0))
        self.engine_running.set(stats.get("num_running", 0))
        self.engine_waiting.set(stats.get("num_waiting", 0))

    def serve(self, port: int) -> None:
        from prometheus_client import start_http_server

        start_http_server(port, registry=self.registry)
        log.info("metrics served on port %d", port)

    def summary(self) -> dict:
        """Totals for the summary log line."""
        out: dict = {"jobs": {}, "tokens": {}}
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name == "worker_jobs_total":
                    key = s.labels["status"] + ("" if s.labels["code"] == "ok" else ":" + s.labels["code"])
                    out["jobs"][key] = int(s.value)
                elif s.name == "worker_tokens_total":
                    out["tokens"][s.labels["kind"]] = int(s.value)
                elif s.name in ("worker_job_duration_seconds_sum", "worker_job_duration_seconds_count"):
                    out[s.name.removeprefix("worker_job_duration_")] = round(s.value, 3)
                elif s.name in ("worker_kv_blocks_free", "worker_kv_blocks_total", "worker_jobs_in_flight"):
                    out[s.name.removeprefix("worker_")] = int(s.value)
        return out
