"""`python -m handler`: validate the settings, then serve jobs through
runpod.serverless.start (or run one job locally with --test_input, serve
RunPod's /v2 REST API on this machine with --serve, or serve plain HTTP as a
load-balancing endpoint's worker with --load-balancing or LOAD_BALANCING=true)."""
from __future__ import annotations

import time

PROCESS_START = time.monotonic()

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

log = logging.getLogger("handler")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m handler", add_help=True,
                                description="RunPod serverless LLM worker. Other --rp_* flags go to the runpod SDK.")
    p.add_argument("--test_input", default=None, help='run one job locally, e.g. \'{"input": {"prompt": "Hi"}}\'')
    p.add_argument("--print-settings", action="store_true", help="print the settings table (Markdown) and exit")
    p.add_argument("--print-worker-vllm-settings", action="store_true", help="print the table of worker-vllm's "
                   "variables and what this worker does with each (Markdown) and exit")
    p.add_argument("--serve", action="store_true", help="serve RunPod's /v2/<endpoint_id> REST API (run, runsync, "
                   "status, stream, cancel, health, openai/v1) locally, jobs run on this worker")
    p.add_argument("--load-balancing", action="store_true", help="serve as a RunPod load-balancing endpoint's "
                   "worker (as LOAD_BALANCING=true): OpenAI routes under /v1 and POST /runsync on PORT, GET /ping "
                   "on PORT_HEALTH")
    p.add_argument("--host", default=None, help="--serve: the address to listen on (default 127.0.0.1); "
                   "--load-balancing: default 0.0.0.0")
    p.add_argument("--port", type=int, default=8000, help="--serve: the port (default 8000)")
    return p


def _load_first(worker) -> int:
    """A worker with MODEL_NAME loads its model before taking any job; one that cannot load
    takes none and exits non-zero (RunPod marks it unhealthy), its log naming the setting and
    the cause: 2 for a setting the model refuses (as any bad setting), 1 for the load itself.
    The embedded default model loads on the first job (prepared once, then cached)."""
    from handler.errors import JobError
    from handler.engine_setup import load_failure_exit

    settings = worker.settings
    if not settings.model_name:
        return 0
    try:
        worker.loader.load_now()
    except JobError as exc:
        return load_failure_exit(settings, exc)
    return 0


def main(argv: list[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    from handler.logs import configure_logging
    from handler.settings import SettingsError, apply_base_path, describe, load_settings, settings_markdown

    if args.print_settings:
        sys.stdout.write(settings_markdown())
        return 0
    if args.print_worker_vllm_settings:
        from handler.worker_vllm_names import markdown

        sys.stdout.write(markdown())
        return 0
    configure_logging("info")  # until LOG_LEVEL itself is checked
    try:
        settings = load_settings()
        configure_logging(settings.log_level)
        from handler.engine_setup import check_engine_settings

        check_engine_settings(settings)
    except SettingsError as exc:
        log.error("invalid setting: %s", exc)
        return 2
    apply_base_path(settings)  # HF_HOME, the kernels' tuning and Triton's caches under BASE_PATH
    log.info("settings %s", describe(settings))
    from handler.settings import SETTINGS_BY_NAME
    from handler.worker_vllm_env import start_notes

    for note in start_notes(os.environ, SETTINGS_BY_NAME):  # worker-vllm's variables this worker does not apply
        log.warning("%s", note)

    from handler.worker import Worker

    if args.serve:
        from handler.http.jobs import JobStore
        from handler.http.server import serve

        store = JobStore.for_settings(settings)
        worker = Worker(settings, progress=store.progress)
        return _load_first(worker) or serve(worker, store, args.host or "127.0.0.1", args.port)
    if args.load_balancing or settings.load_balancing:
        from handler.http.lb_server import serve_load_balanced

        return serve_load_balanced(Worker(settings), args.host or "0.0.0.0")  # loads while /ping says 204
    serve_api = "--rp_serve_api" in rest
    local = args.test_input is not None or (not serve_api and not os.environ.get("RUNPOD_WEBHOOK_GET_JOB"))
    if local:
        from handler.local import run_local

        return run_local(Worker(settings), args.test_input, PROCESS_START)

    import runpod

    from handler.runpod_loop.fitness import configure_fitness_checks
    from handler.runpod_loop.scaler import start

    worker = Worker(settings, progress=runpod.serverless.progress_update)
    failed = _load_first(worker)
    if failed:
        return failed
    if settings.metrics_port:
        worker.metrics.start_server(settings.metrics_port, settings.metrics_host)
    sys.argv = [sys.argv[0], *rest]  # the SDK parses its own --rp_* flags
    configure_fitness_checks()  # the SDK's start-up checks, its public-DNS one only a warning
    # runpod.serverless.start with our job loop: per-job parsing of takes, a drain with a deadline
    start(worker.runpod_config(), worker.drain)
    worker.close()
    replaced = worker.dead is not None or bool(worker.sdk_config and worker.sdk_config.get("refresh_worker"))
    return 1 if replaced else 0


if __name__ == "__main__":
    sys.exit(main())
