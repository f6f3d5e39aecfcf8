"""A real HTTP server on loopback standing in for an engine that hangs: it reads each POST and answers nothing
until the block ends; with `answer_get`, every GET is 200 `{}` (an engine that is up, as the router sees one)."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def silent_on_post(answer_get: bool):
    """A real HTTP server on loopback that reads each POST and answers nothing until the test ends; with
    `answer_get`, every GET gets 200 `{}` (an engine that is up: /health, the server info the router asks for)."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if not answer_get:
                return self.send_error(404)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            release.wait(120)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()
