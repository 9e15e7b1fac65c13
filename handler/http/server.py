"""The local endpoint's HTTP server (aiohttp, which the runpod SDK brings): the app with the
/v2 and OpenAI routes, and `serve`, what `python -m handler --serve` runs until SIGINT
or SIGTERM (then the running jobs are cancelled and the engine stops)."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from handler.http.endpoint import LocalEndpoint
from handler.http.header_deadline import HeaderDeadlineSite
from handler.http.jobs import JobStore, StoreFull
from handler.http.openai_routes import openai_routes
from handler.http.rest import MAX_RUNSYNC_BODY, error, rest_routes
from handler.logs import clean

log = logging.getLogger("handler.http")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SHUTDOWN_S = 2.0  # on SIGINT/SIGTERM: how long requests still open (a /runsync waiting) may take to end


@web.middleware
async def json_errors(request: web.Request, handler):
    """Unknown routes and methods answer RunPod-style JSON `{"error"}` bodies, not HTML; a job
    the endpoint's bounds leave no room for answers 429."""
    try:
        return await handler(request)
    except StoreFull as exc:
        return error(429, str(exc))
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        return error(exc.status, f"{exc.reason}: {request.method} {request.path}")


class MalformedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse as an ERROR with a traceback: one WARNING line
    instead (what the client sent is escaped and cut short: handler.logs.clean)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "malformed request: %s", (clean(f"{exc.code} {exc.message}"),)
            record.levelno, record.levelname, record.exc_info, record.exc_text = logging.WARNING, "WARNING", None, None
        return True


def quiet_malformed_requests() -> None:
    """Install MalformedRequests on aiohttp's server logger (once)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequests) for f in server_log.filters):
        server_log.addFilter(MalformedRequests())


def make_app(endpoint: LocalEndpoint) -> web.Application:
    """The aiohttp app of `endpoint`; its job queue starts with the app and the worker stops with it."""
    quiet_malformed_requests()
    app = web.Application(client_max_size=MAX_RUNSYNC_BODY + 1024 * 1024, middlewares=[json_errors])
    app.add_routes(rest_routes(endpoint) + openai_routes(endpoint))

    async def startup(_app):
        await endpoint.start()

    async def cleanup(_app):
        await endpoint.close()

    app.on_startup.append(startup)
    app.on_cleanup.append(cleanup)
    return app


def serve(worker, store: JobStore, host: str, port: int) -> int:
    """Serve `worker` (its progress updates going to `store`) on http://host:port/v2/<any endpoint
    id>/... until stopped; returns the exit code."""
    settings = worker.settings
    if settings.metrics_port:
        worker.metrics.start_server(settings.metrics_port, settings.metrics_host)
    app = make_app(LocalEndpoint(worker, store))
    base = f"http://{host}:{port}/v2/local"
    log.info("local endpoint on %s (any endpoint id): POST /run, /runsync; GET /status/<id>, /stream/<id>; "
             "POST /cancel/<id>; GET /health; OpenAI: %s/openai/v1/chat/completions, /completions, /models",
             base, base)
    if host not in LOOPBACK:
        log.warning("listening on %s: anyone who can reach this address can run jobs (no API key is checked)", host)
    access_log = log if settings.log_level == "debug" else None
    try:
        asyncio.run(_serve_until_signal(app, host, port, access_log, settings.serve_header_timeout_s))
    except (web.GracefulExit, KeyboardInterrupt):
        pass  # SIGTERM or SIGINT: the app was cleaned up (its jobs cancelled) on the way out
    worker.close()
    return 0


async def _serve_until_signal(app: web.Application, host: str, port: int, access_log, header_timeout: float) -> None:
    """Serve `app` on host:port, each connection under a header deadline (HeaderDeadlineSite),
    until SIGINT or SIGTERM (aiohttp's handlers raise GracefulExit), then clean the app up."""
    runner = web.AppRunner(app, handle_signals=True, access_log=access_log, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    try:
        await HeaderDeadlineSite(runner, host, port, header_timeout).start()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
