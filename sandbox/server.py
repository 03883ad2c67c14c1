"""HTTP plumbing: routing, body reading, delivering (or deliberately not delivering) replies."""

from __future__ import annotations

import contextlib
import socket
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from sandbox import control, generic, smtp, stripe_api
from sandbox.app import Sandbox
from sandbox.effects import create_effect
from sandbox.replies import Reply, error_reply, invalid, new_id, not_found

MAX_BODY_BYTES = 1 << 20
EFFECTS_PREFIX = "/v1/effects/"
KEY_PREFIX_CHARS = 8


class SandboxHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Load tests open many connections at once; the default backlog of 5 would refuse them.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        super().__init__(address, SandboxHandler)


class SandboxHandler(BaseHTTPRequestHandler):
    server: SandboxHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "AgentLedgerSandbox/1.0"
    # Idle keep-alive connections must not pin a thread forever.
    timeout = 60
    # Headers and body go out in two writes; with Nagle on, the client's delayed ACK would add
    # ~40 ms to every response.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # --- request cycle -------------------------------------------------------------------------

    def _handle(self, method: str) -> None:
        started = time.monotonic()
        request_id = new_id("req_")
        url = urlsplit(self.path)
        query = {name: values[0] for name, values in parse_qs(url.query).items()}
        try:
            reply = self._route(method, url.path, query, request_id)
        except Exception:
            # The traceback goes to the operator's log; the client learns nothing internal.
            traceback.print_exc(file=sys.stderr)
            reply = error_reply(500, "api_error", "internal sandbox error")
        status = self._deliver(reply, request_id)
        key = self.headers.get("Idempotency-Key") or query.get("idempotency_key") or ""
        self._log_line(method, url.path, status, key, time.monotonic() - started)

    def _route(self, method: str, path: str, query: dict[str, str], request_id: str) -> Reply:
        sandbox = self.server.sandbox
        if method == "POST":
            raw, problem = self._read_body()
            if path.startswith(EFFECTS_PREFIX):
                kind = path.removeprefix(EFFECTS_PREFIX)
                key = self.headers.get("Idempotency-Key")
                return create_effect(sandbox, kind, raw, key, request_id, problem)
            if path == stripe_api.REFUNDS:
                return stripe_api.create_refund(
                    sandbox,
                    raw,
                    authorization=self.headers.get("Authorization"),
                    key_header=self.headers.get("Idempotency-Key"),
                    request_id=request_id,
                    body_problem=problem,
                )
            if path.startswith(generic.PREFIX) and (target := generic.split(path)) is not None \
                    and target[1] is None:
                return generic.create(sandbox, target[0], raw, query,
                                      self.headers.get("Idempotency-Key"), request_id, problem,
                                      authorization=self.headers.get("Authorization"))
            if path in control.CONTROL_POST:
                return problem or self._control_post(path, raw)
        if method == "GET":
            if path == "/v1/effects":
                return control.list_effects(sandbox, query)
            if path.startswith(EFFECTS_PREFIX):
                return control.get_effect(sandbox, path.removeprefix(EFFECTS_PREFIX))
            authorization = self.headers.get("Authorization")
            if path == stripe_api.REFUNDS:
                return stripe_api.list_refunds(sandbox, query, authorization=authorization)
            if path.startswith(stripe_api.REFUND_PREFIX):
                refund_id = path.removeprefix(stripe_api.REFUND_PREFIX)
                return stripe_api.get_refund(sandbox, refund_id, authorization=authorization)
            if path.startswith(generic.PREFIX) and (target := generic.split(path)) is not None:
                collection, effect_id = target
                denied = generic.unauthorised(self.headers.get("Authorization"))
                if denied is not None:
                    return denied
                if effect_id is None:
                    return generic.lookup(sandbox, collection, query)
                return generic.get(sandbox, collection, effect_id)
            if path == smtp.MESSAGES:
                return smtp.list_messages(sandbox, query)
            if path in control.CONTROL_GET:
                return control.CONTROL_GET[path](sandbox, query)
        if path in control.CONTROL_GET or path in control.CONTROL_POST:
            return error_reply(405, "invalid_request_error", f"{method} not allowed on {path}")
        return not_found(f"no route for {method} {path}")

    def _control_post(self, path: str, raw: bytes) -> Reply:
        body = control.parse_object(raw)
        if body is None:
            return invalid("request body must be a JSON object")
        return control.CONTROL_POST[path](self.server.sandbox, body)

    def _read_body(self) -> tuple[bytes, Reply | None]:
        # Anything but a plain Content-Length body is refused and the connection closed,
        # because an unread body would corrupt the next request on a kept-alive connection.
        if self.headers.get("Transfer-Encoding"):
            return b"", _closing(error_reply(411, "invalid_request_error", "send Content-Length"))
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            return b"", _closing(invalid("bad Content-Length"))
        if length > MAX_BODY_BYTES:
            too_large = error_reply(413, "invalid_request_error", "request body too large")
            return b"", _closing(too_large)
        return self.rfile.read(length), None

    # --- delivery ------------------------------------------------------------------------------

    def _deliver(self, reply: Reply, request_id: str) -> str:
        if reply.delay_seconds:
            time.sleep(reply.delay_seconds)
        if reply.before_send is not None:
            reply.before_send()
        if reply.lose_connection:
            self._lose_connection()
            return "lost"
        try:
            self._write(reply, request_id)
        except OSError:
            # The caller already gave up (typically timed out): the outcome stands regardless.
            self.close_connection = True
            return f"{reply.status}-undelivered"
        return str(reply.status)

    def _write(self, reply: Reply, request_id: str) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Request-Id", request_id)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(reply.body)

    def _lose_connection(self) -> None:
        # Not a single byte of response: the client sees the peer hang up mid-request.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    # --- logging -------------------------------------------------------------------------------

    def _log_line(self, method: str, path: str, status: str, key: str, elapsed: float) -> None:
        # Never the body or query: params and references are the caller's business data.
        prefix = key[:KEY_PREFIX_CHARS] + ("…" if len(key) > KEY_PREFIX_CHARS else "")
        sys.stderr.write(
            f"sandbox {method} {path} {status} key={prefix or '-'} {elapsed * 1000:.0f}ms\n"
        )

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Replaced by _log_line, which knows about lost responses and key prefixes.
        pass

    def log_message(self, format: str, *args: object) -> None:
        sys.stderr.write(f"sandbox {format % args}\n")


def _closing(reply: Reply) -> Reply:
    return Reply(status=reply.status, body=reply.body, headers=reply.headers, close=True)


def make_server(host: str, port: int, sandbox: Sandbox) -> SandboxHTTPServer:
    sandbox.store.initialise()
    return SandboxHTTPServer((host, port), sandbox)
