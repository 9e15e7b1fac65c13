"""`python -m handler --load-balancing` (or LOAD_BALANCING=true): the worker of a RunPod
load-balancing endpoint. It listens at once (the API on PORT, /ping on PORT_HEALTH) and loads
the model meanwhile, /ping answering 204 until it is ready; a model that cannot load stops the
worker as at a queue worker's start (exit status 1, or 2 for a setting the model refuses), /ping
answering 503 until then. SIGTERM or SIGINT: no new request (503), the running ones end within
DRAIN_TIMEOUT_S, then the worker exits 0; a dead engine makes it drain and exit 1 (RunPod
replaces it)."""
from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from handler.errors import JobError
from handler.http.lb_app import make_api_app, make_health_app
from handler.http.lb_endpoint import BalancedEndpoint

log = logging.getLogger("handler.http")

WATCH_S = 1.0  # how often the server looks whether the engine died
SHUTDOWN_S = 2.0  # after the drain: how long the responses still being written may take


class BalancedServer:
    """The endpoint's apps served on `host`: `start()`, then `run()` until stopped (exit status)."""

    def __init__(self, worker, host: str = "0.0.0.0", port: int | None = None, health_port: int | None = None):
        settings = worker.settings
        self.worker = worker
        self.endpoint = BalancedEndpoint(worker)
        self.host = host
        self.port = settings.port if port is None else port
        self.health_port = settings.port_health if health_port is None else health_port
        separate = self.health_port is not None and self.health_port != self.port
        access_log = log if settings.log_level == "debug" else None
        self.runners = [web.AppRunner(make_api_app(self.endpoint, with_ping=not separate), access_log=access_log,
                                      shutdown_timeout=SHUTDOWN_S)]
        if separate:
            self.runners.append(web.AppRunner(make_health_app(self.endpoint), access_log=None))
        self.stop_reason: asyncio.Future | None = None
        self.load: asyncio.Task | None = None

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of the API, then of /ping when it has its own port (port 0: the one bound)."""
        return [runner.addresses[0][:2] for runner in self.runners]

    async def start(self) -> None:
        """Listen, then start the model's load."""
        self.stop_reason = asyncio.get_running_loop().create_future()
        for runner, port in zip(self.runners, (self.port, self.health_port)):
            await runner.setup()
            await web.TCPSite(runner, self.host, port).start()
        api, *health = self.addresses
        log.info("load-balancing worker on %s:%d: POST /v1/chat/completions, /v1/completions, /v1/responses, "
                 "/runsync; GET /v1/models; GET /ping on port %d (204 while the model loads)", api[0], api[1],
                 (health or [api])[0][1])
        self.load = self.worker.loader.load_in_background()

    def stop(self, reason: str) -> None:
        """Begin the stop (a signal's handler)."""
        if self.stop_reason is not None and not self.stop_reason.done():
            self.stop_reason.set_result(reason)

    async def run(self) -> int:
        """Serve until a stop, a failed load or a dead engine; drain, close; the exit status."""
        code = await self._serve()
        await self.endpoint.drain(self.stop_reason.result() if self.stop_reason.done() else "stopping")
        await self.close()
        return code

    async def _serve(self) -> int:
        load_seen = False
        while True:
            if not load_seen and self.load.done():
                load_seen = True
                if self.load.exception() is not None:
                    from handler.engine_setup import load_failure_exit

                    error = self.load.exception()
                    return load_failure_exit(self.worker.settings, error) if isinstance(error, JobError) else 1
                self.worker.loader.start_summary()  # the metrics summary line, on this loop
            if self.worker.dead is not None:
                log.error("the engine is dead (%s): this worker stops; RunPod replaces it", self.worker.dead.message)
                self.stop("the engine is dead")
                return 1
            waits = [self.stop_reason] if load_seen else [self.stop_reason, self.load]
            await asyncio.wait(waits, timeout=WATCH_S, return_when=asyncio.FIRST_COMPLETED)
            if self.stop_reason.done():
                return 0

    async def close(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
        await self.endpoint.close()


def serve_load_balanced(worker, host: str = "0.0.0.0") -> int:
    """Run the load-balancing worker until stopped; returns the exit status."""
    settings = worker.settings
    if settings.metrics_port:
        worker.metrics.start_server(settings.metrics_port, settings.metrics_host)

    async def main() -> int:
        server = BalancedServer(worker, host)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stop, sig.name)
        await server.start()
        return await server.run()

    code = asyncio.run(main())
    worker.close()
    return code
