"""Webhooks from the live ledger (`manage.py webhooks add`): a real delivery verifies with
verify_webhook()."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from agent_ledger_client import WebhookVerificationError, operation_id, verify_webhook
from conftest import refund_params

Delivery = tuple[bytes, dict[str, str]]


@pytest.fixture
def receiver() -> Iterator[tuple[str, queue.Queue[Delivery]]]:
    deliveries: queue.Queue[Delivery] = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's spelling)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            deliveries.put((body, dict(self.headers.items())))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks", deliveries
    server.shutdown()
    server.server_close()


def test_a_real_delivery_verifies_and_a_tampered_one_does_not(ledger, client, receiver, unique):
    url, deliveries = receiver
    output = ledger.manage("webhooks", "add", "sdk-main", url)
    secret = next(line for line in output.splitlines() if line.startswith("whsec_"))
    oid = operation_id(workflow=unique, subject="invoice-90", action="refund", sequence=1)
    client.submit("refund", refund_params("invoice-90"), operation_id=oid)
    while True:
        body, headers = deliveries.get(timeout=120)
        event = verify_webhook(body, headers, secret=secret)
        if event["data"]["operation_id"] == oid and event["type"] == "operation.succeeded":
            break
    with pytest.raises(WebhookVerificationError):
        verify_webhook(body.replace(b"succeeded", b"failed"), headers, secret=secret)
