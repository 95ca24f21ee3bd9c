"""A tiny local HTTP dependency for failure tests: counts calls, answers what the test says."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class DependencyServer:
    """An HTTP server on 127.0.0.1 (free port) in a thread.

    `status` is what every call gets (503 by default); `retry_after_seconds` adds a
    Retry-After header; `calls` counts requests per status.
    """

    def __init__(self, status: int = 503, retry_after_seconds: float | None = None) -> None:
        self.status = status
        self.retry_after_seconds = retry_after_seconds
        self.calls: dict[int, int] = {}
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with owner._lock:
                    status = owner.status
                    owner.calls[status] = owner.calls.get(status, 0) + 1
                self.send_response(status)
                if owner.retry_after_seconds is not None and status >= 400:
                    self.send_header("Retry-After", f"{owner.retry_after_seconds:g}")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/"

    @property
    def total_calls(self) -> int:
        with self._lock:
            return sum(self.calls.values())

    def __enter__(self) -> DependencyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
