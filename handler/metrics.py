"""Worker metrics through prometheus_client: jobs by status and code, tokens, TTFT and TPOT
histograms, and the engine's live state (queue depth, running requests, KV blocks, prefix-cache
hits) read at scrape time; served on METRICS_HOST:METRICS_PORT, summarized in a `metrics {...}` log line."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

log = logging.getLogger("handler.metrics")

DEFAULT_HOST = "127.0.0.1"  # METRICS_HOST's default: nothing outside the worker reaches the metrics
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineCollector:
    """The engine's state as Prometheus metrics, read from `stats()` on each collection."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.metrics.engine_stats()
        if not s:
            return
        gauges = {
            "worker_queue_depth": ("Requests waiting in the engine's queue", s.get("num_waiting", 0)),
            "worker_requests_running": ("Requests running in the engine", s.get("num_running", 0)),
            "worker_kv_blocks_used": ("KV blocks held by requests",
                                      s.get("kv_blocks_total", 0) - s.get("kv_blocks_free", 0)),
            "worker_kv_blocks_free": ("Free KV blocks (cached ones included)", s.get("kv_blocks_free", 0)),
            "worker_kv_blocks_total": ("KV blocks", s.get("kv_blocks_total", 0)),
            "worker_prefix_cache_hit_rate": ("Prompt tokens found in the prefix cache / prompt tokens looked up",
                                             s.get("prefix_cache_hit_rate", 0.0)),
        }
        if "lora_slots_total" in s:  # LoRA adapters on (engine.lora.manager.LoRAManager.stats)
            gauges["worker_lora_slots_used"] = ("LoRA adapter slots on the device holding an adapter",
                                                s["lora_slots_used"])
            gauges["worker_lora_slots_total"] = ("LoRA adapter slots on the device (MAX_LORAS)", s["lora_slots_total"])
            gauges["worker_lora_adapters_cached"] = ("LoRA adapters loaded in host memory", s["lora_adapters_cached"])
        if "spec_acceptance_rate" in s:  # speculative decoding on
            gauges["worker_spec_acceptance_rate"] = ("Drafted tokens accepted / drafted tokens verified",
                                                     s["spec_acceptance_rate"])
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        counters = {
            "worker_prefix_cache_hit_tokens": ("Prompt tokens found in the prefix cache", "prefix_cache_hit_tokens"),
            "worker_prefix_cache_query_tokens": ("Prompt tokens looked up in the prefix cache",
                                                 "prefix_cache_query_tokens"),
            "worker_preemptions": ("Requests preempted (recomputed later) for KV room", "num_preemptions"),
            "worker_spec_draft_tokens": ("Tokens drafted by speculative decoding and verified", "spec_draft_tokens"),
            "worker_spec_accepted_tokens": ("Drafted tokens accepted", "spec_accepted_tokens"),
            "worker_lora_loads": ("LoRA adapters read from disk", "lora_loads"),
            "worker_lora_evictions": ("LoRA adapters moved out of a device slot for another", "lora_evictions"),
        }
        for name, (doc, key) in counters.items():
            if key in s or not key.startswith(("spec_", "lora_")):
                yield CounterMetricFamily(name, doc, value=s.get(key, 0))


class Metrics:
    """Counters and histograms of jobs and tokens, and the engine's state."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.jobs = Counter("worker_jobs", "Jobs finished, by status and error code", ["status", "code"], registry=r)
        self.job_seconds = Histogram("worker_job_duration_seconds", "Job duration", buckets=_BUCKETS, registry=r)
        self.ttft = Histogram("worker_time_to_first_token_seconds", "From job start to first token",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("worker_time_per_output_token_seconds", "Mean time per output token after the "
                              "first, per completed job", buckets=_TPOT_BUCKETS, registry=r)
        self.tokens = Counter("worker_tokens", "Tokens in (prompt) and out (completion)", ["kind"], registry=r)
        self.in_flight = Gauge("worker_jobs_in_flight", "Jobs running in the handler", registry=r)
        self.load_seconds = Gauge("worker_model_load_seconds", "Time the model load took", registry=r)
        self.concurrency = Gauge("worker_concurrency", "Concurrency the job scaler was given", registry=r)
        # jobs by LoRA adapter: its labels are LORA_MODULES' names (checked before a job runs), never a client's
        self.lora_jobs = Counter("worker_lora_jobs", "Jobs finished that ran a LoRA adapter, by adapter",
                                 ["adapter"], registry=r)
        self.empty_output_retries = Counter("worker_empty_output_retries", "Requests run again with a fresh seed "
                                            "after an empty output (EMPTY_OUTPUT_RETRIES)", registry=r)
        self._stats_fn: Callable[[], dict] | None = None
        self._last_stats: dict = {}
        self._server = None
        r.register(_EngineCollector(self))

    # -- updates ----------------------------------------------------------------------------
    def job_finished(self, status: str, code: str, seconds: float, ttft: float | None, tpot: float | None,
                     prompt_tokens: int, completion_tokens: int, adapter: str | None = None) -> None:
        self.jobs.labels(status, code).inc()
        if adapter is not None:
            self.lora_jobs.labels(adapter).inc()
        self.job_seconds.observe(seconds)
        if ttft is not None:
            self.ttft.observe(ttft)
        if tpot is not None:
            self.tpot.observe(tpot)
        self.tokens.labels("prompt").inc(prompt_tokens)
        self.tokens.labels("completion").inc(completion_tokens)

    def bind_engine(self, stats_fn: Callable[[], dict]) -> None:
        """Read the engine's state live from `stats_fn` (cheap: counts only) at each collection."""
        self._stats_fn = stats_fn

    def engine_state(self, stats: dict) -> None:
        """The engine's latest stats, used when no engine is bound."""
        self._last_stats = dict(stats)

    def engine_stats(self) -> dict:
        if self._stats_fn is not None:
            try:
                return self._stats_fn()
            except Exception:  # noqa: BLE001 - a failed read must not break a scrape
                log.debug("engine stats could not be read", exc_info=True)
        return self._last_stats

    # -- output -----------------------------------------------------------------------------
    def start_server(self, port: int, addr: str = DEFAULT_HOST) -> None:
        """Serve /metrics on `addr`:`port` (METRICS_HOST, METRICS_PORT): loopback unless told otherwise."""
        from prometheus_client import start_http_server

        try:
            self._server = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise OSError(f"METRICS_HOST={addr!r}, METRICS_PORT={port}: cannot serve metrics there: {exc}") from exc
        log.info("metrics served on port %d of %s (/metrics)", port, addr)

    def stop_server(self) -> None:
        if isinstance(self._server, tuple):
            self._server[0].shutdown()
            self._server[0].server_close()
        self._server = None

    def summary(self) -> dict:
        """Totals and the engine's state, for the summary log line."""
        out: dict = {"jobs": {}, "tokens": {}}
        hist: dict[str, dict] = {}
        for metric in self.registry.collect():
            for s in metric.samples:
                if s.name.endswith("_created"):
                    continue
                if s.name == "worker_jobs_total":
                    key = s.labels["status"] + ("" if s.labels["code"] == "ok" else ":" + s.labels["code"])
                    out["jobs"][key] = int(s.value)
                elif s.name == "worker_tokens_total":
                    out["tokens"][s.labels["kind"]] = int(s.value)
                elif s.name == "worker_lora_jobs_total":
                    out.setdefault("lora_jobs", {})[s.labels["adapter"]] = int(s.value)
                elif metric.type == "histogram":
                    h = hist.setdefault(metric.name, {"buckets": []})
                    if s.name.endswith("_bucket"):
                        h["buckets"].append((float(s.labels["le"]), s.value))
                    else:
                        h[s.name.rsplit("_", 1)[1]] = s.value
                elif metric.type in ("gauge", "counter") and s.name.startswith("worker_"):
                    key = s.name.removeprefix("worker_")
                    key = key.removesuffix("_total") if metric.type == "counter" else key
                    out[key] = int(s.value) if float(s.value).is_integer() else round(s.value, 4)
        for name, short in (("worker_job_duration_seconds", "job_s"), ("worker_time_to_first_token_seconds", "ttft_s"),
                            ("worker_time_per_output_token_seconds", "tpot_s")):
            out[short] = _histogram_summary(hist.get(name, {}))
        return out

    async def log_every(self, interval_s: float) -> None:
        """Log `metrics {json}` every `interval_s` seconds (for serverless, where nothing scrapes)."""
        while True:
            await asyncio.sleep(interval_s)
            log.info("metrics %s", json.dumps(self.summary()))


def _histogram_summary(h: dict) -> dict:
    """count, mean, and the bucket bounds holding the median and the 90th percentile."""
    count = int(h.get("count", 0))
    if not count:
        return {"count": 0}
    out = {"count": count, "mean": round(h.get("sum", 0.0) / count, 5)}
    for q, key in ((0.5, "p50_le"), (0.9, "p90_le")):
        bound = next((le for le, c in sorted(h["buckets"]) if c >= q * count), float("inf"))
        out[key] = bound if bound != float("inf") else "+Inf"
    return out
