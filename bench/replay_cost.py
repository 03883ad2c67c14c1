"""Cost of a fresh action versus a replay, through the real API against the sandbox provider.

    .venv/bin/python bench/replay_cost.py [--operations 300]

Prints wall time per call and the replay/fresh ratio measured in one run (these machines are
shared and noisy, so only the ratio is meaningful), plus queries and commits per call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("LEDGER_VAR_DIR", tempfile.mkdtemp(prefix="ledger-bench-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--operations", type=int, default=300)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from rest_framework.test import APIClient

    from ledger.auth import agent_create
    from sandbox.testing import SandboxServer

    call_command("migrate", verbosity=0)
    _, token = agent_create(name=f"bench-{time.time_ns()}", tools=["refund"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def body(i: int) -> dict:
        return {"operation_id": f"bench:{os.getpid()}:refund-{i}:v1", "tool": "refund",
                "params": {"invoice": f"inv-{i}", "amount": 100 + i, "currency": "EUR",
                           "payee": "cus_bench"}}

    with SandboxServer() as sandbox:
        from django.conf import settings

        settings.SANDBOX_URL = sandbox.url
        fresh, replay = [], []
        with CaptureQueriesContext(connection) as q, mock.patch.object(
            connection, "commit", wraps=connection.commit
        ) as commits:
            for i in range(args.operations):
                started = time.perf_counter()
                assert client.post("/api/v1/operations", body(i), format="json").status_code == 201
                fresh.append(time.perf_counter() - started)
        fresh_queries, fresh_commits = len(q.captured_queries), commits.call_count
        with CaptureQueriesContext(connection) as q, mock.patch.object(
            connection, "commit", wraps=connection.commit
        ) as commits:
            for i in range(args.operations):
                started = time.perf_counter()
                assert client.post("/api/v1/operations", body(i), format="json").status_code == 200
                replay.append(time.perf_counter() - started)
        replay_queries, replay_commits = len(q.captured_queries), commits.call_count

    n = args.operations
    print(f"database: {connection.vendor}, operations: {n}")
    print(f"fresh : median {statistics.median(fresh) * 1000:7.2f} ms   "
          f"queries/call {fresh_queries / n:.2f}   commits/call {fresh_commits / n:.2f}")
    print(f"replay: median {statistics.median(replay) * 1000:7.2f} ms   "
          f"queries/call {replay_queries / n:.2f}   commits/call {replay_commits / n:.2f}")
    print(f"replay/fresh time ratio: {statistics.median(replay) / statistics.median(fresh):.3f}")


if __name__ == "__main__":
    main()
