"""A deadline on a connection's request headers for the local endpoint (`--serve`): aiohttp
times out neither a request line nor headers that trickle in, so a client sending one byte a
second holds a connection (and its buffers) for as long as it likes. A connection whose
first request's headers (through their blank line) have not arrived SERVE_HEADER_TIMEOUT_S
after it opened is closed, with one WARNING line. Slow bodies are SERVE_BODY_TIMEOUT_S's
(handler.http.rest); an idle kept-alive connection is aiohttp's keepalive timeout's.

HeaderDeadline wraps the protocol aiohttp makes for each connection and passes every call
through; HeaderDeadlineSite is a TCP site (aiohttp's BaseSite) serving through it."""
from __future__ import annotations

import asyncio
import logging

from aiohttp import web

log = logging.getLogger("handler.http")

END_OF_HEADERS = b"\r\n\r\n"


class HeaderDeadline(asyncio.Protocol):
    """`inner` (aiohttp's protocol of one connection) with its transport closed when the
    first request's headers are not complete `timeout` seconds after the connection opened."""

    def __init__(self, inner: asyncio.Protocol, timeout: float):
        self.inner, self.timeout = inner, timeout
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes seen, for a blank line split across two reads

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.timer is not None:
            seen = self.tail + data
            if END_OF_HEADERS in seen:
                self._disarm()
            else:
                self.tail = seen[-(len(END_OF_HEADERS) - 1):]
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        self._disarm()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        self.timer = None
        peer = self.transport.get_extra_info("peername") if self.transport else None
        log.warning("closed a connection from %s: its request headers did not arrive within %gs "
                    "(SERVE_HEADER_TIMEOUT_S)", peer, self.timeout)
        if self.transport is not None:
            self.transport.close()


class HeaderDeadlineSite(web.BaseSite):
    """A TCP site of `runner` on host:port whose connections have a header deadline."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, header_timeout: float):
        super().__init__(runner)
        self.host, self.port, self.header_timeout = host, port, header_timeout

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        make_protocol = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            lambda: HeaderDeadline(make_protocol(), self.header_timeout), self.host, self.port,
            backlog=self._backlog, reuse_address=True)
