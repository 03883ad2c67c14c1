"""A real HTTP receiver for webhooks: http.server on a free 127.0.0.1 port, in a thread.

It answers a scripted sequence of status codes (then 200), can hold a request open until the
test releases it, and can run a callback while a request is in progress."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


class Receiver:
    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.received: list[Received] = []
        self.arrived = threading.Event()  # a request has come in (set before answering)
        self.hold: threading.Event | None = None  # when set: wait for it before answering
        self.during_request: Callable[[], Any] | None = None
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.arrived.set()
                if receiver.during_request is not None:
                    receiver.during_request()
                if receiver.hold is not None:
                    receiver.hold.wait(timeout=30)
                with receiver._lock:
                    receiver.received.append(Received(
                        {k.lower(): v for k, v in self.headers.items()}, body, status))
                try:
                    self.send_response(status)
                    self.send_header("content-length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender is gone (killed mid-delivery)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def accepted(self) -> list[Received]:
        return [r for r in self.received if 200 <= r.answered < 300]

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.hold is not None:
            self.hold.set()
        self._server.shutdown()
        self._server.server_close()
