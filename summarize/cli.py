"""`summarize` (also `python -m summarize`): summaries of files, folders or JSONL documents,
on the local engine or a RunPod endpoint, appended to a JSONL as they finish; a rerun resumes."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from summarize.names import shown

log = logging.getLogger("summarize")

EPILOG = """\
Each document gets one line in --out: {"doc", "status": ok|truncated|failed, "summary", "chunks",
"usage", "error", ...}. A rerun with the same --out skips documents already done (same name, same
content) and retries the failed ones. Local mode uses the worker's settings (MODEL_NAME, MAX_MODEL_LEN,
...); endpoint mode needs RUNPOD_API_KEY (or --api-key), RUNPOD_ENDPOINT_BASE_URL changes the API's
address. With --batch the documents go through RunPod's batch jobs API (beta): results may take hours;
Ctrl-C leaves the batches running, and a rerun with the same --out collects them (recorded in
OUT.batches) instead of submitting the documents again.

Exit status: 0 every document done; 1 some document failed and a rerun retries it; 3 every document
that can be read is done, but some can never succeed as they are (empty, binary, not UTF-8, a bad
JSONL record, a repeated name, a link out of the folder, not a regular file such as a FIFO or a
device, larger than --max-file-bytes: fix or remove them, or pass
--skip-unreadable, which leaves them out and exits 0); 2 the run could not start; 130 interrupted.
"""
EXIT_FAILED = 1  # a document failed; a rerun retries it
EXIT_UNREADABLE = 3  # only documents that can never succeed as they are failed
CONCURRENCY = 8  # --concurrency's default
JOB_TIMEOUT_S = 1800.0  # --job-timeout's default


def _positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value
    return parse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="summarize", description="Summarize documents in batch, locally or on a "
                                "RunPod endpoint.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help='files, folders (read recursively) or .jsonl files of {"id", "text"} records')
    p.add_argument("--follow-links", action="store_true", help="in a folder, also read symbolic links that lead "
                   "out of it (default: such a link is a failed document)")
    p.add_argument("--max-file-bytes", type=_positive(int), default=None, metavar="N",
                   help="a file larger than this is not read: a failed line (default 256 MiB)")
    p.add_argument("--skip-unreadable", action="store_true", help="leave out documents that can never succeed "
                   "as they are (empty, binary, undecodable, ...): no line in --out, exit 0 (default: a failed "
                   "line each, exit 3)")
    p.add_argument("--out", required=True, help="results JSONL (appended to; a rerun resumes from it)")
    p.add_argument("--report", help="also write a Markdown report of every document here")
    p.add_argument("--endpoint", metavar="ID", help="RunPod endpoint id; without it, the local engine runs here")
    p.add_argument("--batch", action="store_true", help="with --endpoint: submit every document through RunPod's "
                   "batch jobs API (beta; for large folders that can wait hours) instead of one /run job each; "
                   "an interrupted run leaves its batches running and a rerun collects them")
    p.add_argument("--fallback-endpoint", metavar="ID", help="RunPod endpoint that gets each document failing "
                   "`overloaded` (the worker's queue was full) at once, with the same API key and base URL")
    p.add_argument("--api-key", help="RunPod API key (default: $RUNPOD_API_KEY)")
    p.add_argument("--base-url", help="RunPod API base (default: $RUNPOD_ENDPOINT_BASE_URL, else the public /v2)")
    p.add_argument("--concurrency", type=_positive(int), help=f"documents in flight at once (default {CONCURRENCY}; "
                   "not with --batch, where every document is submitted at once)")
    p.add_argument("--max-summary-tokens", type=_positive(int), help="longest summary, in tokens (default: the "
                   "worker's, 256)")
    p.add_argument("--style", choices=("bullets", "paragraph"), default="bullets", help="summary form (default "
                   "bullets)")
    p.add_argument("--instructions", help="extra instructions for the model (e.g. 'Answer in English.')")
    p.add_argument("--retries", type=int, default=3, help="retries of a document whose failure is retryable "
                   "(out_of_memory, overloaded, timeout, engine_dead); default 3")
    p.add_argument("--backoff", type=float, default=2.0, help="seconds before the first retry, doubling (default 2)")
    p.add_argument("--job-timeout", type=_positive(float), help="endpoint mode: seconds one job may take before it "
                   f"is cancelled and retried (default {JOB_TIMEOUT_S:g}; not with --batch)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when stderr is a terminal)")
    p.add_argument("-v", "--verbose", action="store_true", help="log the worker's and engine's info lines")
    return p


def _flag_error(args: argparse.Namespace) -> str | None:
    """Flags that do not go together, as `invalid_flag: ...` naming them; None when they do."""
    if not args.batch:
        return None
    if not args.endpoint:
        return "invalid_flag: --batch needs --endpoint ID (batch jobs run on a RunPod endpoint)"
    for flag, value, why in (
            ("--fallback-endpoint", args.fallback_endpoint, "a batch's requests wait for the endpoint's batch "
             "workers; none is refused `overloaded`"),
            ("--concurrency", args.concurrency, "a batch holds every document at once"),
            ("--job-timeout", args.job_timeout, "RunPod schedules a batch's requests, within hours; each has the "
             "endpoint's own execution timeout")):
        if value is not None:
            return f"invalid_flag: {flag} does not apply with --batch ({why})"
    return None


def _endpoint_runner(args, endpoint: str, notify):
    from summarize.endpoint import EndpointRunner

    return EndpointRunner(endpoint, api_key=args.api_key, base_url=args.base_url,
                          concurrency=args.concurrency or CONCURRENCY, job_timeout_s=args.job_timeout or JOB_TIMEOUT_S,
                          notify=notify)


def _make_runner(args: argparse.Namespace, notify):
    """The runner of the flags: batch jobs, endpoint jobs (with a fallback), or the local engine."""
    if args.batch:
        from summarize.batch_runner import BatchRunner

        return BatchRunner(args.endpoint, results_path=args.out, api_key=args.api_key, base_url=args.base_url,
                           notify=notify)
    runner = _endpoint_runner(args, args.endpoint, notify) if args.endpoint else _local_runner(notify)
    if args.fallback_endpoint:
        from summarize.fallback import FallbackRunner

        runner = FallbackRunner(runner, _endpoint_runner(args, args.fallback_endpoint, notify), notify=notify)
    return runner


def _local_runner(notify):
    from handler.engine_setup import check_engine_settings
    from handler.settings import apply_base_path, load_settings
    from summarize.local import LocalRunner

    settings = load_settings()
    check_engine_settings(settings)
    apply_base_path(settings)  # as the worker does
    return LocalRunner(settings, notify=notify)


async def _run(batch, runner, done) -> None:
    try:
        await batch.run(done)
    finally:
        await runner.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = logging.getLogger()
    level = root.level
    try:
        return _main(args)
    except KeyboardInterrupt:  # before the run started (or while its report was written)
        sys.stderr.write("summarize: interrupted\n")
        return 130
    finally:
        root.setLevel(level)  # main() may run inside another program (or a test session)


def _main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from handler.logs import configure_logging
    from handler.settings import SettingsError
    from summarize.inputs import MAX_FILE_BYTES, InputError, collect
    from summarize.report import closing_summary, markdown_report
    from summarize.runner import Batch, FatalError, Options
    from summarize.store import ResultStore, StoreError, write_atomic

    configure_logging("info" if args.verbose else "warning")

    def notify(message: str) -> None:  # one line, whatever the names in it hold
        tqdm.write(f"summarize: {shown(message)}", file=sys.stderr)

    def fail(message: str) -> int:
        sys.stderr.write(f"summarize: error: {shown(message)}\n")
        return 2

    from summarize.batch_state import state_path

    if (clash := _flag_error(args)) is not None:
        return fail(clash)
    try:
        docs = collect(args.inputs, exclude=[args.out, args.report, state_path(args.out)],
                       follow_links=args.follow_links, max_file_bytes=args.max_file_bytes or MAX_FILE_BYTES)
    except InputError as exc:
        return fail(str(exc))
    skipped = [d for d in docs if _never(d)] if args.skip_unreadable else []
    if skipped:
        docs = [d for d in docs if not _never(d)]
        notify(f"left out {len(skipped)} documents that cannot be read (--skip-unreadable): " + ", ".join(
            f"{d.doc} ({d.error['code']})" for d in skipped[:10]) + (", ..." if len(skipped) > 10 else ""))
    if not docs:
        return fail("no documents in " + ", ".join(args.inputs) + (" that can be read" if skipped else ""))
    # a batch holds every document at once; elsewhere --concurrency bounds the documents in flight
    options = Options(style=args.style, instructions=args.instructions, max_summary_tokens=args.max_summary_tokens,
                      concurrency=len(docs) if args.batch else args.concurrency or CONCURRENCY,
                      retries=max(0, args.retries), backoff_s=max(0.0, args.backoff))
    try:
        runner = _make_runner(args, notify)  # before store.open(): the batch runner reads the file as it was
    except (FatalError, SettingsError) as exc:
        return fail(str(exc))
    except ImportError as exc:  # the worker's own dependencies (the `worker` extra)
        return fail(f"{exc}; install the worker's dependencies: pip install 'runpod-llm-worker[worker]'")
    store = ResultStore(args.out)
    try:
        done = store.open(docs)
    except (StoreError, OSError) as exc:
        return fail(str(exc))
    batch = Batch(docs, store, runner, options, progress=args.progress, notify=notify)
    rc = 0
    try:
        asyncio.run(_run(batch, runner, done))
    except KeyboardInterrupt:
        batch.stats.interrupted = True
        rc = 130
    except FatalError as exc:
        rc = fail(str(exc))
    except OSError as exc:  # the results file could not be written (disk full, ...)
        rc = fail(f"{args.out}: {exc}")
    finally:
        store.close()
    if rc == 2:
        return rc
    if args.report:
        write_atomic(args.report, markdown_report(docs, batch.lines, batch.stats, runner.label))
    failed = [batch.lines[d.key] for d in docs if d.key in batch.lines and batch.lines[d.key]["status"] == "failed"]
    print(closing_summary(batch.stats, runner.label, args.out, args.report, failed), flush=True)
    cancelled = getattr(runner, "cancelled", None)
    if cancelled:
        print(f"  cancelled {len(cancelled)} jobs in flight on the endpoint", flush=True)
    running = getattr(runner, "left_running", None)
    if running:
        print(f"  batches left on the endpoint: {', '.join(running)}; rerun the same command to collect their "
              "results", flush=True)
    return rc or _exit_status(docs, failed)


def _never(doc) -> bool:
    """A document that can never succeed as it is (a file that changed while read can, rerun)."""
    return doc.error is not None and not doc.error.get("retryable")


def _exit_status(docs, failed: list[dict]) -> int:
    """0 none failed; EXIT_UNREADABLE when every failure is a document that could not be read."""
    if not failed:
        return 0
    unreadable = {d.doc for d in docs if _never(d)}
    if all(line["doc"] in unreadable for line in failed):
        print(f"  {len(failed)} documents can never succeed as they are (exit status {EXIT_UNREADABLE}); "
              "--skip-unreadable leaves them out", flush=True)
        return EXIT_UNREADABLE
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
