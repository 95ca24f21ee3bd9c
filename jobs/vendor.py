"""The simulated payment vendor: a small HTTP service the example charge calls.

`jobs up` runs it on 127.0.0.1 (`JOBS_VENDOR_PORT`, unless `JOBS_VENDOR_URL` points at a
real one); `jobs vendor ok|fail|slow` and `jobs demo` switch how it answers, so the payment
breaker can be watched opening, deferring, probing and closing.

    POST /charges        a charge; the `Idempotency-Key` header (the order id) makes a
                         repeated request return the first charge, as real vendors do
    GET  /control        mode, delay, calls received, distinct charges
    PUT  /control        {"mode": "ok" | "fail" | "slow", "delay_seconds": 2.0}

Modes: `ok` answers 201 at once; `fail` answers 503 with `Retry-After: 1` (an outage);
`slow` answers 201 after `delay_seconds` (a degraded vendor: slow calls trip the breaker,
and a delay beyond the caller's timeout is a failure).

The state is this process's memory: one vendor process per platform, like the real one.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jobs.settings import is_loopback

#: How the vendor answers charges.
MODES = ("ok", "fail", "slow")
#: Default delay of `slow` mode: above the breaker's slow-call threshold, below the timeout.
SLOW_DELAY_SECONDS = 2.0
#: Longest delay `slow` accepts, so a typo cannot hang every charge's worker for minutes.
MAX_DELAY_SECONDS = 60.0
#: Loopback only: the vendor is a local stand-in, never a service for other machines.
HOST = "127.0.0.1"


class VendorError(Exception):
    """Raised when the vendor's control endpoint cannot be reached or refuses a change."""


@dataclass
class VendorState:
    """What the vendor answers and what it has seen (guarded by `lock`)."""

    mode: str = "ok"
    delay_seconds: float = SLOW_DELAY_SECONDS
    calls: int = 0
    #: Charges by idempotency key (order id): a repeated key gets the first charge back.
    charges: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def describe(self) -> dict[str, Any]:
        with self.lock:
            return {"mode": self.mode, "delay_seconds": self.delay_seconds,
                    "calls": self.calls, "charges": len(self.charges)}


class Refused(Exception):
    """Raised inside a handler to answer `status` with `{"error": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class VendorHandler(BaseHTTPRequestHandler):
    """Answers charges by the vendor's mode; changes the mode for loopback clients only."""

    server: VendorServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per charge would drown honcho's output

    #: (method, path) -> the handler's method answering it; anything else is a 404.
    ROUTES = {("GET", "/control"): "_status", ("PUT", "/control"): "_set_mode",
              ("POST", "/charges"): "_charge"}

    def _route(self) -> None:
        action = self.ROUTES.get((self.command, self.path.rstrip("/")))
        try:
            if action is None:
                raise Refused(404, f"no such path {self.path}")
            getattr(self, action)()
        except Refused as refused:
            self._reply(refused.status, {"error": str(refused)})

    do_GET = do_PUT = do_POST = _route

    def _status(self) -> None:
        self._reply(200, self.server.state.describe())

    def _set_mode(self) -> None:
        """Change the mode. A state-changing endpoint without CSRF protection is safe here
        only because the server binds 127.0.0.1 and this handler also refuses any client
        that is not loopback (a browser page elsewhere cannot reach it)."""
        if not is_loopback(self.client_address[0]):
            raise Refused(403, "the vendor's mode can only be changed from this machine")
        body = self._json_body()
        mode, delay = body.get("mode"), body.get("delay_seconds")
        if mode not in MODES:
            raise Refused(400, f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int | float)
                                  or not 0 <= delay <= MAX_DELAY_SECONDS):
            raise Refused(400, f"delay_seconds must be 0..{MAX_DELAY_SECONDS:g}")
        state = self.server.state
        with state.lock:
            state.mode = mode
            if delay is not None:
                state.delay_seconds = float(delay)
        self._reply(200, state.describe())

    def _charge(self) -> None:
        body = self._json_body()
        key = self.headers.get("Idempotency-Key") or ""
        amount = body.get("amount_cents")
        if not key or isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise Refused(422, "an Idempotency-Key header and a positive integer amount_cents "
                               "are required")
        state = self.server.state
        with state.lock:
            state.calls += 1
            mode, delay = state.mode, state.delay_seconds
        if mode == "fail":
            self._reply(503, {"error": "payment vendor unavailable (simulated outage)"},
                        headers={"Retry-After": "1"})
            return
        if mode == "slow":
            time.sleep(delay)
        with state.lock:
            charge = state.charges.get(key)
            replayed = charge is not None
            if charge is None:
                charge = {"charge_id": f"ch_{uuid.uuid4().hex[:16]}", "order_id": key,
                          "amount_cents": amount, "currency": body.get("currency")}
                state.charges[key] = charge
        self._reply(200 if replayed else 201, {**charge, "replayed": replayed})

    def _json_body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}") if length <= 65536 else None
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object (at most 64 KiB)")
        return body

    def _reply(self, status: int, body: dict[str, Any],
               headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class VendorServer(ThreadingHTTPServer):
    """The vendor's HTTP server with its state; one thread per request."""

    daemon_threads = True

    def __init__(self, port: int, host: str = HOST) -> None:
        self.state = VendorState()
        super().__init__((host, port), VendorHandler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A caller that gave up (its timeout passed during `slow`) closed the socket: that
        # is the simulation working, not an error worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def serve(port: int, host: str = HOST) -> None:
    """Run the vendor in the foreground until the process is stopped (`jobs vendor serve`).

    `host` beyond loopback (a container of its own) serves charges to other hosts; its mode
    still changes only from the vendor's own machine (the control endpoint refuses others).
    """
    with VendorServer(port, host) as server:
        server.serve_forever()


def start_in_thread(port: int) -> VendorServer:
    """Run the vendor in a daemon thread of this process; `shutdown()` stops it."""
    server = VendorServer(port)
    threading.Thread(target=server.serve_forever, name="vendor", daemon=True).start()
    return server


class VendorControl:
    """The operator's side: read and switch a vendor's mode over its control endpoint.

    Args:
        base_url: the vendor, e.g. `http://127.0.0.1:18090`.
        timeout_seconds: per request.
    """

    def __init__(self, base_url: str, timeout_seconds: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    def status(self) -> dict[str, Any]:
        """Mode, delay, calls and charges.

        Raises:
            VendorError: the vendor did not answer.
        """
        return self._request("GET")

    def set_mode(self, mode: str, *, delay_seconds: float | None = None) -> dict[str, Any]:
        """Switch to `mode` (`ok`, `fail`, `slow`); returns the new status.

        Raises:
            VendorError: an unknown mode, a refused change, or no answer.
        """
        if mode not in MODES:
            raise VendorError(f"unknown vendor mode {mode!r}; choose {', '.join(MODES)}")
        return self._request("PUT", {"mode": mode, "delay_seconds": delay_seconds})

    def _request(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base_url}/control", method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200]
            raise VendorError(f"the vendor refused: HTTP {exc.code} {detail}") from None
        except (OSError, ValueError) as exc:
            raise VendorError(f"no vendor answers at {self.base_url} ({exc}); `jobs up` runs "
                              "the simulated one") from None
