"""Outcomes delivered instead of polled: webhook delivery and long-poll wake-up, measured.

    .venv/bin/python bench/outcomes.py [--operations 200] [--waits 20]

On a fresh SQLite database (embedded default) with a local HTTP receiver:
- webhook throughput: N client-executed operations are claimed and reported with the worker
  away, then the sweep delivers every pending event (signed POSTs) — deliveries per second;
- webhook latency: with tasks run on commit, the time from an outcome report's start to the
  receiver having the event;
- long-poll wake-up: a GET ?wait=30 is waiting; the time from the outcome's commit to the
  waiting request's answer (the re-check interval bounds it: LEDGER_LONG_POLL_INTERVAL_SECONDS).
These machines are shared and noisy: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LEDGER_VAR_DIR", tempfile.mkdtemp(prefix="ledger-bench-"))


class _Receiver:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.times[self.headers["webhook-id"]] = time.perf_counter()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--operations", type=int, default=200)
    parser.add_argument("--waits", type=int, default=20)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from rest_framework.test import APIClient

    from config.celery import app as celery_app
    from ledger import webhooks
    from ledger.auth import agent_create
    from ledger.models import WebhookEvent

    call_command("migrate", verbosity=0)
    celery_app.conf.broker_url = "memory://"
    receiver = _Receiver()
    agent, token = agent_create(name=f"bench-{time.time_ns()}", tools=["refund"])
    webhooks.endpoint_create(agent=agent, url=receiver.url)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def claim_and_report(i: int) -> None:
        operation_id = f"bench:{os.getpid()}:refund-{i}:v1"
        body = {"operation_id": operation_id, "tool": "refund", "execution": "client",
                "params": {"invoice": f"inv-{i}", "amount": 100 + i, "currency": "EUR",
                           "payee": "cus_bench"}}
        claimed = client.post("/api/v1/operations", body, format="json").json()
        client.post(f"/api/v1/operations/{operation_id}/outcome", {
            "fencing_token": claimed["claim"]["fencing_token"], "status": "succeeded",
            "result": {"id": f"eff_{i}"}, "provider_reference": f"eff_{i}"}, format="json")

    for i in range(args.operations):
        claim_and_report(i)
    celery_app.conf.task_always_eager = True
    started = time.perf_counter()
    while webhooks.sweep_due():
        pass
    throughput = args.operations / (time.perf_counter() - started)
    assert len(receiver.times) == args.operations

    latencies = []
    for i in range(args.operations, args.operations + 50):
        started = time.perf_counter()
        claim_and_report(i)
        event = WebhookEvent.objects.latest("id")
        latencies.append(receiver.times[event.event_id] - started)

    celery_app.conf.task_always_eager = False  # measure the long-poll, not a delivery
    wakeups = [_long_poll_wakeup(client, args.operations + 100 + i) for i in range(args.waits)]

    print(f"webhook deliveries by the sweep   {throughput:,.0f}/s ({args.operations} events)")
    print(f"webhook latency (report → receipt, incl. claim) median "
          f"{statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")
    print(f"long-poll wake-up after a change  median {statistics.median(wakeups) * 1000:.0f} ms, "
          f"max {max(wakeups) * 1000:.0f} ms ({args.waits} waits)")


def _long_poll_wakeup(client: Any, i: int) -> float:
    from django.db import connections
    from rest_framework.test import APIClient

    from ledger import transitions
    from ledger.models import Operation

    operation_id = f"bench:{os.getpid()}:refund-{i}:v1"
    claimed = client.post("/api/v1/operations", {
        "operation_id": operation_id, "tool": "refund", "execution": "client",
        "params": {"invoice": f"inv-{i}", "amount": 100, "currency": "EUR", "payee": "c"}},
        format="json").json()
    answered: list[float] = []
    credentials = client._credentials

    def wait() -> None:
        waiting = APIClient()
        waiting.credentials(**credentials)
        try:
            waiting.get(f"/api/v1/operations/{operation_id}", {"wait": "30"})
            answered.append(time.perf_counter())
        finally:
            connections.close_all()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.7)
    transitions.operation_succeed(
        operation=Operation.objects.get(operation_id=operation_id),
        fencing_token=claimed["claim"]["fencing_token"], result={}, provider_request_id="x",
        actor="bench", reason="provider_confirmed")
    changed = time.perf_counter()
    thread.join()
    return answered[0] - changed


if __name__ == "__main__":
    main()
