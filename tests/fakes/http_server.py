"""The fakes' HTTP servers: a threading server on a free port of 127.0.0.1 whose GET, POST, PUT
and DELETE requests go to one dispatch(request, method) function, serving in a daemon thread."""
from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def serve(dispatch: Callable[[BaseHTTPRequestHandler, str], None], http11: bool = False) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if http11 else "HTTP/1.0"

        def log_message(self, *args):  # quiet
            pass

        def do_GET(self):
            dispatch(self, "GET")

        def do_POST(self):
            dispatch(self, "POST")

        def do_PUT(self):
            dispatch(self, "PUT")

        def do_DELETE(self):
            dispatch(self, "DELETE")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def close(server: ThreadingHTTPServer | None) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()
