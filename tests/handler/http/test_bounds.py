"""The local endpoint's resource bounds, without a model: a cap on the jobs waiting in its
queue (SERVE_MAX_QUEUED_JOBS) and on the bytes of inputs and results it keeps
(SERVE_MAX_RETAINED_MB: a finished job's input is let go, the oldest finished jobs are forgotten
first), request bodies that arrive too slowly answered 408 (SERVE_BODY_TIMEOUT_S), connections
whose headers trickle in closed (SERVE_HEADER_TIMEOUT_S), and a malformed request logged as one
WARNING line, never an ERROR with a traceback."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time

import pytest
from aiohttp import ClientSession, web

from handler.settings import load_settings


class FakeWorker:
    """A worker whose jobs wait for `gate`, then answer `size` characters."""

    def __init__(self, **env):
        self.settings = load_settings(env)
        self.gate = asyncio.Event()
        self.dead = None

    async def handle(self, job):
        await self.gate.wait()
        yield {"text": "x" * int(job["input"].get("size", 1))}

    def concurrency_modifier(self, current: int) -> int:
        return 1

    async def aclose(self):
        pass


@contextlib.asynccontextmanager
async def serving(worker):
    """`worker`'s local endpoint served on 127.0.0.1 for the block's time: (endpoint, port)."""
    from handler.http.endpoint import LocalEndpoint
    from handler.http.server import make_app

    endpoint = LocalEndpoint(worker)
    runner = web.AppRunner(make_app(endpoint))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield endpoint, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def post(session, port, path, body) -> tuple[int, dict]:
    async with session.post(f"http://127.0.0.1:{port}/v2/ep{path}", json=body) as resp:
        return resp.status, json.loads(await resp.text())


def test_the_queue_has_a_cap_past_which_run_answers_429(loop):
    async def main():
        worker = FakeWorker(SERVE_MAX_QUEUED_JOBS="3")
        async with serving(worker) as (endpoint, port):
            async with ClientSession() as session:
                answers = [await post(session, port, "/run", {"input": {"n": i}}) for i in range(5)]
                codes = [code for code, _ in answers]
                assert codes == [200, 200, 200, 200, 429], answers  # one running, three waiting
                assert "SERVE_MAX_QUEUED_JOBS" in answers[-1][1]["error"]
                worker.gate.set()
                for _, body in answers[:4]:
                    assert await endpoint.wait_final(endpoint.get(body["id"]), 10)
                assert (await post(session, port, "/run", {"input": {}}))[0] == 200  # room again

    loop.run_until_complete(main())


def test_retained_bytes_have_a_cap_the_oldest_finished_jobs_go_first(loop):
    async def main():
        worker = FakeWorker(SERVE_MAX_RETAINED_MB="1")
        worker.gate.set()
        async with serving(worker) as (endpoint, port):
            async with ClientSession() as session:
                ids = []
                for i in range(6):  # each result about 300 kB: 1 MB holds three
                    code, body = await post(session, port, "/run", {"input": {"size": 300_000, "pad": "p" * 1000}})
                    assert code == 200, body
                    ids.append(body["id"])
                    assert await endpoint.wait_final(endpoint.get(body["id"]), 10)
                    assert endpoint.get(body["id"]).input is None  # a finished job's input is let go
                assert endpoint.store.retained_bytes <= 1024 * 1024
                kept = [jid for jid in ids if endpoint.get(jid) is not None]
                assert kept == ids[-len(kept):] and 2 <= len(kept) < 6, kept  # the newest kept
                async with session.get(f"http://127.0.0.1:{port}/v2/ep/status/{ids[0]}") as resp:
                    assert resp.status == 404
                # inputs waiting hold their bytes too: past the cap a new job is refused
                worker.gate.clear()
                big = {"input": {"pad": "p" * 400_000}}
                assert (await post(session, port, "/run", big))[0] == 200  # it runs (its input held)
                assert (await post(session, port, "/run", big))[0] == 200  # waits
                code, body = await post(session, port, "/run", big)
                assert code == 429 and "SERVE_MAX_RETAINED_MB" in body["error"], body
                worker.gate.set()

    loop.run_until_complete(main())


def test_a_body_that_arrives_too_slowly_is_answered_408(loop):
    async def main():
        worker = FakeWorker(SERVE_BODY_TIMEOUT_S="0.5")
        async with serving(worker) as (endpoint, port):
            def slow_sender() -> tuple[bytes, float]:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                t0 = time.monotonic()
                s.sendall(b"POST /v2/ep/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 1000\r\n\r\n{\"input\": ")
                reply = s.recv(400)
                s.close()
                return reply, time.monotonic() - t0

            reply, took = await asyncio.get_running_loop().run_in_executor(None, slow_sender)
            assert reply.startswith(b"HTTP/1.1 408") and b"SERVE_BODY_TIMEOUT_S" in reply, reply
            assert took < 3, took
            assert not endpoint.store.jobs

    loop.run_until_complete(main())


def test_headers_that_trickle_in_get_the_connection_closed(loop, caplog):
    """A client sending its request line and headers a few bytes at a time is cut off at
    SERVE_HEADER_TIMEOUT_S, with a WARNING; headers split across reads, and a complete request
    on the same kind of connection, are served."""
    from handler.http.endpoint import LocalEndpoint
    from handler.http.header_deadline import HeaderDeadlineSite
    from handler.http.server import make_app

    async def main():
        worker = FakeWorker()
        worker.gate.set()
        runner = web.AppRunner(make_app(LocalEndpoint(worker)))
        await runner.setup()
        await HeaderDeadlineSite(runner, "127.0.0.1", 0, header_timeout=0.6).start()
        port = runner.addresses[0][1]

        def trickle(pieces: list[bytes], pause: float) -> tuple[bytes, float]:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            t0 = time.monotonic()
            reply = b""
            try:
                for piece in pieces:
                    s.sendall(piece)
                    time.sleep(pause)
                reply = s.recv(400)
            except OSError:  # reset by the server while sending
                pass
            finally:
                s.close()
            return reply, time.monotonic() - t0

        run = asyncio.get_running_loop().run_in_executor
        try:
            slow = b"GET /v2/ep/health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 40
            reply, took = await run(None, trickle, [slow[i:i + 2] for i in range(0, len(slow), 2)], 0.1)
            assert reply == b"" and took < 3, (reply, took)  # closed without an answer
            assert any("SERVE_HEADER_TIMEOUT_S" in r.getMessage() and r.levelno == logging.WARNING
                       for r in caplog.records)
            # the blank line split over two sends, well within the deadline: answered
            whole = b"GET /v2/ep/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            reply, _ = await run(None, trickle, [whole[:-3], whole[-3:]], 0.2)
            assert reply.startswith(b"HTTP/1.1 200"), reply
            # headers in time, then a body that takes longer than the header deadline (not the
            # body's): the connection is not cut, the job is taken
            body = b'{"input": {"size": 3}}'
            head = (b"POST /v2/ep/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
            reply, took = await run(None, trickle, [head, body], 1.0)
            assert reply.startswith(b"HTTP/1.1 200") and took >= 1.0, reply
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.WARNING, logger="handler.http"):
        loop.run_until_complete(main())


def test_a_malformed_request_is_one_warning_line(loop, caplog):
    async def main():
        async with serving(FakeWorker()) as (endpoint, port):
            def send(raw: bytes) -> bytes:
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                s.sendall(raw)
                reply = s.recv(200)
                s.close()
                return reply

            for raw in (b"POST /v2/ep/run HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                        b"GET /v2/ep/health HTTP/1.1\r\nHost: x\r\nX-Bad\x01: y\r\n\r\n"):
                reply = await asyncio.get_running_loop().run_in_executor(None, send, raw)
                assert reply.startswith(b"HTTP/1.") and b" 400 " in reply[:20], reply

    caplog.set_level(logging.DEBUG)
    loop.run_until_complete(main())
    bad = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert bad and all(r.levelno == logging.WARNING and r.exc_info is None for r in bad), [
        (r.levelname, r.getMessage()) for r in bad]
    assert all("\n" not in r.getMessage() and "malformed request" in r.getMessage() for r in bad)


@pytest.mark.parametrize("name,value", [("SERVE_MAX_QUEUED_JOBS", 10_000), ("SERVE_MAX_RETAINED_MB", 1024),
                                        ("SERVE_BODY_TIMEOUT_S", 30.0)])
def test_the_bounds_default_to_generous_values(name, value):
    assert getattr(load_settings({}), name.lower()) == value
