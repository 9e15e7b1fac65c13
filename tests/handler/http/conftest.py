"""The local endpoint (handler.http) on the tiny model, served on a free port of 127.0.0.1 on
the handler tests' event loop, and an HTTP client that speaks to it for real."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import ClientSession, web

from tests.handler.conftest import settings_for

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")


class Http:
    """Requests to the served endpoint: (status, JSON body), or the raw text for SSE."""

    def __init__(self, session: ClientSession, base: str):
        self.session, self.base = session, base

    async def call(self, method: str, path: str, body=None) -> tuple[int, dict]:
        async with self.session.request(method, self.base + path, json=body) as resp:
            return resp.status, json.loads(await resp.text())

    async def post(self, path: str, body=None) -> tuple[int, dict]:
        return await self.call("POST", path, body)

    async def get(self, path: str) -> tuple[int, dict]:
        return await self.call("GET", path)

    async def text(self, method: str, path: str, body=None) -> tuple[int, str, str]:
        async with self.session.request(method, self.base + path, json=body) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), await resp.text()

    async def until(self, job_id: str, states=FINAL, timeout: float = 60, endpoint: str = "ep") -> dict:
        """Poll /status until the job is in one of `states`."""
        deadline = time.monotonic() + timeout
        while True:
            code, view = await self.get(f"/v2/{endpoint}/status/{job_id}")
            assert code == 200, view
            if view["status"] in states or time.monotonic() > deadline:
                return view
            await asyncio.sleep(0.05)


def serve_worker(settings, loop, load_timeout: float = 120):
    """The LocalEndpoint of a Worker with these settings on a free port of `loop`, its engine loaded
    by a warm-up job: (endpoint, base URL, close)."""
    from handler.http.endpoint import LocalEndpoint
    from handler.http.server import make_app
    from handler.worker import Worker

    endpoint = LocalEndpoint(Worker(settings))
    runner = web.AppRunner(make_app(endpoint))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    warm = endpoint.submit({"prompt": "hi", "sampling_params": {"max_tokens": 1}})  # the engine loads here
    loop.run_until_complete(endpoint.wait_final(warm, load_timeout))
    assert warm.status == "COMPLETED", warm.view()
    return endpoint, f"http://127.0.0.1:{runner.addresses[0][1]}", lambda: loop.run_until_complete(runner.cleanup())


@pytest.fixture(scope="module")
def served(tiny_llama_dir, loop):
    """(the LocalEndpoint, its base URL) on a free port; the worker's engine stops at teardown."""
    endpoint, base, close = serve_worker(settings_for(tiny_llama_dir, MAX_CONCURRENCY=4), loop)
    yield endpoint, base
    close()


@pytest.fixture
def http(served, loop):
    """`http(coro_fn)`: run `await coro_fn(Http)` on the loop that serves the endpoint."""
    _, base = served

    def run(fn, timeout: float = 120):
        async def main():
            async with ClientSession() as session:
                return await asyncio.wait_for(fn(Http(session, base)), timeout)
        return loop.run_until_complete(main())

    return run


@pytest.fixture
def slow_steps(served, monkeypatch):
    """Every engine step of the served worker takes 30 ms longer (a job that is still running
    when the test acts on it); the engine is loaded first."""
    endpoint, _ = served
    llm = endpoint.worker.engine.engine
    step = llm.step

    def slow():
        time.sleep(0.03)
        return step()

    monkeypatch.setattr(llm, "step", slow)
    return endpoint
